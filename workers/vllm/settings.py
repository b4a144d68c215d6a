"""Settings of the gearshift vLLM plugin, read from ``GEARSHIFT_*`` environment variables in every vLLM process."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from fleet.config import CommonSettings


class VllmPluginSettings(CommonSettings):
    """The shared settings plus what the plugin inside vLLM needs (the launcher sets ``GEARSHIFT_WORKER_ID``)."""

    worker_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")] = "vllm-0"
    """Reported as ``worker_id`` by ``GET /gearshift/v1/speculation``."""
    spec_poll_seconds: Annotated[float, Field(gt=0, le=60)] = 1.0
    """Seconds between the API server's reads of the engine's schedule: it refreshes the worker metrics and
    lets a lease expire on an idle engine (a busy engine checks its lease before every step anyway)."""
