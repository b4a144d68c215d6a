"""The API reference: the committed OpenAPI document is the one the gateway serves, and the page renders all of it."""

from __future__ import annotations

import json
import re
from typing import Any

from docs.tools import openapi_export, openapi_page


def _committed() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(openapi_export.DOCUMENT.read_text(encoding="utf-8"))
    return document


def test_the_committed_document_is_the_one_the_gateway_serves() -> None:
    assert _committed() == openapi_export.gateway_document(), (
        "docs/api/openapi.json drifted from the app: run python -m docs.tools.openapi_export"
    )


def test_the_page_has_a_section_for_every_operation_and_schema() -> None:
    document = _committed()
    markdown = openapi_page.render(document)
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", markdown))
    for path, operations in document["paths"].items():
        for method in operations:
            assert openapi_page.operation_anchor(method, path) in anchors, f"{method.upper()} {path} not rendered"
    for name in document["components"]["schemas"]:
        assert openapi_page.schema_anchor(name) in anchors, f"schema {name} not rendered"
    assert len(anchors) == sum(map(len, document["paths"].values())) + len(document["components"]["schemas"])


def test_every_schema_link_on_the_page_has_its_section() -> None:
    markdown = openapi_page.render(_committed())
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", markdown))
    links = set(re.findall(r"\]\(#([a-z0-9-]+)\)", markdown))
    assert links, "the error responses link to the ErrorBody schema"
    assert links <= anchors


def test_a_request_body_lists_nested_fields_and_its_example() -> None:
    document = _committed()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    lines = openapi_page.render_operation("post", "/v1/chat/completions", chat, {})
    text = "\n".join(lines)
    assert "| `messages[].role` | string | yes |" in text
    example = chat["requestBody"]["content"]["application/json"]["example"]
    assert json.dumps(example, indent=2) in text


def test_the_marker_is_replaced_by_the_rendering_of_the_file_it_names(tmp_path: Any) -> None:
    (tmp_path / "doc.json").write_text(json.dumps(_committed()), encoding="utf-8")
    page = type("Page", (), {"file": type("File", (), {"abs_src_path": str(tmp_path / "index.md")})()})()
    out = openapi_page.on_page_markdown("before\n<!-- openapi: doc.json -->\nafter", page=page, config=None, files=None)
    assert out.startswith("before\nOpenAPI ")
    assert out.endswith("\nafter")
    assert "### `POST /v1/chat/completions`" in out
