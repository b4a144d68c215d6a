"""The store's key layout, safe on Redis Cluster: every key that one Lua script or transaction touches carries
the same hash tag (``{…}``), so it lives in one slot (on a single Redis the tags are just part of the name).

``P`` is the prefix (``gearshift:`` by default; it may not contain ``{`` or ``}``):

- ``P{t:<scope>}:limit:<kind>``: a limit or spend counter. The caller names limits ``<kind>:<scope>``
  (``rpm:acme``, ``tpm:acme``, ``concurrency:acme``, ``spend:acme``): the scope is the tenant, so a request's
  limits share its tenant's slot; ``settled:acme`` holds the settle ids applied recently (``Store.settle``). A
  name without ``:`` has the empty scope. One ``admit`` or ``settle`` call must keep to one scope
  (``single_scope``); both stores refuse a call that mixes them.
- ``P{t:<tenant>}:ledger:stream|index|rollup|ids``: the tenant's ledger (see ``fleet.store.redis``), and
  ``P{ledger}:tenants``, the set of tenants with a ledger (for fleet-wide reads).
- ``P{workers}:ids`` and ``P{workers}:state:<id>``: the worker registry; ``P{ejected}:until|reason``: ejections;
  ``P{lease:<name>}``: one lease per tag; ``P{apikey}:digest|id|revoked``: run-time API keys; ``P{replicas}``:
  the gateway replica registry; ``P{doc:<collection>}:ids|doc:<id>``: shared documents (a collection per slot);
  ``P{log:<name>}``: an append-only log (a sorted set by time), except a log written together with a collection's
  documents (``LOG_SLOTS``), which is ``P{doc:<collection>}:log:<name>``, in that collection's slot.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Final


class StoreMisconfigured(RuntimeError):
    """The store is not what the settings say; the message names the setting to change."""


class ScopeMismatch(ValueError):
    """One store call named limits of more than one scope (they could live on different cluster nodes)."""


class DocVersionConflict(RuntimeError):
    """A document write expected another version than the stored one (``Store.put_doc_logged``); nothing was
    written. ``found``: the stored document's ``version`` (0 when there is none)."""

    def __init__(self, found: int, expected: int) -> None:
        super().__init__(f"the document is at version {found}, the write expected {expected}")
        self.found = found
        self.expected = expected


def doc_version(body: str | None) -> int:
    """The top-level integer ``version`` of a stored JSON document; 0 for none, a document without one, or text that
    is not a JSON object (the same rule as the Redis script's)."""
    if body is None:
        return 0
    try:
        found = json.loads(body)
    except ValueError:
        return 0
    version = found.get("version") if isinstance(found, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else 0


LOG_SLOTS: Final[Mapping[str, str]] = {"admin-audit": "tenants"}
"""Log → the document collection it is written together with (``Store.put_doc_logged``, one transaction): the log
lives in that collection's slot. The admin audit trail (``gateway.usage.audit``) is written with each run-time tenant
or tier change (``fleet.tenants.COLLECTION``), so a change and its entry are one write (issue 23)."""


def log_collection(log: str, collection: str) -> None:
    """Raise ``ScopeMismatch`` unless ``log`` is written together with ``collection`` (``LOG_SLOTS``)."""
    if LOG_SLOTS.get(log) != collection:
        raise ScopeMismatch(f"log {log!r} does not live with collection {collection!r} (fleet.store.keys.LOG_SLOTS)")


def spend_key(tenant: str) -> str:
    """The limit name of ``tenant``'s spend counter (USD, all time), which the ledger adds each new record's cost to."""
    return f"spend:{tenant}"


def settled_key(scope: str) -> str:
    """The limit name of the set of settle ids applied recently in ``scope`` (``Store.settle``)."""
    return f"settled:{scope}"


def scope_of(name: str) -> str:
    """The scope of a limit name ``<kind>:<scope>`` (``rpm:acme`` → ``acme``; ``tpm`` → ``""``)."""
    return name.partition(":")[2]


def single_scope(names: Iterable[str]) -> None:
    """Raise ``ScopeMismatch`` unless every limit name in ``names`` has the same scope."""
    scopes = {scope_of(n) for n in names}
    if len(scopes) > 1:
        raise ScopeMismatch(f"one store call must keep to one limit scope, got {sorted(scopes)}")


SCHEMA_VERSION = 2
"""Version of the key layout and record formats under a prefix (issue 27): a store written by a newer gearshift
(a higher version) is refused at start rather than misread; an older one is upgraded by ``RedisStore.verify``.
Raise it with every change that an older gearshift would misread, with the upgrade step beside it.

- 1: the release of 9e2bbd5.
- 2: the admin-audit log in the tenants collection's slot (``LOG_SLOTS``, d8ccdd2) and run-time tenant documents
  carrying ``version`` (26c390f) and ``tenant.budget_period`` (3ff30d8). Version 1 ignores every tenant document
  this layout writes (its ``TenantChange`` forbids the new fields: a tenant suspended or limited at run time would
  be served unchanged by a version-1 gateway) and never reads the audit log's new key. Upgrade from 1: no step;
  version 2 reads version-1 data as it is (the log's old key is merged on read, ``KeyLayout.legacy_log``; a document
  without ``version`` reads as version 0, without ``budget_period`` as ``total``)."""


class KeyLayout:
    """Physical Redis keys under ``prefix``."""

    __slots__ = ("_p",)

    def __init__(self, prefix: str) -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"the key prefix may not contain '{{' or '}}' (Redis Cluster hash tags): {prefix!r}")
        self._p = prefix

    def limit(self, name: str) -> str:
        kind, _, scope = name.partition(":")
        return f"{self._p}{{t:{scope}}}:limit:{kind}"

    def ledger(self, tenant: str, part: str) -> str:
        """``part``: ``stream`` (append order), ``index`` (by time), ``rollup`` or ``ids`` (request ids)."""
        return f"{self._p}{{t:{tenant}}}:ledger:{part}"

    @property
    def prefix(self) -> str:
        return self._p

    def schema(self) -> str:
        """The prefix's ``SCHEMA_VERSION`` (a string of digits)."""
        return f"{self._p}{{schema}}:version"

    def ledger_tenants(self) -> str:
        return f"{self._p}{{ledger}}:tenants"

    def workers(self) -> str:
        return f"{self._p}{{workers}}:ids"

    def worker_state_prefix(self) -> str:
        return f"{self._p}{{workers}}:state:"

    def ejected(self, part: str) -> str:
        """``part``: ``until`` or ``reason``."""
        return f"{self._p}{{ejected}}:{part}"

    def lease(self, name: str) -> str:
        return f"{self._p}{{lease:{name}}}"

    def api_keys(self, part: str) -> str:
        """``part``: ``digest``, ``id`` or ``revoked``."""
        return f"{self._p}{{apikey}}:{part}"

    def doc_ids(self, collection: str) -> str:
        return f"{self._p}{{doc:{collection}}}:ids"

    def doc_prefix(self, collection: str) -> str:
        return f"{self._p}{{doc:{collection}}}:doc:"

    def log(self, name: str) -> str:
        collection = LOG_SLOTS.get(name)
        if collection is not None:
            return f"{self.doc_ids(collection).removesuffix(':ids')}:log:{name}"
        return f"{self._p}{{log:{name}}}"

    def legacy_log(self, name: str) -> str | None:
        """Where a log of ``LOG_SLOTS`` lived before it moved to its collection's slot (read, never written: entries
        from before the move, or from a gateway one minor version older); None for any other log."""
        return f"{self._p}{{log:{name}}}" if name in LOG_SLOTS else None

    def replicas(self) -> str:
        return f"{self._p}{{replicas}}"
