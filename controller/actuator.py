"""Actuators: how the controller applies a k to a worker (DESIGN §3.1).

- ``HttpActuator``: ``GET``/``PUT <worker url>/gearshift/v1/speculation`` with the control token as Bearer.
- ``ControlActuator``: writes straight into in-process ``SpeculationControl`` objects (virtual time, tests).

Both raise ``ActuationError`` (``stale_version`` set on a 409) so the loop treats them alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import httpx

from fleet.config import WorkerConfig
from fleet.speculation import (
    ScheduleError,
    SpeculationControl,
    SpeculationState,
    SpeculationUpdate,
    StaleVersionError,
)
from fleet.speculation_client import SpeculationCallError, SpeculationClient


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
    """Applies k through each worker's control API (``fleet.speculation_client``)."""

    def __init__(self, client: httpx.AsyncClient, *, control_token: str, timeout_s: float = 2.0) -> None:
        self._api = SpeculationClient(client, control_token=control_token, timeout_s=timeout_s)

    async def current(self, worker: WorkerConfig) -> SpeculationState:
        try:
            return await self._api.state(worker.url)
        except SpeculationCallError as exc:
            raise ActuationError(f"worker {worker.id}: {exc}", stale_version=exc.stale_version) from exc

    async def apply(self, worker: WorkerConfig, update: SpeculationUpdate) -> SpeculationState:
        try:
            return await self._api.update(worker.url, update)
        except SpeculationCallError as exc:
            raise ActuationError(f"worker {worker.id}: {exc}", stale_version=exc.stale_version) from exc


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
