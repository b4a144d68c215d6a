"""Vendor the LeaderWorkerSet CRD's OpenAPI schema into ``tests/deploy/schemas`` (run by hand when LWS is bumped).

    python -m tests.deploy.vendor_lws_schema leaderworkerset.x-k8s.io_leaderworkersets.yaml v0.10.0

The input is ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml`` of kubernetes-sigs/lws at the
tag named (v0.10.0 is commit 2161f38ff333f9e24d3c44adef7cd5d9787cac00). Descriptions are dropped (they are 90 %
of the file); every other keyword is kept as the API server reads it. ``deploy_lws`` turns it into a strict
JSON Schema.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

SCHEMAS = Path(__file__).parent / "schemas"


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: without_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [without_descriptions(v) for v in node]
    return node


def main(crd_path: str, tag: str) -> None:
    crd = yaml.safe_load(Path(crd_path).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = without_descriptions(version["schema"]["openAPIV3Schema"])
    out = SCHEMAS / f"leaderworkerset-{tag}.json"
    out.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
    print(f"{out}: {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(*sys.argv[1:3])
