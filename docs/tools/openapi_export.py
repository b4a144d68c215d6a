"""Writes the gateway's OpenAPI document to ``docs/api/openapi.json``, as the embedded default serves it.

The document is the app's own (``gateway.http.openapi.install_openapi``), built from the embedded fleet and tenants
files without starting anything. ``tests/docs/test_api_document.py`` fails when the committed file drifts from it.

    python -m docs.tools.openapi_export           # rewrite docs/api/openapi.json
    python -m docs.tools.openapi_export --check   # exit 1 when it is stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DOCUMENT = Path(__file__).resolve().parents[1] / "api" / "openapi.json"


def gateway_document() -> dict[str, Any]:
    """The document ``GET /openapi.json`` answers on the embedded default (example model and tiers from the
    embedded fleet and tenants files)."""
    from fleet.clock import ManualClock
    from fleet.config import load_fleet, load_tenants
    from fleet.store.memory import MemoryStore
    from gateway.http.app import create_app
    from gateway.settings import GatewaySettings
    from gateway.wiring import GatewayDeps

    clock = ManualClock()
    app = create_app(
        GatewayDeps(
            GatewaySettings(), store=MemoryStore(clock=clock), clock=clock, fleet=load_fleet(), tenants=load_tenants()
        )
    )
    return app.openapi()


def serialise(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = serialise(gateway_document())
    if "--check" in argv:
        stale = not DOCUMENT.exists() or DOCUMENT.read_text(encoding="utf-8") != text
        if stale:
            print(f"{DOCUMENT} is stale: run python -m docs.tools.openapi_export", file=sys.stderr)
        return 1 if stale else 0
    DOCUMENT.write_text(text, encoding="utf-8")
    print(f"wrote {DOCUMENT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
