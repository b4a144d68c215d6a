"""The client side of the worker speculation-control API (DESIGN §3.1), for the controller, the profiler and the
vLLM measurement: ``GET``/``PUT <worker url>/gearshift/v1/speculation`` with the control token as Bearer."""

from __future__ import annotations

import httpx
from pydantic import ValidationError

from fleet.bearer import bearer_header
from fleet.speculation import SPECULATION_PATH, SpeculationState, SpeculationUpdate

STATUS_STALE_VERSION = 409


class SpeculationCallError(RuntimeError):
    """A speculation call failed: no answer, a refusal (``status`` is its HTTP status), or a body that is not a
    ``SpeculationState``. The message names the method and URL."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def stale_version(self) -> bool:
        """The worker refused the update's version as older than the applied one (HTTP 409)."""
        return self.status == STATUS_STALE_VERSION


class SpeculationClient:
    """Reads and updates the speculation schedule of any worker through one injected ``httpx.AsyncClient``."""

    def __init__(self, client: httpx.AsyncClient, *, control_token: str, timeout_s: float | None = None) -> None:
        """``timeout_s``: seconds per call; ``None`` keeps the ``httpx`` client's own timeout."""
        self._client = client
        self._headers = bearer_header(control_token)
        self._timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s

    async def state(self, worker_url: str) -> SpeculationState:
        """The worker's applied schedule, version and lease."""
        return await self._call("GET", worker_url, None)

    async def update(self, worker_url: str, update: SpeculationUpdate) -> SpeculationState:
        """Install ``update`` (its version and lease); the worker answers with the state it now holds."""
        return await self._call("PUT", worker_url, update)

    async def _call(self, method: str, worker_url: str, update: SpeculationUpdate | None) -> SpeculationState:
        url = worker_url.rstrip("/") + SPECULATION_PATH
        headers = dict(self._headers)
        body = None
        if update is not None:
            body = update.model_dump_json(exclude_none=True)
            headers["Content-Type"] = "application/json"
        try:
            resp = await self._client.request(method, url, content=body, headers=headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise SpeculationCallError(f"{method} {url}: {exc!r}") from exc
        if resp.status_code != httpx.codes.OK:
            raise SpeculationCallError(
                f"{method} {url}: HTTP {resp.status_code}: {resp.text[:500]}", status=resp.status_code
            )
        try:
            return SpeculationState.model_validate_json(resp.content)
        except ValidationError as exc:
            raise SpeculationCallError(f"{method} {url}: bad response body: {exc}") from exc
