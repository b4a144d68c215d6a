"""The OpenAPI document of the gateway (served at ``/openapi.json``).

The completion routes are served by ``gateway.http.entry`` outside FastAPI's router and read their bodies as raw
bytes (no per-request pydantic model), so their operations — request schemas included — are declared here for
the document only; they cost nothing at run time. Every route documents the OpenAI error object, and the
tenant and admin APIs their Bearer scheme. Each completion body carries an example request for the fleet's
first model, so a client generator or a fuzzer (schemathesis) has one request that reaches a worker; the admin
API's tenant bodies list the tenants file's tiers as the only ``tier`` values.
"""

from __future__ import annotations

import copy
from collections.abc import Collection
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """The OpenAI error object every error response carries."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (400, "Invalid request"),
        (401, "Missing or wrong API key"),
        (403, "Model not allowed for this tenant, or the tenant is suspended"),
        (404, "Unknown model or resource"),
        (413, "Body too large"),
        (429, "A tenant limit (rpm, tpm, concurrency, budget) refused the request; see Retry-After"),
        (502, "The worker failed"),
        (503, "No worker available, or the shared store is away"),
        (504, "The worker timed out"),
    )
}

_COMMON = {
    "model": {"type": "string"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1},
    "n": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number"},
}


def _body(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "properties": {**_COMMON, **properties}}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


CHAT_BODY = _body(
    ["model", "messages"],
    {
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["role"],
                "properties": {"role": {"type": "string"}, "content": {"type": ["string", "array", "null"]}},
            },
        }
    },
)
TEXT_BODY = _body(["model", "prompt"], {"prompt": {"type": ["string", "array"]}})
RESPONSES_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model", "input"],
                    "properties": {
                        "model": {"type": "string"},
                        "input": {"type": ["string", "array"], "items": {"type": "object"}},
                        "instructions": {"type": "string"},
                        "max_output_tokens": {"type": "integer", "minimum": 1},
                        "stream": {"type": "boolean"},
                        "temperature": {"type": "number"},
                        "tools": {"type": "array", "items": {"type": "object"}},
                    },
                }
            }
        },
    }
}
"""OpenAI's Responses API body (``gateway.upstream.responses``): the fields the gateway reads and the common ones."""


EXAMPLES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16},
    "/v1/completions": {"prompt": "Once upon a time", "max_tokens": 16},
    "/v1/responses": {"input": "Hello!", "max_output_tokens": 16},
}
"""Each completion operation's example request, less its ``model``."""


HEADER_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "x-gearshift-speculation",
        "in": "header",
        "required": False,
        "description": "The request's speculation mode, over its tier's: off (only workers started without a "
        "drafter), fast (the highest k that meets the tier's TPOT target) or auto. Only values the tenant's "
        "policy lists (speculation_header) are accepted; any other gets 400 header_not_allowed.",
        "schema": {"type": "string", "enum": ["auto", "off", "fast"]},
    },
    {
        "name": "x-gearshift-workload",
        "in": "header",
        "required": False,
        "description": "The request's workload (chat, maths, code …): with the tier, its traffic class in the "
        "fleet plan. Default: the tenant's workload.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    },
    {
        "name": "x-gearshift-session",
        "in": "header",
        "required": False,
        "description": "The client's session id (1-128 printable ASCII characters), kept in the usage ledger.",
        "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,128}$"},
    },
]
"""The gateway's own request headers on the completion routes (never sent on to the worker)."""


def _completion(operation_id: str, summary: str, body: dict[str, Any]) -> dict[str, Any]:
    """A completion operation as FastAPI would document a route with ``body`` and ``ERROR_RESPONSES``."""
    error_schema = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    responses: dict[str, Any] = {
        "200": {"description": "Successful Response", "content": {"application/json": {"schema": {}}}},
        **{
            str(status): {"description": r["description"], "content": error_schema}
            for status, r in ERROR_RESPONSES.items()
        },
    }
    operation = {"summary": summary, "operationId": operation_id, "parameters": HEADER_PARAMETERS, **body}
    return {"post": {**operation, "responses": responses}}


COMPLETION_PATHS = {
    "/v1/chat/completions": _completion("chat_completions_v1_chat_completions_post", "Chat Completions", CHAT_BODY),
    "/v1/completions": _completion("completions_v1_completions_post", "Completions", TEXT_BODY),
    "/v1/responses": _completion("responses_v1_responses_post", "Responses", RESPONSES_BODY),
}


def _enumerate_tiers(paths: dict[str, Any], tiers: Collection[str]) -> None:
    """Make the ``tier`` of the admin API's tenant bodies an enum of the tenants file's tiers (fixed while the
    gateway runs), so that a client generator or a fuzzer sends tiers the gateway accepts."""
    for path, operations in paths.items():
        if not path.startswith("/admin/v1/tenants"):
            continue
        for operation in operations.values():
            media = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
            tier = media.get("schema", {}).get("properties", {}).get("tier")
            if tier is not None:
                tier["enum"] = sorted(tiers)


def install_openapi(app: FastAPI, *, example_model: str, tiers: Collection[str]) -> None:
    """Generate the document once, adding the completion operations (their examples for ``example_model``),
    the tenants file's ``tiers`` as the tenant bodies' choices, and the Bearer scheme to the tenant and admin
    routes."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)  # a new tree: ours
            _enumerate_tiers(schema["paths"], tiers)
            completions = copy.deepcopy(COMPLETION_PATHS)
            for path, example in EXAMPLES.items():
                media = completions[path]["post"]["requestBody"]["content"]["application/json"]
                media["example"] = {"model": example_model, **example}
            schema["paths"] = {**completions, **schema["paths"]}
            schema.setdefault("components", {})["securitySchemes"] = {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "A tenant's API key"},
                "adminKey": {"type": "http", "scheme": "bearer", "description": "GEARSHIFT_ADMIN_KEY"},
            }
            for path, operations in schema["paths"].items():
                scheme = "adminKey" if path.startswith("/admin/") else "apiKey" if path.startswith("/v1/") else None
                for operation in operations.values():
                    if scheme is not None:
                        operation["security"] = [{scheme: []}]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
