"""The API reference page: the committed OpenAPI document rendered as Markdown, at build time and offline.

An MkDocs hook (``hooks:`` in ``mkdocs.yml``). A page that holds the marker ``<!-- openapi: FILE -->`` gets it
replaced by the operations and schemas of ``FILE`` (a path relative to the page). Nothing is fetched: the page is
plain Markdown tables, so the site needs no JavaScript renderer and no CDN. ``render`` is a pure function of the
document, tested in ``tests/docs/test_api_document.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

MARKER = re.compile(r"<!--\s*openapi:\s*(\S+)\s*-->")

SECTIONS = (
    ("Tenant API", "/v1/", "Called with a tenant's API key (`Authorization: Bearer …`)."),
    ("Admin API", "/admin/", "Called with `GEARSHIFT_ADMIN_KEY` or one of `GEARSHIFT_ADMIN_KEYS`."),
    ("Operations", "/", "Probes and metrics, without a key."),
)
"""Operations are grouped by path prefix, first match wins."""

Schema = dict[str, Any]


def schema_anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def operation_anchor(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", f"{method} {path}".lower()).strip("-")


def _text(value: object) -> str:
    """A table cell: reStructuredText literals as Markdown code, no newline, no bare pipe."""
    return " ".join(str(value).replace("``", "`").split()).replace("|", "\\|")


def type_of(schema: Schema) -> str:
    """A schema's type in a few words; a ``$ref`` links to the schema's section on the page."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{name}](#{schema_anchor(name)})"
    for combinator in ("anyOf", "oneOf", "allOf"):
        if combinator in schema:
            return " or ".join(type_of(part) for part in schema[combinator])
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        return " or ".join(str(k) for k in kind)
    if kind == "array" and "items" in schema:
        return f"array of {type_of(schema['items'])}"
    return str(kind)


def _notes(schema: Schema) -> str:
    notes = [_text(schema["description"])] if "description" in schema else []
    for key, word in (("default", "default"), ("minimum", "≥"), ("maximum", "≤"), ("minItems", "items ≥")):
        if key in schema:
            notes.append(f"{word} `{json.dumps(schema[key])}`")
    return "; ".join(notes)


def _fields(schema: Schema, prefix: str = "") -> list[tuple[str, Schema, bool]]:
    """Every field of an object schema, nested objects and arrays of objects flattened to dotted names."""
    rows: list[tuple[str, Schema, bool]] = []
    required = set(schema.get("required", ()))
    for name, field in schema.get("properties", {}).items():
        rows.append((prefix + name, field, name in required))
        if field.get("type") == "object" and "properties" in field:
            rows.extend(_fields(field, f"{prefix}{name}."))
        items = field.get("items", {})
        if field.get("type") == "array" and "properties" in items:
            rows.extend(_fields(items, f"{prefix}{name}[]."))
    return rows


def _field_table(schema: Schema) -> list[str]:
    rows = ["| field | type | required | notes |", "| --- | --- | --- | --- |"]
    for name, field, required in _fields(schema):
        rows.append(f"| `{name}` | {_text(type_of(field))} | {'yes' if required else ''} | {_notes(field)} |")
    return rows


def _body(operation: Schema) -> list[str]:
    body = operation.get("requestBody")
    if body is None:
        return []
    lines: list[str] = []
    for media, content in body.get("content", {}).items():
        schema = content.get("schema", {})
        needed = "required" if body.get("required") else "optional"
        lines += ["", f"**Request body** (`{media}`, {needed}): {type_of(schema)}"]
        if "properties" in schema:
            lines += ["", *_field_table(schema)]
        if "example" in content:
            lines += ["", "Example:", "", "```json", json.dumps(content["example"], indent=2), "```"]
    return lines


def _parameters(operation: Schema) -> list[str]:
    parameters = operation.get("parameters", [])
    if not parameters:
        return []
    lines = ["", "**Parameters**", "", "| name | in | type | required | notes |", "| --- | --- | --- | --- | --- |"]
    for p in parameters:
        schema = p.get("schema", {})
        notes = _notes({**schema, **({"description": p["description"]} if "description" in p else {})})
        needed = "yes" if p.get("required") else ""
        lines.append(f"| `{p['name']}` | {p['in']} | {_text(type_of(schema))} | {needed} | {notes} |")
    return lines


def _responses(operation: Schema) -> list[str]:
    lines = ["", "**Responses**", "", "| status | meaning | body |", "| --- | --- | --- |"]
    for status, response in operation.get("responses", {}).items():
        media = response.get("content", {})
        body = ", ".join(f"`{kind}` {type_of(c.get('schema', {}))}".rstrip() for kind, c in media.items())
        lines.append(f"| {status} | {_text(response.get('description', ''))} | {_text(body)} |")
    return lines


def _security(operation: Schema, schemes: Schema) -> list[str]:
    names = [name for requirement in operation.get("security", []) for name in requirement]
    if not names:
        return []
    described = ", ".join(f"Bearer `{n}` ({_text(schemes.get(n, {}).get('description', ''))})" for n in names)
    return ["", f"**Auth:** {described}"]


def render_operation(method: str, path: str, operation: Schema, schemes: Schema) -> list[str]:
    heading = f"### `{method.upper()} {path}` {{#{operation_anchor(method, path)}}}"
    lines = [heading, "", _text(operation.get("summary", ""))]
    if operation.get("description"):
        lines += ["", _text(operation["description"])]
    lines += _security(operation, schemes) + _parameters(operation) + _body(operation) + _responses(operation)
    return [*lines, ""]


def render_schema(name: str, schema: Schema) -> list[str]:
    lines = [f"### {name} {{#{schema_anchor(name)}}}", ""]
    if schema.get("description"):
        lines += [_text(schema["description"]), ""]
    if "properties" in schema:
        lines += _field_table(schema)
    else:
        lines.append(f"Type: {type_of(schema)}")
    return [*lines, ""]


def render(document: Schema) -> str:
    """The document's operations, grouped by API, then its schemas, as Markdown."""
    schemes = document.get("components", {}).get("securitySchemes", {})
    grouped: dict[str, list[str]] = {title: [] for title, _, _ in SECTIONS}
    for path, operations in document.get("paths", {}).items():
        title = next(t for t, prefix, _ in SECTIONS if path.startswith(prefix))
        for method, operation in operations.items():
            grouped[title] += render_operation(method, path, operation, schemes)
    info = document.get("info", {})
    lines = [f"OpenAPI {document.get('openapi', '')}, *{info.get('title', '')}* version {info.get('version', '')}.", ""]
    for title, _, intro in SECTIONS:
        if grouped[title]:
            lines += [f"## {title}", "", intro, "", *grouped[title]]
    schemas = document.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name, schema in schemas.items():
            lines += render_schema(name, schema)
    return "\n".join(lines)


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: replace each marker with the rendering of the document it names."""

    def replace(match: re.Match[str]) -> str:
        source = Path(page.file.abs_src_path).parent / match.group(1)
        return render(json.loads(source.read_text(encoding="utf-8")))

    return MARKER.sub(replace, markdown)
