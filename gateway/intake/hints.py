"""The request's hints: its ``x-gearshift-*`` headers, read in one pass over the headers and each checked by the
stage it steers, before admission.

- ``x-gearshift-workload``: what the request is (``chat``, ``maths``, ``code`` …), for placement
  (``gateway.routing.filters.placement.request_workload``);
- ``x-gearshift-session``: the conversation it belongs to, for the ledger (``gateway.intake.session``);
- ``x-gearshift-speculation``: how it wants to be decoded (``gateway.routing.filters.speculation``).

A malformed hint, or one the tenant may not send, is refused with a 400 naming the header.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from fleet.config import SpeculationMode
from gateway.intake.auth import Principal
from gateway.intake.session import SESSION_HEADER, request_session
from gateway.routing.filters.placement import WORKLOAD_HEADER, request_workload
from gateway.routing.filters.speculation import SPECULATION_HEADER, request_speculation

HINT_HEADERS: Final = frozenset({WORKLOAD_HEADER, SESSION_HEADER, SPECULATION_HEADER})


@dataclass(frozen=True, slots=True)
class RequestHints:
    """A request's checked hints (the defaults: no hint sent and no tenant default)."""

    workload: str | None = None
    """The workload (``request_workload``): the header's, else the tenant's default."""
    session: str | None = None
    """The client's session id, kept in the ledger for replays."""
    speculation: SpeculationMode = SpeculationMode.AUTO
    """The speculation mode (``request_speculation``), routed on and metered."""

    @classmethod
    def read(cls, headers: Iterable[tuple[bytes, bytes]], principal: Principal) -> RequestHints:
        """The hints in ``headers`` (ASGI's lower-case name/value pairs; the first of a repeated header counts),
        checked for ``principal``'s tenant and tier; raises the 400 of the first bad one."""
        sent: dict[bytes, str] = {}
        for name, value in headers:
            if name in HINT_HEADERS and name not in sent:
                sent[name] = value.decode("latin-1")
        return cls(
            workload=request_workload(sent.get(WORKLOAD_HEADER), principal.tenant),
            session=request_session(sent.get(SESSION_HEADER)),
            speculation=request_speculation(sent.get(SPECULATION_HEADER), principal.tenant, principal.tier),
        )
