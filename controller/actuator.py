"""Actuators: how the controller applies a k to a worker (DESIGN §3.1).

- ``HttpActuator``: ``GET``/``PUT <worker url>/gearshift/v1/speculation`` with the control token as Bearer.
- ``ControlActuator``: writes straight into in-process ``SpeculationControl`` objects (virtual time, tests).

Both raise ``ActuationError`` (``stale_version`` set on a 409) so the loop treats them alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import httpx
from pydantic import ValidationError

from fleet.config import WorkerConfig
from fleet.speculation import (
    ScheduleError,
    SpeculationControl,
    SpeculationState,
    SpeculationUpdate,
    StaleVersionError,
)

SPECULATION_PATH = "/gearshift/v1/speculation"


class ActuationError(RuntimeError):
    """A worker refused or did not answer a speculation request."""

    def __init__(self, message: str, *, stale_version: bool = False) -> None:
        super().__init__(message)
        self.stale_version = stale_version


class Actuator(Protocol):
    async def current(self, worker: WorkerConfig) -> SpeculationState:
        """The worker's applied schedule and version."""
        ...

    async def apply(self, worker: WorkerConfig, update: SpeculationUpdate) -> SpeculationState:
        """Install ``update`` (with its version and lease) on the worker."""
        ...


class HttpActuator:
    def __init__(self, client: httpx.AsyncClient, *, control_token: str, timeout_s: float = 2.0) -> None:
        self._client = client
        self._headers = {"Authorization": f"Bearer {control_token}"}
        self._timeout = timeout_s

    async def _call(self, method: str, worker: WorkerConfig, body: str | None = None) -> SpeculationState:
        url = worker.url.rstrip("/") + SPECULATION_PATH
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            resp = await self._client.request(method, url, content=body, headers=headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise ActuationError(f"worker {worker.id}: {method} {url}: {exc!r}") from exc
        if resp.status_code != 200:
            raise ActuationError(
                f"worker {worker.id}: {method} {url}: HTTP {resp.status_code}: {resp.text[:200]}",
                stale_version=resp.status_code == 409,
            )
        try:
            return SpeculationState.model_validate_json(resp.content)
        except ValidationError as exc:
            raise ActuationError(f"worker {worker.id}: {method} {url}: bad response body: {exc}") from exc

    async def current(self, worker: WorkerConfig) -> SpeculationState:
        return await self._call("GET", worker)

    async def apply(self, worker: WorkerConfig, update: SpeculationUpdate) -> SpeculationState:
        return await self._call("PUT", worker, update.model_dump_json(exclude_none=True))


class ControlActuator:
    """Applies updates to ``SpeculationControl`` objects by worker id (no HTTP)."""

    def __init__(self, controls: Mapping[str, SpeculationControl]) -> None:
        self._controls = controls

    def _control(self, worker: WorkerConfig) -> SpeculationControl:
        ctl = self._controls.get(worker.id)
        if ctl is None:
            raise ActuationError(f"worker {worker.id}: no speculation control")
        return ctl

    async def current(self, worker: WorkerConfig) -> SpeculationState:
        return self._control(worker).state()

    async def apply(self, worker: WorkerConfig, update: SpeculationUpdate) -> SpeculationState:
        try:
            return self._control(worker).apply(update)
        except StaleVersionError as exc:
            raise ActuationError(f"worker {worker.id}: {exc}", stale_version=True) from exc
        except ScheduleError as exc:
            raise ActuationError(f"worker {worker.id}: {exc}") from exc
