"""Bit-identity of the replay across a change to the lab (a tool, not a test): replay fixed scenarios under every
policy, write every figure of every run exactly (floats as their ``repr``), and compare two such files field by
field.

    python -m bench.replay.fingerprint save before.json      # on the code before the change
    python -m bench.replay.fingerprint save after.json       # after it
    python -m bench.replay.fingerprint compare before.json after.json
    python -m bench.replay.fingerprint save --in-memory mem.json   # every record kept (the definitions)

The fixed scenarios (``SCENARIOS``): synthetic two-tier traces (``bench.replay.speed.synthetic_trace``) at loads
that keep a few workers busy, plus one with multi-turn sessions (closed loops), each replayed with
``bench.replay.run.replay`` (static k, every lab policy, then the per-phase oracle) on one process.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.replay.run import ReplayResult, replay
from bench.replay.scenario import plan_replay
from bench.replay.speed import synthetic_trace
from bench.replay.trace import Trace, read_trace
from fleet.perf import load_profile


@dataclass(frozen=True)
class FixedScenario:
    name: str
    duration_s: float
    rate_per_s: float
    workers: int
    profile: str
    phase_s: float
    sessions: bool = False


SCENARIOS = (
    FixedScenario("tp16-4w", 300.0, 12.0, 4, "kimi-k3-dspark-tp16", 60.0),
    FixedScenario("mi355x-2w-hot", 300.0, 20.0, 2, "kimi-k3-dspark-mi355x-tp8", 60.0),
    FixedScenario("tp16-sessions", 300.0, 6.0, 2, "kimi-k3-dspark-tp16", 100.0, sessions=True),
)


def _with_sessions(trace: Trace) -> Trace:
    """Every third request becomes a turn of one of 40 sessions (the turns keep their recorded order)."""
    out = [dataclasses.replace(r, session=f"s{i % 40}") if i % 3 == 0 else r for i, r in enumerate(trace.requests)]
    return dataclasses.replace(trace, requests=tuple(out))


def _trace(sc: FixedScenario, tmp: Path) -> Trace:
    path = tmp / f"{sc.name}.jsonl"
    synthetic_trace(path, duration_s=sc.duration_s, rate_per_s=sc.rate_per_s)
    trace = read_trace(path)
    return _with_sessions(trace) if sc.sessions else trace


def run_scenario(sc: FixedScenario, *, streamed: bool = True) -> ReplayResult:
    with tempfile.TemporaryDirectory() as tmp:
        trace = _trace(sc, Path(tmp))
    plan = plan_replay(trace, load_profile(sc.profile), profile_path=sc.profile, workers=sc.workers, phase_s=sc.phase_s)
    if not streamed:
        return replay(plan, processes=1, streamed=False)
    return replay(plan, processes=1)


def _exact(value: Any) -> Any:
    """JSON-safe and exact: floats as ``repr`` (NaN and infinities included), containers recursively."""
    if isinstance(value, float):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _exact(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _exact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_exact(v) for v in value]
    return value


def fingerprint(result: ReplayResult) -> dict[str, Any]:
    """Every figure of every run of ``result`` (wall times left out)."""
    runs = {
        name: {"metrics": _exact(run.metrics), "tiers": _exact(run.tiers), "k_over_time": _exact(run.k_over_time)}
        for name, run in result.runs.items()
    }
    return {"oracle_choice": result.oracle_choice, "recipe": result.recipe, "runs": runs}


def differences(before: Any, after: Any, path: str = "") -> Iterator[str]:
    """Every path at which two fingerprints differ, with both values."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if key not in before or key not in after:
                yield f"{path}/{key}: only in {'after' if key not in before else 'before'}"
            else:
                yield from differences(before[key], after[key], f"{path}/{key}")
    elif isinstance(before, list) and isinstance(after, list):
        if len(before) != len(after):
            yield f"{path}: {len(before)} items before, {len(after)} after"
        for i, (b, a) in enumerate(zip(before, after, strict=False)):
            yield from differences(b, a, f"{path}[{i}]")
    elif before != after:
        yield f"{path}: {before!r} before, {after!r} after"


def count_fields(value: Any) -> int:
    if isinstance(value, dict):
        return sum(count_fields(v) for v in value.values())
    if isinstance(value, list):
        return sum(count_fields(v) for v in value)
    return 1


def save(path: Path, *, streamed: bool = True) -> None:
    out: dict[str, Any] = {}
    for sc in SCENARIOS:
        started = time.perf_counter()
        out[sc.name] = fingerprint(run_scenario(sc, streamed=streamed))
        print(f"{sc.name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    path.write_text(json.dumps(out, indent=1, sort_keys=True))


def compare(before_path: Path, after_path: Path) -> int:
    before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
    diffs = list(differences(before, after))
    for line in diffs[:50]:
        print(line)
    print(f"{count_fields(before)} fields compared, {len(diffs)} differ")
    return 1 if diffs else 0


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "save":
        save(Path(argv[1]))
        return 0
    if len(argv) == 3 and argv[:2] == ["save", "--in-memory"]:
        save(Path(argv[2]), streamed=False)
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return compare(Path(argv[1]), Path(argv[2]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
