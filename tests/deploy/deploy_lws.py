"""The LeaderWorkerSet schema, strict: the CRD's OpenAPI schema vendored from kubernetes-sigs/lws
(``schemas/leaderworkerset-<tag>.json``, made by ``vendor_lws_schema``) as a JSON Schema that, like
``kubernetes_validate``'s strict schemas, refuses unknown fields.

The API server prunes unknown fields of a structural CRD silently, so a misspelt LWS field would vanish on
``kubectl apply``; here it fails. ``kubernetes_validate`` knows no CRDs, hence this module.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema

LWS_VERSION = "v0.10.0"
"""The LeaderWorkerSet release whose CRD the manifests are validated against (the oldest they target)."""
SCHEMA = Path(__file__).parent / "schemas" / f"leaderworkerset-{LWS_VERSION}.json"


def strict(node: Any) -> Any:
    """The OpenAPI v3 structural schema as JSON Schema: objects with declared properties allow no others (unless
    ``x-kubernetes-preserve-unknown-fields``), and ``nullable`` admits null."""
    if isinstance(node, list):
        return [strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict(v) for k, v in node.items()}
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def lws_validator() -> jsonschema.protocols.Validator:
    schema = strict(json.loads(SCHEMA.read_text()))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def validate_lws(resource: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` (the first, deepest error) if ``resource`` is not a valid LWS."""
    assert resource["apiVersion"] == "leaderworkerset.x-k8s.io/v1", resource["apiVersion"]
    error = jsonschema.exceptions.best_match(lws_validator().iter_errors(resource))
    if error is not None:
        raise error
