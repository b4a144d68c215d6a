"""The gateway-cost report: Markdown tables, the targets table and two PNG plots."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.gateway.runner import MODES, GatewayBenchResult, Mode
from bench.markdown import fmt, table

ADDED_P50_TARGET_MS = 1.0
JSON_RPS_TARGET = 2000.0
STREAM_RPS_TARGET = 1500.0
FLOOR = "passthrough"
DIRECT = "direct"


@dataclass(frozen=True)
class TargetCheck:
    target: str
    what: str
    goal: str
    value: float | None
    met: bool | None
    floor_ratio: float | None
    """The same figure of the minimal pass-through divided by... see ``ratio_note``."""
    ratio_note: str


def _added_ms(result: GatewayBenchResult, target: str, mode: Mode, c: int, q: str) -> float | None:
    mine, direct = result.get(target, mode, c), result.get(DIRECT, mode, c)
    if mine is None or direct is None:
        return None
    return (float(getattr(mine, q)) - float(getattr(direct, q))) / 1000.0


def _rps(result: GatewayBenchResult, target: str, mode: Mode, c: int) -> float | None:
    m = result.get(target, mode, c)
    return m.requests_per_s if m is not None else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def checks(result: GatewayBenchResult, target: str) -> list[TargetCheck]:
    """The DESIGN §6 targets for one proxy, each with its ratio to the minimal pass-through."""
    c_hi = max(result.config.concurrencies)
    added = _added_ms(result, target, "json", 1, "p50_us")
    floor_added = _added_ms(result, FLOOR, "json", 1, "p50_us")
    out = [
        TargetCheck(
            target,
            "added p50 latency, c=1, non-streaming",
            f"≤ {ADDED_P50_TARGET_MS:g} ms",
            added,
            None if added is None else added <= ADDED_P50_TARGET_MS,
            _ratio(added, floor_added),
            "× the pass-through's added p50",
        )
    ]
    rate_targets: tuple[tuple[Mode, float, str], ...] = (
        ("json", JSON_RPS_TARGET, "req/s"),
        ("stream", STREAM_RPS_TARGET, "32-chunk streams/s"),
    )
    for mode, goal, what in rate_targets:
        rps = _rps(result, target, mode, c_hi)
        out.append(
            TargetCheck(
                target,
                f"{what}, c={c_hi}",
                f"≥ {goal:,.0f}",
                rps,
                None if rps is None or c_hi != 64 else rps >= goal,
                _ratio(rps, _rps(result, FLOOR, mode, c_hi)),
                "of the pass-through's rate",
            )
        )
    return out


def _status(met: bool | None) -> str:
    return "not measured" if met is None else ("**met**" if met else "**not met**")


def render(result: GatewayBenchResult, *, command: str, plot_names: tuple[str, str]) -> str:
    names = [n for n, _ in result.targets]
    lines = [
        "# Gateway cost benchmark",
        "",
        f"Regenerate with `{command}`. Machine: {platform.machine()}, {len(_cpus())} CPUs, Python "
        f"{platform.python_version()}. Load generator: `wrk` 4 (1 thread, Lua script posting a chat body).",
        "",
        f"**Placement:** {result.placement.describe()}. Load average when the report was written: "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (other processes on the machine add noise).",
        "",
        "## Targets",
        "",
        "### Targets table",
        "",
    ]
    rows = []
    for target in [n for n in names if n != DIRECT]:
        for c in checks(result, target):
            ratio = "—" if c.floor_ratio is None else f"{c.floor_ratio:.2f} {c.ratio_note}"
            rows.append([c.target, c.what, c.goal, fmt(c.value), _status(c.met), ratio])
    lines += [table(["target", "figure", "goal", "value", "status", "vs minimal pass-through"], rows), ""]
    lines += ["### Targets measured", ""]
    lines += [table(["target", "what runs"], [[n, note] for n, note in result.targets], align="ll"), ""]
    lines += _throughput_section(result, names)
    lines += _commands_section(result)
    lines += _first_chunk_section(result, names)
    lines += _profile_section(result)
    lines += ["## Plots", "", f"![requests per second]({plot_names[0]})", "", f"![added latency]({plot_names[1]})", ""]
    if result.failures:
        lines += ["## Failures", ""] + [f"- {f}" for f in result.failures] + [""]
    return "\n".join(lines)


def _cpus() -> list[int]:
    from bench.procs import available_cpus

    return available_cpus()


def _throughput_section(result: GatewayBenchResult, names: list[str]) -> list[str]:
    lines = [
        "## Throughput and latency",
        "",
        "Latency is wrk's, of the whole response (for streams: to the last chunk). *Added* is the target's figure "
        "minus the direct upstream's in the same run. *vs floor* is the target's rate over the minimal "
        "pass-through's. *CPU µs/req* is the CPU time (user + system, from `/proc/<pid>/stat`) the proxy process "
        "used during the run divided by the requests it served: what one request costs the proxy's core. "
        "*Redis cmd/req* is the scripts and transactions the target's Redis ran during the run (EVALSHA, EVAL and "
        "EXEC in `INFO commandstats`: the gateway's round trips; the commands a script runs inside Redis are not "
        "counted) divided by the requests served; each Redis target has a redis-server of its own, so only its own "
        "commands count.",
        *_rounds_note(result),
        "",
        "### Throughput and latency table",
        "",
    ]
    rows = []
    for mode in MODES:
        for c in result.config.concurrencies:
            floor = _rps(result, FLOOR, mode, c)
            for name in names:
                entry = result.measurement(name, mode, c)
                if entry is None:
                    continue
                m = entry.wrk
                rows.append(
                    [
                        mode,
                        c,
                        name,
                        m.requests_per_s,
                        entry.cpu_us_per_request,
                        entry.redis_commands_per_request,
                        m.p50_us / 1000,
                        m.p99_us / 1000,
                        _added_ms(result, name, mode, c, "p50_us"),
                        _added_ms(result, name, mode, c, "p99_us"),
                        _ratio(m.requests_per_s, floor),
                        _spread(result, name, mode, c),
                        m.errors,
                    ]
                )
    header = ["mode", "c", "target", "req/s", "CPU µs/req", "Redis cmd/req", "p50 ms", "p99 ms"]
    header += ["added p50 ms", "added p99 ms", "vs floor", "spread", "errors"]
    lines += [table(header, [[_num(v) for v in r] for r in rows], align="lrl" + "r" * 10), ""]
    return lines


MIX_COLUMNS = 7
"""Commands named in the command mix table (the most frequent); the rest are summed as *other*."""


def _commands_section(result: GatewayBenchResult) -> list[str]:
    from bench.gateway.gearshift_target import limits_note

    lines = [
        "## Redis commands",
        "",
        "How the gateway on Redis enforces the bench tenant's limits (the default lease policy; with "
        "`--workers 2` each process leases half the slice):",
        "",
        *limits_note(),
        "",
    ]
    mixes = result.command_mix
    if not mixes:
        return [*lines, "No command mix was recorded in this run.", ""]
    totals: dict[str, int] = {}
    for mix in mixes:
        for name, count in mix.counts.items():
            totals[name] = totals.get(name, 0) + count
    named = sorted(totals, key=lambda n: (-totals[n], n))[:MIX_COLUMNS]
    rows = []
    for mix in mixes:
        other = sum(count for name, count in mix.counts.items() if name not in named)
        per = [mix.per_request(name) for name in named]
        rows.append([mix.target, mix.concurrency, mix.requests, mix.total_per_request, *per,
                     other / mix.requests if mix.requests else None])  # fmt: skip
    lines += [
        f"Top-level commands per request by name in an untimed json run of {result.config.command_mix_s:g} s per "
        "target and concurrency after the timed cells (`MONITOR` on the target's own redis-server; "
        "`evalsha:<script>` names the gearshift script a call ran, `bundle` being an admit that carried riders). "
        "Unlike *Redis cmd/req* above (EVALSHA, EVAL and EXEC only), every top-level command counts here.",
        "",
        "### Redis command mix table",
        "",
    ]
    header = ["target", "c", "requests", "cmd/req", *named, "other"]
    lines += [table(header, [[_num(v) for v in r] for r in rows], align="lrr" + "r" * (len(named) + 2)), ""]
    return lines


def _rounds_note(result: GatewayBenchResult) -> list[str]:
    if result.config.repeat < 2:
        return []
    return [
        f"Every figure is the per-field median of {result.config.repeat} rounds; each round runs every target once "
        "per mode and concurrency, so targets are interleaved in time. *spread* is (max − min) / median of req/s "
        "over the rounds: the run's noise."
    ]


def _spread(result: GatewayBenchResult, name: str, mode: Mode, c: int) -> str | None:
    spread = result.spread(name, mode, c)
    return None if spread is None else f"{spread:.0%}"


def _num(value: object) -> object:
    if value is None:
        return "—"
    if isinstance(value, float):
        return fmt(value)
    return value


def _first_chunk_section(result: GatewayBenchResult, names: list[str]) -> list[str]:
    lines = [
        "## Time to first chunk",
        "",
        "Measured by a small aiohttp client (`bench/gateway/ttfc.py`) at concurrency 1, sequential streamed "
        "requests for a few seconds per target, from sending the request to the first SSE bytes.",
        "",
        "### Time to first chunk table",
        "",
    ]
    direct = result.first_chunk.get(DIRECT)
    rows = []
    for name in names:
        r = result.first_chunk.get(name)
        if r is None:
            continue
        added = (r.p50_us - direct.p50_us) / 1000 if direct else None
        rows.append([name, r.samples, fmt(r.p50_us / 1000), fmt(r.p99_us / 1000), _num(added), r.incomplete])
    header = ["target", "streams", "p50 ms", "p99 ms", "added p50 ms", "incomplete"]
    return [*lines, table(header, rows, align="lrrrrr"), ""]


def _profile_section(result: GatewayBenchResult) -> list[str]:
    lines = ["## Where the time goes", ""]
    if not result.profiles:
        return [*lines, "No profile was recorded in this run.", ""]
    lines += [
        f"`py-spy record` (200 Hz) on each proxy's pid while wrk drove it at c={max(result.config.concurrencies)} "
        "(half non-streaming, half streaming). *Inside* counts a sample once for every component on its stack "
        "(shares overlap); *self* is the function on top of the stack. Idle is the share of sampling instants "
        "with no Python running (waiting in the event loop's poll).",
        "",
    ]
    for p in result.profiles:
        lines += [f"### {p.target}: {p.samples} samples, idle {100 * p.idle_share:.0f} %", ""]
        top = ", ".join(f"{k} {100 * v:.0f} %" for k, v in list(p.inclusive.items())[:4])
        lines += [f"Most samples were inside: {top}.", ""]
        rows = [[k, f"{100 * v:.1f} %"] for k, v in p.inclusive.items()]
        lines += [table(["component", "samples inside"], rows, align="lr"), ""]
        rows = [[f"`{k}`", f"{100 * v:.1f} %"] for k, v in p.top_self]
        lines += [table(["function (self time)", "samples"], rows, align="lr"), ""]
    return lines


def plot(result: GatewayBenchResult, out_dir: Path) -> tuple[str, str]:
    """Write the two PNGs; returns their file names."""
    names = [n for n, _ in result.targets]
    cs = list(result.config.concurrencies)
    rps_name, lat_name = "gateway-throughput.png", "gateway-added-latency.png"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    width = 0.8 / max(len(names), 1)
    for ax, mode in zip(axes, MODES, strict=True):
        for i, name in enumerate(names):
            values = [_rps(result, name, mode, c) or 0.0 for c in cs]
            ax.bar([x + i * width for x in range(len(cs))], values, width, label=name)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(cs))], [f"c={c}" for c in cs])
        ax.set_title("non-streaming" if mode == "json" else "32-chunk SSE streams")
        ax.set_ylabel("requests/s")
    axes[0].legend(fontsize=8)
    fig.savefig(out_dir / rps_name, dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    proxies = [n for n in names if n != DIRECT]
    width = 0.8 / max(len(proxies), 1)
    for ax, mode in zip(axes, MODES, strict=True):
        for i, name in enumerate(proxies):
            values = [_added_ms(result, name, mode, c, "p50_us") or 0.0 for c in cs]
            ax.bar([x + i * width for x in range(len(cs))], values, width, label=name)
        ax.set_xticks([x + width * (len(proxies) - 1) / 2 for x in range(len(cs))], [f"c={c}" for c in cs])
        ax.set_title(("non-streaming" if mode == "json" else "streams") + ": added p50 latency vs direct")
        ax.set_ylabel("ms")
    if proxies:
        axes[0].legend(fontsize=8)
    fig.savefig(out_dir / lat_name, dpi=110)
    plt.close(fig)
    return rps_name, lat_name


def write(result: GatewayBenchResult, out_dir: Path, *, command: str) -> Path:
    """Write ``gateway.md`` and its PNGs into ``out_dir``; returns the Markdown path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_names = plot(result, out_dir)
    path = out_dir / "gateway.md"
    path.write_text(render(result, command=command, plot_names=plot_names))
    return path
