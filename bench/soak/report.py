"""The soak run's invariants and its Markdown report (``docs/benchmarks/soak.md``).

Invariants: every error is an intended 429 (a tenant whose limits are meant to trip); each gateway's RSS grows
less than 10 % after warm-up; client connections (and asyncio tasks, when the gateway exports them) at the end
equal those at the start; the usage ledger's totals equal what the clients counted, per tenant.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.markdown import table
from bench.soak.ledger import LedgerDiff, ledger_diff
from bench.soak.run import CLIENT_KEEPALIVE_S, Finished, SoakResult
from fleet.stats import percentile

RSS_GROWTH_LIMIT = 0.10


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    met: bool
    detail: str


def errors_by_type(result: SoakResult) -> tuple[Counter[str], Counter[str]]:
    """(intended, unintended) error counts by type. Intended: a 429 of a tenant whose limits are meant to trip."""
    intended: Counter[str] = Counter()
    unintended: Counter[str] = Counter()
    for f in result.finished:
        if f.result.ok:
            continue
        kind = f.result.error_type
        if f.result.transport_error is not None:  # which failure: the exception's class (its repr's head)
            kind = f"transport:{f.result.transport_error.split('(', 1)[0]}"
        if f.result.status == 429 and f.tenant in result.limited_tenants:
            intended[kind] += 1
        else:
            unintended[f"{kind} ({f.tenant})"] += 1
    return intended, unintended


def transport_rows(result: SoakResult) -> list[list[str]]:
    """The transport errors (the client got no answer, or only part of one) grouped by exception class, phase
    (``StreamResult.phase``) and whether the connection was pooled: how many, how long each request ran before it
    failed (seconds), when (seconds into the run) and on which gateway replicas."""
    groups: dict[tuple[str, str, str], list[Finished]] = {}
    for f in result.finished:
        r = f.result
        if r.transport_error is None:
            continue
        pooled = {True: "pooled", False: "new", None: "?"}[r.reused]
        groups.setdefault((r.transport_error.split("(", 1)[0], r.phase or "?", pooled), []).append(f)
    rows = []
    for (exc, phase, pooled), fs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        ran = [f.result.ended - f.result.started for f in fs]
        replicas = Counter(f.gateway for f in fs)
        rows.append([exc, phase, pooled, str(len(fs)), f"{min(ran):.2f}–{max(ran):.2f}",
                     f"{min(f.at_s for f in fs):.0f}–{max(f.at_s for f in fs):.0f}",
                     ", ".join(f"gateway-{g}: {n}" for g, n in sorted(replicas.items())),
                     fs[0].result.transport_error or ""])  # fmt: skip
    return rows


def rss_growth(result: SoakResult) -> list[float | None]:
    """Per gateway: growth of RSS from the first sample after warm-up to the last sample (fraction)."""
    samples = [s for s in result.samples if s.at_s >= result.config.warmup_s]
    if len(samples) < 2:
        samples = result.samples[len(result.samples) // 5 :]
    if len(samples) < 2:
        return [None for _ in range(result.config.replicas)]
    first, last = samples[0], samples[-1]
    return [(b - a) / a if a > 0 else None for a, b in zip(first.rss_mib, last.rss_mib, strict=True)]


def client_totals(result: SoakResult) -> dict[str, dict[str, float]]:
    """Per tenant, what the clients counted: requests that reached a worker (HTTP 200) and their usage."""
    out: dict[str, dict[str, float]] = {t.id: {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0}
                                        for t in result.config.tenants}  # fmt: skip
    for f in result.finished:
        if f.result.status != 200:
            continue
        row = out[f.tenant]
        row["requests"] += 1
        row["prompt_tokens"] += f.result.prompt_tokens
        row["completion_tokens"] += f.result.completion_tokens
    return out


def checks(result: SoakResult) -> list[Check]:
    intended, unintended = errors_by_type(result)
    out = [Check("every process of the stack ran to the end", not result.died, "; ".join(result.died) or "yes")]
    out += [Check("only intended 429s", not unintended, ", ".join(f"{k}: {v}" for k, v in unintended.items()) or
                 f"{sum(intended.values())} intended 429s")]  # fmt: skip
    growth = rss_growth(result)
    known = [g for g in growth if g is not None]
    out.append(Check(f"RSS growth after warm-up < {RSS_GROWTH_LIMIT:.0%}",
                     bool(known) and all(g < RSS_GROWTH_LIMIT for g in known),
                     ", ".join("n/a" if g is None else f"{g:+.1%}" for g in growth)))  # fmt: skip
    before, after = result.before, result.after
    if before is not None and after is not None:
        out.append(Check("client connections at the end = at the start", before.connections == after.connections,
                         f"start {before.connections}, end {after.connections}"))  # fmt: skip
        if all(t is not None for t in before.tasks + after.tasks):
            out.append(Check("asyncio tasks at the end = at the start", before.tasks == after.tasks,
                             f"start {before.tasks}, end {after.tasks}"))  # fmt: skip
        else:
            out.append(Check("asyncio tasks at the end = at the start", False,
                             "not exported by the gateway (reliability defect D5)"))  # fmt: skip
    clients = client_totals(result)
    diffs = [
        f"{t}.{k}: ledger {got:.0f} vs clients {v:.0f}"
        for t, row in clients.items()
        for k, v in row.items()
        if (got := result.ledger.get(t, {}).get(k, 0)) != v
    ]
    out.append(Check("usage ledger = client counts (per tenant)", not diffs, "; ".join(diffs) or "exact"))
    exact = request_ledger(result)
    out.append(Check("usage ledger = client requests (one record each, same tokens, by request id)",
                     exact.differences == 0 and exact.answered > 0, _diff_detail(exact)))  # fmt: skip
    return out


def request_ledger(result: SoakResult) -> LedgerDiff:
    """The request-by-request comparison of the run's ledger with what its clients saw."""
    return ledger_diff((f.result for f in result.finished), result.records)


def _diff_detail(d: LedgerDiff) -> str:
    head = f"{d.answered} answered, {d.records} records"
    counts = (f"missing {d.missing}, duplicate {d.duplicate}, wrong amount {d.wrong_amount}, unknown {d.unknown}, "
              f"without request id {d.no_request_id}")  # fmt: skip
    billed = f"; {d.unanswered_billed} records of requests the client saw fail" if d.unanswered_billed else ""
    examples = f" (e.g. {', '.join(d.examples)})" if d.examples else ""
    return f"{head}: {counts}{billed}{examples}"


def _load(avg: tuple[float, ...]) -> str:
    return " / ".join(f"{x:.1f}" for x in avg) or "unknown"


def _ms(x: float) -> str:
    """Seconds as whole milliseconds; a dash for NaN (no requests)."""
    return "–" if math.isnan(x) else f"{x * 1000:.0f}"


def latency_rows(finished: Sequence[Finished], *, window_s: float, elapsed_s: float) -> list[list[str]]:
    """TTFT and TPOT percentiles (ms) per time window of finished successful requests."""
    rows = []
    n = max(1, math.ceil(elapsed_s / window_s))
    for i in range(n):
        lo, hi = i * window_s, (i + 1) * window_s
        done = [f.result for f in finished if lo <= f.at_s < hi and f.result.ok]
        ttft = [r.ttft_s for r in done if r.ttft_s is not None]
        tpot = [r.tpot_s for r in done if r.tpot_s is not None]
        rows.append([f"{lo:.0f}–{hi:.0f}", str(len(done)),
                     *(_ms(percentile(ttft, q)) for q in (0.5, 0.9, 0.99)),
                     *(_ms(percentile(tpot, q)) for q in (0.5, 0.9, 0.99))])  # fmt: skip
    return rows


def summary_lines(result: SoakResult) -> list[str]:
    intended, unintended = errors_by_type(result)
    served = sum(1 for f in result.finished if f.result.ok)
    lines = [
        f"duration {result.elapsed_s:.0f} s, {result.config.clients} clients, {result.config.replicas} gateways, "
        f"{result.config.workers} workers",
        f"requests: {len(result.finished)} finished, {served} served, {served / max(result.elapsed_s, 1e-9):.1f}/s",
        f"errors: intended {dict(intended)}, unintended {dict(unintended)}",
    ]
    lines += [f"[{'PASS' if c.met else 'FAIL'}] {c.name}: {c.detail}" for c in checks(result)]
    return lines


def write(result: SoakResult, out: Path, *, command: str) -> Path:
    """Write ``out/soak.md``; returns its path."""
    cfg = result.config
    out.mkdir(parents=True, exist_ok=True)
    window = max(cfg.sample_s, cfg.duration_s / 10)
    intended, unintended = errors_by_type(result)
    clients = client_totals(result)
    parts = [
        "# Soak run: two gateway replicas on Redis under streaming load",
        "",
        f"Command: `{command}`",
        "",
        f"{cfg.clients} concurrent streaming clients for {result.elapsed_s:.0f} s against {cfg.replicas} "
        f"`gearshift gateway` processes sharing one `redis-server`, in front of {cfg.workers} simulated workers "
        f"(`gearshift sim serve`, speedup {cfg.speedup:g}); completions of {cfg.min_tokens}–{cfg.max_tokens} tokens; "
        f"tenants {', '.join(f'{t.id} ({t.tier})' for t in cfg.tenants)}; limited on purpose: "
        f"{', '.join(sorted(result.limited_tenants)) or 'none'}.",
        "",
        f"Machine: {os.cpu_count()} CPUs, load average (1/5/15 min) {_load(result.load[0])} at the start of the load "
        f"and {_load(result.load[1])} at its end (the soak's own processes included).",
        "",
        "## Invariants",
        "",
        table(["check", "result", "detail"], [[c.name, "pass" if c.met else "FAIL", c.detail] for c in checks(result)]),
        "",
        "## Requests and errors",
        "",
        table(
            ["outcome", "count"],
            [["served (200, [DONE], no error)", str(sum(1 for f in result.finished if f.result.ok))]]
            + [[f"intended: {k}", str(v)] for k, v in intended.items()]
            + [[f"UNINTENDED: {k}", str(v)] for k, v in unintended.items()],
        ),
        "",
        *(
            [
                "## Transport errors",
                "",
                "By exception, phase (`connect`; `before the response`: sent, no HTTP status; `mid-body`) and "
                "connection (`pooled`: reused from the clients' pool, which keeps a connection idle at most "
                f"{CLIENT_KEEPALIVE_S:g} s; `new`).",
                "",
                table(
                    ["exception", "phase", "connection", "count", "ran s", "at s", "replicas", "first"],
                    transport_rows(result),
                ),
                "",
            ]
            if any(f.result.transport_error is not None for f in result.finished)
            else []
        ),
        "## Latency over time (client side, ms)",
        "",
        table(
            ["window s", "served", "TTFT p50", "TTFT p90", "TTFT p99", "TPOT p50", "TPOT p90", "TPOT p99"],
            latency_rows(result.finished, window_s=window, elapsed_s=result.elapsed_s),
        ),
        "",
        "## Gateway processes over time",
        "",
        table(
            ["t s", "RSS MiB", "client connections", "open fds", "asyncio tasks", "served", "errors"],
            [
                [
                    f"{s.at_s:.0f}",
                    " / ".join(f"{r:.0f}" for r in s.rss_mib),
                    " / ".join(map(str, s.connections)),
                    " / ".join(map(str, s.fds)),
                    " / ".join("–" if t is None else f"{t:.0f}" for t in s.tasks),
                    str(s.served),
                    str(s.errors),
                ]
                for s in result.samples
            ],
        ),
        "",
        "## Usage ledger against the clients' own counts",
        "",
        table(
            ["tenant", "requests ledger/clients", "prompt tokens ledger/clients", "completion tokens ledger/clients"],
            [
                [
                    t,
                    *(
                        f"{result.ledger.get(t, {}).get(k, 0):.0f} / {row[k]:.0f}"
                        for k in ("requests", "prompt_tokens", "completion_tokens")
                    ),
                ]
                for t, row in clients.items()
            ],
        ),
        "",
        "The totals above are the admin usage report's. Request by request (each answered request's `x-request-id` "
        f"looked up among the run's ledger records): {_diff_detail(request_ledger(result))}.",
        "",
        f"Gateway exit codes after SIGTERM: {result.gateway_exit_codes}.",
        "",
    ]
    path = out / "soak.md"
    path.write_text("\n".join(parts))
    return path
