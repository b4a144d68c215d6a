"""Bounded fuzzing of a ``gearshift gateway`` process in front of a simulated worker: schemathesis over the
gateway's OpenAPI schema plus hypothesis-generated hostile chat bodies (``gearshift bench fuzz`` runs longer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.soak.fuzz import CHAT_BODY, fuzz_stack, fuzz_target, openai_error_problem, with_completion_bodies


def test_fuzzing_finds_no_server_error_and_no_malformed_error_body(tmp_path: Path) -> None:
    with fuzz_stack(tmp_path) as target:
        report = fuzz_target(target, max_examples=6, body_examples=60, seed=1)
    assert report.operations >= 10
    assert report.cases >= report.operations
    assert report.bodies == 60
    assert not report.failures, "\n".join(report.lines())


@pytest.mark.parametrize(
    ("status", "body", "bad"),
    [
        (200, b'{"choices": []}', False),
        (400, b'{"error": {"message": "m", "type": "invalid_request_error"}}', False),
        (502, b'{"error": {"message": "m", "type": "api_error"}}', True),
        (400, b"Bad Request", True),
        (404, b'{"detail": "Not Found"}', True),
        (429, b'{"error": {"message": 3, "type": "rate_limit_error"}}', True),
    ],
)
def test_the_fuzz_oracle_flags_server_errors_and_non_openai_error_bodies(status: int, body: bytes, bad: bool) -> None:
    assert (openai_error_problem(status, body) is not None) is bad


def test_completion_bodies_are_added_only_where_the_schema_has_none() -> None:
    doc: dict[str, Any] = {
        "paths": {"/v1/chat/completions": {"post": {}}, "/v1/completions": {"post": {"requestBody": {"x": 1}}}}
    }
    out = with_completion_bodies(doc)
    assert (
        out["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        == CHAT_BODY
    )
    assert out["paths"]["/v1/completions"]["post"]["requestBody"] == {"x": 1}
    assert "requestBody" not in doc["paths"]["/v1/chat/completions"]["post"]
