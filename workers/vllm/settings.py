"""Settings of the gearshift vLLM plugin, read from ``GEARSHIFT_*`` environment variables in every vLLM process."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from fleet.config import CommonSettings, exposure, refuse_dev_secrets


class IdleDrafter(StrEnum):
    """What the drafter does on a step where no request verifies a draft (every k = 0)."""

    STOCK = "stock"
    """vLLM's own behaviour: the drafter runs (the idle-drafter tax)."""
    SKIP = "skip"
    """The plugin skips the drafter's work and keeps its context current (``workers.vllm.idle_v1``/``idle_v2``)."""
    SKIP_NO_CATCH_UP = "skip-no-catch-up"
    """An ablation, never for serving: the V1 skip without its catch-up, so a draft model's KV keeps a hole at
    every position computed at k = 0. What acceptance after a return to k > 0 loses without the catch-up
    (``gearshift worker measure --k0-tax``'s acceptance check) shows that the check can fail."""


class VllmPluginSettings(CommonSettings):
    """The shared settings plus what the plugin inside vLLM needs (the launcher sets ``GEARSHIFT_WORKER_ID``)."""

    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "vllm-0"
    """Reported as ``worker_id`` by ``GET /gearshift/v1/speculation``."""
    spec_poll_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    """Seconds between the API server's reads of the engine's schedule: it refreshes the worker metrics and
    lets a lease expire on an idle engine (a busy engine checks its lease before every step anyway)."""
    idle_drafter: IdleDrafter = IdleDrafter.SKIP
    """``GEARSHIFT_IDLE_DRAFTER``: ``skip`` (default), ``stock`` (to measure the tax the skip removes) or
    ``skip-no-catch-up`` (to measure what the catch-up is worth)."""
    host: str | None = None
    """The API server's listen address (the plugin passes vLLM's ``--host``; "" for every interface); None in
    the engine process, which listens nowhere."""

    @model_validator(mode="after")
    def _check_secrets(self) -> Self:
        """Shared mode or a public listen address refuses the development control token."""
        exposed = exposure(redis_url=self.redis_url, host=self.host)
        refuse_dev_secrets({"control_token": self.control_token}, exposed=exposed, allowed=self.allow_dev_secrets)
        return self
