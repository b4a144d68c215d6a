"""Profile k = 0 in-process, one engine per process: vLLM's offline ``LLM`` on the tiny model (its own draft model),
the engine core and model runner in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so cProfile sees every
step. Run with ``.venv-vllm``'s python, once per arm::

    .venv-vllm/bin/python -m workers.vllm.profile_idle --arm plain --out /tmp/k0/plain
    .venv-vllm/bin/python -m workers.vllm.profile_idle --arm skip --out /tmp/k0/skip
    .venv-vllm/bin/python -m workers.vllm.profile_idle --diff /tmp/k0/plain /tmp/k0/skip

``--method ngram`` speculates with ngram instead of the tiny model as its own draft model. ``--paired --arm skip``
(or ``stock``) builds both engines in one process and interleaves their generations: the figure to quote, since
two processes' CPU times differ by several per cent on a busy machine even with the same work::

    .venv-vllm/bin/python -m workers.vllm.profile_idle --paired --arm skip --batch 1 --reps 10

Arms: ``plain`` (no speculative config), ``stock`` (speculation at k = 0, the skip off), ``skip`` (speculation at
k = 0, the plugin's skip on). k = 0 is the start-up table ``[[1, max_num_seqs, 0]]``. Each run prints the best CPU
seconds (``time.process_time``) of ``--reps`` generations, writes ``stats.prof`` (one more generation under
cProfile) and ``calls.json`` (calls and cumulative seconds per function, and the engine's step count), and the
outputs' digest (greedy: equal across arms when the skip is exact). ``--diff`` prints the functions whose calls
per step differ most between two runs. Call counts do not move with the machine's load; times do.

CPU time is measured with ``OMP_WAIT_POLICY=PASSIVE`` (unless set): OpenMP threads then sleep at a barrier
instead of spinning, so the process's CPU time is its work. With vLLM's default (active) waiting, on a machine
whose cores other work holds, the spin-waits moved one generation's CPU time 0.2 → 1.2 s (plain, batch 1);
passive, 0.078 → 0.089 s at a load average of 8.7.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARMS = ("plain", "stock", "skip")


def _engine_kwargs(arm: str, model_dir: Path, max_num_seqs: int, k_max: int, method: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "max_num_seqs": max_num_seqs,
        "kv_cache_memory_bytes": 64 * 1024 * 1024,
        "max_model_len": 1024,
        "dtype": "float32",
        "enforce_eager": True,
        "distributed_executor_backend": "uni",
        "seed": 0,
    }
    if arm != "plain":
        drafter: dict[str, Any] = {"method": "draft_model", "model": str(model_dir)}
        if method == "ngram":
            from workers.vllm.cpu_server import NGRAM_LOOKUP

            drafter = {"method": "ngram", **NGRAM_LOOKUP}
        kwargs["speculative_config"] = {
            **drafter,
            "num_speculative_tokens": k_max,
            "num_speculative_tokens_per_batch_size": [[1, max_num_seqs, 0]],
        }
    return kwargs


def run(
    arm: str,
    out: Path,
    *,
    batch: int,
    max_tokens: int,
    reps: int,
    max_num_seqs: int,
    omp_cores: str | None,
    method: str = "draft_model",
) -> dict[str, Any]:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads OpenMP: see the module's docstring
    if omp_cores is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = omp_cores
    os.environ["VLLM_PLUGINS"] = "gearshift"
    os.environ["GEARSHIFT_IDLE_DRAFTER"] = "stock" if arm == "stock" else "skip"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams

    from workers.vllm.measure import batch_prompt
    from workers.vllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(out.parent / "tiny-llama")
    llm = LLM(**_engine_kwargs(arm, model_dir, max_num_seqs, k_max=4, method=method))
    prompts = [batch_prompt(i) for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    def generate() -> list[str]:
        return [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]

    texts = generate()  # warm-up
    cpu = []
    for _ in range(reps):
        start = time.process_time()
        generate()
        cpu.append(time.process_time() - start)
    engine = llm.llm_engine.engine_core.engine_core
    steps = {"n": 0}
    step = engine.step_fn

    def counted_step(*args: Any, **kwargs: Any) -> Any:
        steps["n"] += 1
        return step(*args, **kwargs)

    engine.step_fn = counted_step
    profiler = cProfile.Profile()
    profiler.enable()
    generate()
    profiler.disable()
    engine.step_fn = step
    out.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(out / "stats.prof"))
    stats = pstats.Stats(profiler)
    calls = {
        f"{Path(file).name}:{line}:{name}": [nc, cum]
        for (file, line, name), (_cc, nc, _tt, cum, _callers) in stats.stats.items()  # type: ignore[attr-defined]
    }
    result = {
        "arm": arm,
        "method": None if arm == "plain" else method,
        "batch": batch,
        "max_tokens": max_tokens,
        "cpu_s": cpu,
        "best_cpu_s": min(cpu),
        "steps": steps["n"],
        "async_scheduling": bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling),
        "omp_cores": omp_cores,
        "digest": hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16],
        "calls": calls,
    }
    (out / "calls.json").write_text(json.dumps(result))
    return result


def paired(arm: str, *, batch: int, max_tokens: int, reps: int, max_num_seqs: int, method: str) -> dict[str, Any]:
    """``plain`` and ``arm`` as two engines in this one process, their generations interleaved (the order
    alternating): both see the same machine at the same moments, so their CPU-time ratio moves far less with
    other work than two processes' do. Returns each engine's best and median CPU seconds per generation, the
    ratio of the bests, the median of the per-pair ratios, and whether their greedy texts are equal."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["VLLM_PLUGINS"] = "gearshift"
    os.environ["GEARSHIFT_IDLE_DRAFTER"] = "stock" if arm == "stock" else "skip"  # plain: inert either way
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vllm import LLM, SamplingParams

    from workers.vllm.measure import batch_prompt
    from workers.vllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "gearshift-profile-idle" / "tiny-llama")
    engines = {
        name: LLM(**_engine_kwargs(name, model_dir, max_num_seqs, k_max=4, method=method)) for name in ("plain", arm)
    }
    prompts = [batch_prompt(i) for i in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    texts = {
        name: [o.outputs[0].text for o in e.generate(prompts, params, use_tqdm=False)] for name, e in engines.items()
    }
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    for r in range(reps):
        for name in ("plain", arm) if r % 2 == 0 else (arm, "plain"):
            start = time.process_time()
            engines[name].generate(prompts, params, use_tqdm=False)
            cpu[name].append(time.process_time() - start)
    return {
        "arm": arm,
        "method": method,
        "batch": batch,
        "reps": reps,
        "plain_best_s": min(cpu["plain"]),
        "arm_best_s": min(cpu[arm]),
        "ratio_of_bests": min(cpu[arm]) / min(cpu["plain"]),
        "median_pair_ratio": statistics.median(b / a for a, b in zip(cpu["plain"], cpu[arm], strict=True)),
        "plain_median_s": statistics.median(cpu["plain"]),
        "arm_median_s": statistics.median(cpu[arm]),
        "same_text": texts["plain"] == texts[arm],
    }


def diff(a: dict[str, Any], b: dict[str, Any], *, top: int) -> str:
    """Functions by the difference in calls per engine step (b − a), then by cumulative seconds per step."""
    sa, sb = max(1, a["steps"]), max(1, b["steps"])
    names = set(a["calls"]) | set(b["calls"])
    rows = []
    for name in names:
        ca, ta = a["calls"].get(name, [0, 0.0])
        cb, tb = b["calls"].get(name, [0, 0.0])
        rows.append((cb / sb - ca / sa, (tb / sb - ta / sa) * 1e3, ca / sa, cb / sb, name))
    lines = [
        f"{a['arm']}: {a['steps']} steps, best CPU {a['best_cpu_s']:.3f} s; "
        f"{b['arm']}: {b['steps']} steps, best CPU {b['best_cpu_s']:.3f} s; "
        f"ratio {b['best_cpu_s'] / a['best_cpu_s'] - 1:+.1%}; digests {a['digest']} {b['digest']}",
        f"{'Δcalls/step':>11} {'Δcum ms/step':>12} {'a/step':>8} {'b/step':>8}  function",
    ]
    by_calls = sorted(rows, key=lambda r: (-abs(r[0]), -abs(r[1])))[:top]
    lines += [f"{r[0]:>+11.2f} {r[1]:>+12.3f} {r[2]:>8.2f} {r[3]:>8.2f}  {r[4]}" for r in by_calls]
    lines.append("by cumulative time per step:")
    by_time = sorted(rows, key=lambda r: -abs(r[1]))[:top]
    lines += [f"{r[0]:>+11.2f} {r[1]:>+12.3f} {r[2]:>8.2f} {r[3]:>8.2f}  {r[4]}" for r in by_time]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arm", choices=ARMS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--method", choices=("draft_model", "ngram"), default="draft_model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument(
        "--omp-cores",
        help="VLLM_CPU_OMP_THREADS_BIND, e.g. 0: one OpenMP thread, whose CPU time a busy machine moves far less "
        "than a team's spin-waits (default: vLLM's, every core)",
    )
    parser.add_argument(
        "--paired", action="store_true", help="CPU time of --arm against plain, both engines in this process"
    )
    parser.add_argument("--diff", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.diff:
        a, b = (json.loads((p / "calls.json").read_text()) for p in args.diff)
        sys.stdout.write(diff(a, b, top=args.top) + "\n")
        return 0
    if args.paired:
        if args.arm in (None, "plain"):
            parser.error("--paired needs --arm stock or skip")
        answer = paired(
            args.arm,
            batch=args.batch,
            max_tokens=args.max_tokens,
            reps=args.reps,
            max_num_seqs=args.max_num_seqs,
            method=args.method,
        )
        sys.stdout.write(json.dumps(answer) + "\n")
        return 0
    if args.arm is None or args.out is None:
        parser.error("--arm and --out, or --paired --arm, or --diff A B")
    result = run(
        args.arm,
        args.out,
        batch=args.batch,
        max_tokens=args.max_tokens,
        reps=args.reps,
        max_num_seqs=args.max_num_seqs,
        omp_cores=args.omp_cores,
        method=args.method,
    )
    summary = {k: v for k, v in result.items() if k != "calls"}
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
