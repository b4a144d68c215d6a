"""Optimistic concurrency of the admin API's tenant edits (issue 23, defect 12): a tenant's run-time change carries a
version (``fleet.tenants.TenantChange.version``, 0 before any), ``GET`` answers it as the ``ETag``, and a ``PATCH``
or ``DELETE`` made against a version — ``If-Match: "<version>"`` or a ``version`` field in the body — is refused
when the stored change has moved on: 412 for ``If-Match`` (RFC 9110), 409 ``version_conflict`` for the body field.
The store checks the version in the same atomic step that writes the change (``Store.put_doc_logged``), so two
editors of one version on two replicas cannot both win. Tiers (``PATCH /admin/v1/tiers/{name}``) carry versions the
same way (their ``version`` in ``GET /admin/v1/tiers``; ``If-Match`` or ``version`` on the PATCH). A request with
neither is made against the version this replica last read: a change stored meanwhile by another replica is refused
(409), never silently undone.
"""

from __future__ import annotations

from typing import Any

from fleet.store.keys import DocVersionConflict
from gateway.errors import InvalidRequest, PreconditionFailed, VersionConflict

VERSION_FIELD = "version"
"""The body field that names the version a change is made against (for clients that cannot set headers: the
console's edit form)."""


def etag(version: int) -> str:
    """The strong ``ETag`` of a tenant at ``version``."""
    return f'"{version}"'


def parse_if_match(value: str | None) -> int | None:
    """The version an ``If-Match`` header names; None without one or for ``*`` (any version). A weak tag
    (``W/"3"``) is read as its version; a list or anything else is a 400."""
    if value is None or value.strip() == "*":
        return None
    tag = value.strip().removeprefix("W/")
    inner = tag[1:-1] if len(tag) >= 2 and tag[0] == tag[-1] == '"' else tag
    if not inner.isdigit():
        raise InvalidRequest(f'If-Match: expected one ETag of this API, such as "3", got {value!r}.', param="If-Match")
    return int(inner)


def expected_version(body: dict[str, Any], if_match: str | None) -> tuple[int | None, bool]:
    """The version the change is made against (None: the one last read here), and whether it came from ``If-Match``;
    the body's ``version`` field is taken out of ``body``."""
    from_header = parse_if_match(if_match)
    field = body.pop(VERSION_FIELD, None)
    if field is not None and (not isinstance(field, int) or isinstance(field, bool) or field < 0):
        raise InvalidRequest("tenant: version: must be a non-negative integer (the ETag's).", param=VERSION_FIELD)
    if from_header is not None and field is not None and from_header != field:
        raise InvalidRequest(f"version {field} and If-Match {if_match} name different versions.", param=VERSION_FIELD)
    return (from_header if from_header is not None else field), from_header is not None


def refused(
    name: str, conflict: DocVersionConflict, *, expected: int | None, header: bool, kind: str = "Tenant"
) -> Exception:
    """The error for a change of tenant (or tier: ``kind``) ``name`` the store refused: it names the stored version
    and the one the change was made against."""
    if expected is not None:
        made = f"made against version {conflict.expected}"
    else:
        made = f"made against this replica's copy (version {conflict.expected})"
    message = (
        f"{kind} '{name}' is at version {conflict.found}; the change was {made}: another admin changed it "
        "meanwhile. GET it again (its version) and re-apply the change."
    )
    if header:
        return PreconditionFailed(message, param="If-Match")
    return VersionConflict(message, param=VERSION_FIELD)
