"""The chaos run's invariants and its Markdown report (``docs/benchmarks/chaos.md``).

Invariants, across all faults: 0 ledger differences; no limit admitted beyond its bound; no worker left
unroutable; every failed request failed cleanly (``bench.chaos.measure``); and the load recovered after each
fault."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from bench.chaos.faults import NOTICE_S
from bench.chaos.measure import intended
from bench.chaos.restarts import RELAXED_TPOT_S, RESTART_S, TIGHT_TPOT_S, WORKLOAD
from bench.chaos.run import ChaosResult, FaultResult
from bench.markdown import fmt, table
from bench.soak.report import Check


def checks(result: ChaosResult) -> list[Check]:
    rs = result.results
    diffs = {r.fault.name: r.ledger.differences for r in rs if r.ledger.differences}
    over = [f"{r.fault.name} {a.limit}" for r in rs for a in r.admissions if not a.within_bound]
    stuck = [f"{r.fault.name}: {u}" for r in rs for u in r.unroutable]
    unclean = {r.fault.name: r.failures.unclean for r in rs if r.failures.unclean}
    unrecovered = [r.fault.name for r in rs if r.recover_s is None]
    return [
        Check("faults run", bool(rs), f"{len(rs)} faults"),
        Check("0 ledger differences", not diffs, str(diffs or "none")),
        Check("no over-admission beyond the bound", not over, ", ".join(over) or "none"),
        Check("no worker left unroutable", not stuck, "; ".join(stuck) or "none"),
        Check("every failure clean", not unclean, str(unclean or "none")),
        Check("the load recovered after every fault", not unrecovered, ", ".join(unrecovered) or "all"),
    ]


def _worst(r: FaultResult) -> str:
    a = max(r.admissions, key=lambda a: a.over - a.bound)
    return f"{a.limit} +{fmt(a.over)} (bound {fmt(a.bound)})" if a.over else "none"


def _summary_row(r: FaultResult) -> list[object]:
    f, led = r.failures, r.ledger
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(f.kinds.items())) or "—"
    return [
        r.fault.name,
        f.requests,
        f.ok,
        f.intended,
        f"{f.failed} ({kinds})",
        f.unclean,
        f.broken_by_kill,
        f"{led.missing} / {led.duplicate} / {led.wrong_amount} / {led.unknown + led.no_request_id}",
        _worst(r),
        "not recovered" if r.recover_s is None else f"{r.recover_s:.1f}",
        "; ".join(r.unroutable) or "none",
    ]


def _admission_rows(r: FaultResult) -> list[list[object]]:
    return [
        [
            r.fault.name, a.limit, fmt(a.configured), fmt(a.admitted), fmt(a.over), f"≤ {fmt(a.bound)}",
            "yes" if a.reached else "no", "met" if a.within_bound else "**not met**", a.detail,
        ]
        for a in r.admissions
    ]  # fmt: skip


def _ledger_rows(result: ChaosResult) -> list[list[object]]:
    return [
        [r.fault.name, r.ledger.answered, r.ledger.records, r.ledger.unanswered_billed,
         "; ".join(r.ledger.examples) or "—"]
        for r in result.results
    ]  # fmt: skip


def render(result: ChaosResult, *, command: str) -> str:
    cfg = result.config
    lb, la = result.load_before, result.load_after
    summary_head = [
        "fault", "requests", "ok", "intended", "failed (kinds)", "unclean", "broken by kill",
        "ledger missing / duplicate / wrong / unknown", "over-admission (worst)", "recover s", "left unroutable",
    ]  # fmt: skip
    limit_head = ["fault", "limit", "configured", "admitted", "over", "bound", "reached", "status", "detail"]
    lines = [
        "# Chaos: the fault matrix under load",
        "",
        f"Regenerate with `{command}` (about {result.elapsed_s / 60:.1f} min here). Machine: {result.cpus} cores "
        f"shared with other work; load average {lb[0]:.1f} / {lb[1]:.1f} / {lb[2]:.1f} (1 / 5 / 15 min) at the "
        f"start, {la[0]:.1f} / {la[1]:.1f} / {la[2]:.1f} at the end.",
        "",
        "Real processes on loopback: a 3 + 3 Redis Cluster, four simulated workers (`gearshift sim serve`, "
        f"speed-up {cfg.speedup:g}; `w3` behind a fault-injecting proxy), two `gearshift gateway` replicas (each "
        "with its spool) and two `gearshift controller` processes. For each fault, "
        f"{sum(g.clients for g in cfg.groups)} looping streaming clients run {cfg.before_s:g} s before it, while "
        f"it lasts and {cfg.after_s:g} s after it is healed. Each fault has tenants of its own: one without limits, "
        f"and one per limit (RPM {cfg.sizes.rpm}, TPM {cfg.sizes.tpm}, concurrency {cfg.sizes.max_concurrency}, "
        f"and a budget sized from the warm-up's cost per request, {result.request_cost_usd:.2e} USD, to run out "
        "during the fault).",
        "",
        *_restarts_paragraph(result),
        "## Invariants",
        "",
        table(
            ["check", "status", "detail"],
            [[c.name, "met" if c.met else "**not met**", c.detail] for c in checks(result)],
        ),
        "",
        "## Faults",
        "",
        table(
            ["fault", "what", "held s", "notes"],
            [[r.fault.name, r.fault.what, cfg.during_s(r.fault), "; ".join(r.notes) or "—"] for r in result.results],
        ),
        "",
        "## Per fault",
        "",
        "Failed: requests that did not end normally, the intended ones aside (a limited tenant's 429, a stream the "
        "client dropped on purpose). Clean: a non-200 with an OpenAI error body, or a stream that ended with an "
        "error event and `[DONE]`. Broken by kill: requests to the SIGKILLed replica that were in flight at the "
        f"kill or sent in the {NOTICE_S:g} s before the clients stopped picking it (a dead process answers "
        "nothing; the spool and the ledger still have to be right). Ledger: each answered request must be billed "
        "once with the tokens its usage block gave (`bench.soak.ledger`, the soak's exact check); unknown: a record "
        "of a request no client saw answered or failed, or an answer without a request id. Recover: seconds from "
        "the fault's end to the first request after which every request "
        "succeeded. Left unroutable: a worker some gateway would still not route to "
        f"{cfg.routable_wait_s:g} s after the load stopped.",
        "",
        table(summary_head, [_summary_row(r) for r in result.results]),
        "",
        f"![Requests answered and failed per second, per fault (the fault's span shaded)]({PLOT})",
        "",
        "## Limits",
        "",
        "Admitted: RPM and TPM, the most billed in any 60 s by admission time (each fault's tenants live less than "
        "60 s of load, so this is the fault's whole window); concurrency, the most requests whose "
        "[admitted, finish] overlap in the ledger; budget, the spend counter (USD). Bounds "
        "([outages](../operations/outages.md)): RPM 1 % (the window's 100 buckets); TPM, the clients in flight "
        "× the real prompt's excess over the gateway's estimate; concurrency 0; budget, the requests in flight "
        "when it ran out, each at most the largest request's cost, plus the most the other replica billed in "
        "any one budget lease's life (`GEARSHIFT_LEASE_TTL_S`: a replica serving from its lease sees the spend "
        "it last read plus its own, not what the others billed since). Where the store was lost (a master killed, "
        "the store paused) the outage bound adds one limit `L` for RPM, TPM and concurrency (the replicas' "
        "shares `N × s × L` on top of what the store had counted) and doubles the in-flight budget term (both "
        "replicas' requests in flight plus one refresh of spend). Reached: the tenant was refused at least once.",
        "",
        table(limit_head, [row for r in result.results for row in _admission_rows(r)]),
        "",
        "## Ledger",
        "",
        table(
            ["fault", "answered", "records", "billed but not answered", "examples of differences"],
            [
                [
                    r.fault.name,
                    r.ledger.answered,
                    r.ledger.records,
                    r.ledger.unanswered_billed,
                    "; ".join(r.ledger.examples) or "—",
                ]
                for r in result.results
            ],
        ),
        "",
        "## Defects this matrix found",
        "",
        "Each has a test in `tests/bench/test_bench_chaos_defects.py` that failed before its fix (marked "
        "`xfail(strict=True)` while the defect stood); both are fixed:",
        "",
        "- **store-down**: an admit call to a store that hangs (connections open, nothing answers) had no deadline: "
        "a limited tenant's requests waited out the outage instead of failing open (or closed with 503); the "
        "clients gave up after their 30 s timeout (`client_timeout`). Fixed: an admit call waits at most "
        "`GEARSHIFT_STORE_TIMEOUT_S`, then the failure mode applies.",
        "- **gateway-kill**: an answered request could be missing from the ledger when its gateway was SIGKILLed "
        "after the client had `[DONE]` but before the background writer stored or spooled the record (intermittent "
        "in the matrix; deterministic with the store slow). Fixed: the record is in the spool directory's journal "
        "before the answer's end is sent, and the restarted gateway writes what the killed one left "
        "(`gateway.usage.spool.Journal`).",
        "",
        "## Not injected here",
        "",
        table(["fault", "why"], [list(row) for row in result.not_injected]) if result.not_injected else "None.",
        "",
    ]
    return "\n".join(lines)


def _restarts_paragraph(result: ChaosResult) -> list[str]:
    """What the restart faults' own stack is, when they ran (``bench.chaos.restarts``)."""
    ran = [r.fault.name for r in result.results if r.fault.stack == "restarts"]
    if not ran:
        return []
    return [
        f"The restart faults ({', '.join(ran)}) run on a stack of their own (after the main one when both run): the "
        "same processes, with the drafter-free gear on in the controllers (moves by the fleet plan only; a failed "
        "restart's worker kept from moving for a 20 s minimum dwell), four workers at speed-up 1 on the K3 profile "
        f"changed for it (a {RESTART_S:g} s restart, a costly drafter, a `{WORKLOAD}` workload that accepts ~2 % "
        "of its drafts) as two models of two workers (one of each kept as started by the operator), and every "
        f"tenant on a {RELAXED_TPOT_S * 1000:g} ms TPOT target that every gear meets. A fault moves its tenants to a "
        f"{TIGHT_TPOT_S * 1000:g} ms target that only drafter-free k = 0 meets, so the plan restarts its model's "
        "other worker drafter-free, and the armed fault makes that restart fail: `w1` comes back with its drafter "
        "(`GEARSHIFT_SIM_RESTART_FALLS_BACK`, as the vLLM supervisor falls back), `w3`'s supervisor stops "
        "listening once it has accepted the restart. It is healed once the worker serves again (and the "
        "supervisor listens again), by moving the tenants back.",
        "",
    ]


PLOT = "chaos.png"


def plot(result: ChaosResult, path: Path) -> None:
    """One panel per fault: requests finished per second, answered and failed (unintended), with the fault's
    injection and heal marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(result.results)
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.6 * rows), squeeze=False, constrained_layout=True)
    for ax, r in zip(axes.flat, result.results, strict=False):
        ok: dict[int, int] = {}
        bad: dict[int, int] = {}
        for s in r.sent:
            second = int(s.result.ended - r.started_at)
            if s.result.ok:
                ok[second] = ok.get(second, 0) + 1
            elif not intended(s):
                bad[second] = bad.get(second, 0) + 1
        span = range(int(r.elapsed_s) + 1)
        ax.plot(list(span), [ok.get(t, 0) for t in span], label="answered", color="tab:green")
        ax.plot(list(span), [bad.get(t, 0) for t in span], label="failed", color="tab:red")
        ax.axvspan(r.injected_s, r.healed_s, color="tab:orange", alpha=0.2, label="fault")
        ax.set_title(r.fault.name, fontsize=9)
        ax.set_xlabel("s", fontsize=8)
        ax.set_ylabel("requests / s", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.savefig(path, dpi=90)
    plt.close(fig)


DEFAULT_OUT = Path("docs/benchmarks")
"""Where ``gearshift bench chaos`` writes chaos.md unless told (``--out``)."""


def command_line(
    *, fast: bool = False, faults: Sequence[str] = (), before: float | None = None, after: float | None = None,
    speedup: float = 1.0, out: Path = DEFAULT_OUT,
) -> str:  # fmt: skip
    """The ``gearshift bench chaos`` command that regenerates a report, built from the bench's own options (not the
    process's argv: under a test runner or another CLI that is someone else's command). The run directory is left
    out: it holds only that run's logs."""
    words = ["gearshift", "bench", "chaos"]
    if fast:
        words.append("--fast")
    for name in faults:
        words += ["--fault", name]
    for option, value in (("--before", before), ("--after", after)):
        if value is not None:
            words += [option, f"{value:g}"]
    if speedup != 1.0:
        words += ["--speedup", f"{speedup:g}"]
    if out != DEFAULT_OUT:
        words += ["--out", str(out)]
    return " ".join(shlex.quote(w) for w in words)


def write(result: ChaosResult, out: Path, *, command: str) -> Path:
    """``out/chaos.md`` and its plot ``out/chaos.png``; returns the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    if result.results:
        plot(result, out / PLOT)
    path = out / "chaos.md"
    path.write_text(render(result, command=command))
    return path
