"""The worker restart contract (issue 14): restart a worker with or without its drafter, and read whether it
is back. Served by the simulated worker (``workers.sim.restart_api``) and by the vLLM supervisor
(``workers.vllm.supervisor``); called by the controller once the worker is drained (``controller.gear_mode``).

- ``GET /gearshift/v1/restart`` → ``RestartState``.
- ``POST /gearshift/v1/restart`` with ``{"drafter": false}`` (control token as Bearer) → 202 and the state,
  ``restarting`` true; the worker stops serving, restarts in that mode, and serves again (``restarting``
  false, ``restarts`` one more). 409 while a restart is under way; 401 without the token.
"""

from __future__ import annotations

from typing import Final

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.bearer import bearer_header

RESTART_PATH: Final = "/gearshift/v1/restart"
"""The restart route on every restartable worker (or its supervisor)."""


class RestartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    drafter: bool
    """Start with the drafter (the speculative config) or without it."""
    reason: str = Field("", max_length=500)


class RestartState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    drafter: bool
    """The mode it runs in, or, while restarting, the one it is starting in."""
    restarting: bool = False
    restarts: int = Field(0, ge=0)
    """Restarts completed since the worker (or supervisor) started."""
    restart_s: float | None = None
    """What one restart is expected to take, seconds (None: unknown)."""


class RestartCallError(RuntimeError):
    """A restart call failed; ``status`` is the HTTP status of a refusal (None: no answer)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RestartClient:
    """Reads and requests restarts of any worker through one injected ``httpx.AsyncClient``."""

    def __init__(self, client: httpx.AsyncClient, *, control_token: str, timeout_s: float = 5.0) -> None:
        self._client = client
        self._headers = bearer_header(control_token)
        self._timeout = timeout_s

    async def state(self, url: str) -> RestartState:
        return await self._call("GET", url, None)

    async def restart(self, url: str, request: RestartRequest) -> RestartState:
        return await self._call("POST", url, request)

    async def _call(self, method: str, url: str, body: RestartRequest | None) -> RestartState:
        target = url.rstrip("/") + RESTART_PATH
        headers = dict(self._headers)
        content = None
        if body is not None:
            content, headers["Content-Type"] = body.model_dump_json(), "application/json"
        try:
            resp = await self._client.request(method, target, content=content, headers=headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise RestartCallError(f"{method} {target}: {exc!r}") from exc
        if resp.status_code not in (httpx.codes.OK, httpx.codes.ACCEPTED):
            raise RestartCallError(
                f"{method} {target}: HTTP {resp.status_code}: {resp.text[:300]}", status=resp.status_code
            )
        try:
            return RestartState.model_validate_json(resp.content)
        except ValidationError as exc:
            raise RestartCallError(f"{method} {target}: bad response body: {exc}") from exc
