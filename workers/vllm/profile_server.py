"""Profile k = 0 on a real server: the CPU worker exactly as ``gearshift worker measure --k0-tax`` starts it (API
server, EngineCore process, its start-up table, k = 0 set through the control API, requests over HTTP), with the
EngineCore process under cProfile. ``workers.vllm.profile_idle`` profiles vLLM's offline ``LLM`` instead, whose
engine differs from a server's (no stats logging, no busy loop, k = 0 from the start-up table); this shows what
a server's steps run. Run with ``.venv``'s python, once per arm, then diff as for ``profile_idle``::

    .venv/bin/python -m workers.vllm.profile_server --arm plain --batch 8 --out /tmp/k0/srv-plain
    .venv/bin/python -m workers.vllm.profile_server --arm skip --batch 8 --out /tmp/k0/srv-skip
    .venv-vllm/bin/python -m workers.vllm.profile_idle --diff /tmp/k0/srv-plain /tmp/k0/srv-skip

The profiler is started by a ``sitecustomize`` put on the server's ``PYTHONPATH`` (only in a process spawned by
``multiprocessing``: the EngineCore) and dumped on SIGUSR2, before the server stops. Call counts per engine step
do not move with the machine's load (times do; under cProfile they are inflated anyway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from fleet.config import CommonSettings
from fleet.ports import free_port
from fleet.speculation import SpeculationUpdate
from fleet.speculation_client import SpeculationClient
from workers.vllm.cpu_server import REPO_ROOT, build_tiny_model, running_server, tiny_plan, tiny_worker
from workers.vllm.launcher import CpuOptions
from workers.vllm.measure import run_batch, without_speculation
from workers.vllm.measure_idle import ARM_ENV, PLAIN

PROFILE_DIR_ENV = "GEARSHIFT_PROFILE_ENGINE_DIR"
_CORE = os.path.join("v1", "engine", "core.py")
SITECUSTOMIZE = f"""
import os
if os.environ.get({PROFILE_DIR_ENV!r}):
    with open("/proc/self/cmdline", "rb") as f:
        _cmd = f.read()
    if b"--multiprocessing-fork" in _cmd:
        import cProfile, signal
        _profile = cProfile.Profile()
        _profile.enable()

        def _dump(signum, frame):
            _profile.disable()
            path = os.path.join(os.environ[{PROFILE_DIR_ENV!r}], f"engine-{{os.getpid()}}.prof")
            _profile.dump_stats(path + ".tmp")
            os.rename(path + ".tmp", path)

        signal.signal(signal.SIGUSR2, _dump)
        with open(os.path.join(os.environ[{PROFILE_DIR_ENV!r}], f"engine-{{os.getpid()}}.pid"), "w") as f:
            f.write(str(os.getpid()))
"""


def calls_of(profile: Path) -> tuple[int, dict[str, list[float]]]:
    """Engine steps (calls of ``EngineCore.step``) and ``{file:line:function: [calls, cumulative s]}``, keyed as
    ``profile_idle`` keys its own."""
    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    calls = {
        f"{Path(file).name}:{line}:{name}": [nc, cum] for (file, line, name), (_cc, nc, _tt, cum, _c) in stats.items()
    }
    steps = max(
        (nc for (file, _line, name), (_cc, nc, *_rest) in stats.items() if name == "step" and file.endswith(_CORE)),
        default=0,
    )
    return steps, calls


def _dump_engine_profile(out: Path, timeout_s: float = 120.0) -> Path:
    (pid_file,) = out.glob("engine-*.pid")
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGUSR2)
    target = out / f"engine-{pid}.prof"
    deadline = time.monotonic() + timeout_s
    while not target.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the EngineCore ({pid}) wrote no profile in {timeout_s:.0f} s")
        time.sleep(0.5)
    return target


def profile_server(arm: str, out: Path, *, batch: int, batches: int, max_tokens: int) -> dict[str, Any]:
    """Start ``arm``'s server (draft-model method), warm it up, run ``batches`` batches of ``batch`` greedy
    completions at k = 0, dump the EngineCore's profile, and write ``calls.json`` for ``profile_idle --diff``."""
    out.mkdir(parents=True, exist_ok=True)
    site = out / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    model_dir = build_tiny_model(out.parent / "tiny-llama")
    worker = tiny_worker(port=free_port(), model_dir=model_dir, worker_id=f"tiny-{arm}", max_num_seqs=32)
    plan = tiny_plan(worker, cpu=CpuOptions(), speculative_extra={"method": "draft_model", "model": str(model_dir)})
    plan = without_speculation(plan) if arm == PLAIN else plan
    env = {**ARM_ENV[arm], PROFILE_DIR_ENV: str(out), "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}"}
    token = CommonSettings().control_token.get_secret_value()

    async def load() -> list[float]:
        async with httpx.AsyncClient(timeout=900.0) as client:
            if arm != PLAIN:
                update = SpeculationUpdate(k=0, version=1, lease_seconds=3600.0, reason="profile")
                await SpeculationClient(client, control_token=token).update(worker.url, update)
            seconds = []
            for _ in range(batches + 1):  # the first warms up
                b = await run_batch(client, worker.url, model=worker.model, requests=batch, max_tokens=max_tokens)
                seconds.append(b.seconds)
            return seconds[1:]

    with running_server(plan, url=worker.url, log_path=out / "vllm.log", extra_env=env, ready_timeout_s=900.0):
        seconds = asyncio.run(load())
        profile = _dump_engine_profile(out)
    steps, calls = calls_of(profile)
    result = {
        "arm": arm,
        "batch": batch,
        "max_tokens": max_tokens,
        "steps": steps,
        "best_cpu_s": min(seconds),  # wall seconds of a batch under cProfile: a label for --diff, not a figure
        "digest": "-",
        "calls": calls,
    }
    (out / "calls.json").write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=tuple(ARM_ENV), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    result = profile_server(args.arm, args.out, batch=args.batch, batches=args.batches, max_tokens=args.max_tokens)
    sys.stdout.write(json.dumps({k: v for k, v in result.items() if k != "calls"}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
