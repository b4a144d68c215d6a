"""HTML form fields → the admin API's JSON bodies. A blank field means "no value" (``null``: no limit, no
target); validation is the admin API's own (the tenants file's pydantic models), so an error names the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

TENANT_FIELDS = ("tier", "rpm", "tpm", "max_concurrency", "budget_usd", "budget_period", "workload")
TIER_FIELDS = ("priority", "ttft_target_s", "tpot_target_s", "speculation", "prefer", "brownout_max_tokens")


def parse_form(body: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body; a repeated field keeps its first value."""
    return {name: values[0] for name, values in parse_qs(body.decode(), keep_blank_values=True).items()}


def _blank_is_none(form: Mapping[str, str], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: (form[name].strip() or None) for name in names if name in form}


def tenant_body(form: Mapping[str, str], *, create: bool) -> dict[str, Any]:
    """A tenant body for ``POST /admin/v1/tenants`` (``create``, with the ``id``) or ``PATCH …/{id}`` (with the
    ``version`` the form was rendered at: saving over another admin's change is refused, not done)."""
    body = _blank_is_none(form, TENANT_FIELDS)
    if "models" in form:
        body["models"] = [m.strip() for m in form["models"].split(",") if m.strip()] or ["*"]
    if create:
        body["id"] = form.get("id", "").strip()
    elif form.get("version", "").strip().isdigit():
        body["version"] = int(form["version"])
    return body


def tier_body(form: Mapping[str, str]) -> dict[str, Any]:
    """A tier body for ``PATCH /admin/v1/tiers/{name}``; an unticked ``sheddable`` box is False; with the
    ``version`` the form was rendered at."""
    body = {**_blank_is_none(form, TIER_FIELDS), "sheddable": "sheddable" in form}
    if form.get("version", "").strip().isdigit():
        body["version"] = int(form["version"])
    return body
