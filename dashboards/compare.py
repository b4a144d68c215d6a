"""Compare two sets of dashboards by content, panel for panel: ``python -m dashboards.compare --against REV``.

Two renderings of the same dashboards may differ in bytes (key order, an SDK's defaults made explicit) and
still show the same thing. :func:`content` keeps what a viewer sees and what Prometheus is asked: per
dashboard its uid, title, description, tags, refresh, time range, variables and links; per panel its id,
kind, title, description, grid position, queries (expression, legend, instant, reference id, data source),
unit, decimals, thresholds, colour mode, stacking and legend. ``--against REV`` compares the committed JSON
at a git revision with what the code generates now (e.g. across an SDK upgrade) and lists every difference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from dashboards.board import render
from dashboards.definitions import all_dashboards
from fleet.config import load_tenants

GRAFANA_DIR = "dashboards/grafana"
DEFAULT_LEGEND = {"displayMode": "list", "placement": "bottom", "calcs": []}
"""Grafana's legend when a panel's options name none (the SDK writes it out for bar gauges)."""


def _target(target: dict[str, Any]) -> dict[str, Any]:
    return {
        "refId": target["refId"],
        "expr": target["expr"],
        "legendFormat": target.get("legendFormat"),
        "instant": bool(target.get("instant")),
        "datasource": target.get("datasource"),
    }


def _panel(panel: dict[str, Any]) -> dict[str, Any]:
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    options = panel.get("options", {})
    return {
        "id": panel["id"],
        "type": panel["type"],
        "title": panel["title"],
        "description": panel.get("description", ""),
        "gridPos": panel["gridPos"],
        "collapsed": panel.get("collapsed"),
        "targets": [_target(t) for t in panel.get("targets", [])],
        "unit": defaults.get("unit"),
        "decimals": defaults.get("decimals"),
        "thresholds": defaults.get("thresholds"),
        "colour": defaults.get("color"),
        "stacking": defaults.get("custom", {}).get("stacking", {}).get("mode"),
        "legend": {k: options.get("legend", DEFAULT_LEGEND).get(k) for k in DEFAULT_LEGEND},
        "tooltip": options.get("tooltip"),
        "reduce": options.get("reduceOptions", {}).get("calcs"),
    }


def _variable(variable: dict[str, Any]) -> dict[str, Any]:
    query = variable.get("query")
    return {
        "name": variable["name"],
        "type": variable["type"],
        "label": variable.get("label"),
        "query": query.get("query") if isinstance(query, dict) else query,
        "definition": variable.get("definition"),
        "datasource": variable.get("datasource"),
        "multi": bool(variable.get("multi")),
        "includeAll": bool(variable.get("includeAll")),
        "allValue": variable.get("allValue"),
        "refresh": variable.get("refresh"),
        "sort": variable.get("sort"),
        "current": {k: variable.get("current", {}).get(k) for k in ("text", "value")},
    }


def content(dashboard: dict[str, Any]) -> dict[str, Any]:
    """What a viewer sees of ``dashboard`` (Grafana JSON), without the bytes that do not show."""
    return {
        "uid": dashboard["uid"],
        "title": dashboard["title"],
        "description": dashboard.get("description", ""),
        "tags": dashboard.get("tags", []),
        "refresh": dashboard.get("refresh"),
        "time": dashboard.get("time"),
        "graphTooltip": dashboard.get("graphTooltip"),
        "variables": [_variable(v) for v in dashboard.get("templating", {}).get("list", [])],
        "links": [(link["title"], link.get("url")) for link in dashboard.get("links", [])],
        "panels": [_panel(p) for p in dashboard.get("panels", [])],
    }


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every difference in content between two renderings of one dashboard, one line each."""
    before, after = content(old), content(new)
    found = [
        f"{before['uid']}: {key}: {before[key]!r} != {after[key]!r}"
        for key in before
        if key != "panels" and before[key] != after[key]
    ]
    if len(before["panels"]) != len(after["panels"]):
        found.append(f"{before['uid']}: {len(before['panels'])} panels != {len(after['panels'])}")
    for was, now in zip(before["panels"], after["panels"], strict=False):
        found += [
            f"{before['uid']} / {was['title']}: {key}: {was[key]!r} != {now[key]!r}"
            for key in was
            if was[key] != now[key]
        ]
    return found


def committed_at(revision: str, uid: str) -> dict[str, Any]:
    """The dashboard ``uid`` as committed at git ``revision``."""
    text = subprocess.run(
        ["git", "show", f"{revision}:{GRAFANA_DIR}/{uid}.json"], check=True, capture_output=True, text=True
    ).stdout
    data: dict[str, Any] = json.loads(text)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.compare", description=__doc__)
    parser.add_argument("--against", required=True, help="git revision whose committed dashboards to compare")
    args = parser.parse_args(argv)
    generated = [render(board) for board in all_dashboards(load_tenants())]
    found: list[str] = []
    for new in generated:
        old = committed_at(args.against, new["uid"])
        found += differences(old, new)
        panels = content(new)["panels"]
        print(f"{new['uid']}: {len(panels)} panels, {sum(len(p['targets']) for p in panels)} queries compared")
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
