"""A worker's mode (the drafter-free gear, issue 14): whether it runs with its drafter, and where it is on the
way between the two. The controller (``controller.gear_mode``) writes one record per worker to the store's
generic documents (collection ``worker-modes``); the gateway reads them (``gateway.routing.draining``) and sends no new
request to a worker that is draining or restarting, while the requests it already has finish.

A move is: ``serving`` → ``draining`` (no new requests) → ``restarting`` (the worker restarts in the other mode;
its capacity is gone for the profile's ``restart_s``) → ``returning`` (back, routable, the controller re-reads
it) → ``serving`` in the new mode.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.store.protocol import Store

COLLECTION: Final = "worker-modes"
"""The store's document collection holding one ``WorkerMode`` per worker id."""


class Mode(StrEnum):
    DRAFTER = "drafter"
    """Started with its drafter: speculation at any advertised k, k = 0 with the idle-drafter tax."""
    DRAFTER_FREE = "drafter-free"
    """Started without a speculative config: k = 0 only, and no tax."""


class Phase(StrEnum):
    SERVING = "serving"
    DRAINING = "draining"
    """Gets no new requests; its in-flight ones finish."""
    RESTARTING = "restarting"
    """Restarting in ``WorkerMode.target``; serves nothing."""
    RETURNING = "returning"
    """Back up in its new mode and routable; the controller has not yet read it again."""


ROUTABLE: Final = frozenset({Phase.SERVING, Phase.RETURNING})
"""Phases in which the gateway may send the worker new requests."""


class WorkerMode(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    worker_id: str
    mode: Mode
    """The mode the worker runs in now (during a move: the one it is leaving)."""
    phase: Phase = Phase.SERVING
    target: Mode | None = None
    """During a move, the mode it is going to (None when serving)."""
    since: float = Field(ge=0)
    """Unix seconds when the worker entered ``phase``."""
    mode_since: float = Field(ge=0)
    """Unix seconds when the worker last started in ``mode`` (the minimum dwell counts from it)."""
    reason: str = ""

    @property
    def routable(self) -> bool:
        return self.phase in ROUTABLE

    @property
    def drafter_loaded(self) -> bool:
        return self.mode is Mode.DRAFTER


async def read_modes(store: Store) -> dict[str, WorkerMode]:
    """Every worker's mode record (a record that does not parse is skipped: a newer writer's, or damaged)."""
    out: dict[str, WorkerMode] = {}
    for doc_id, body in (await store.docs(COLLECTION)).items():
        try:
            out[doc_id] = WorkerMode.model_validate_json(body)
        except ValidationError:
            continue
    return out


async def write_mode(store: Store, mode: WorkerMode) -> None:
    await store.put_doc(COLLECTION, mode.worker_id, mode.model_dump_json())
