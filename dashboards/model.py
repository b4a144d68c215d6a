"""A small model of Grafana dashboards, rendered to the JSON Grafana provisions (schemaVersion 39).

Panels are laid out on Grafana's 24-column grid in the order given, ``width`` columns each, wrapping to a new
line when a row is full. Every query targets the ``${datasource}`` variable, so one file works with any
Prometheus data source. Rendering is deterministic: the same definitions always give the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24
SCHEMA_VERSION = 39


@dataclass(frozen=True)
class Query:
    """One PromQL query of a panel; ``legend`` is Grafana's legend format (``{{worker}}``)."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    """A panel: ``kind`` is a Grafana panel type (timeseries, stat, table, bargauge); ``unit`` a Grafana unit."""

    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12
    height: int = 8
    stacked: bool = False
    decimals: int | None = None
    thresholds: tuple[tuple[float, str], ...] = ()
    """Steps above the base (green) colour: (value, colour)."""


@dataclass(frozen=True)
class Row:
    """A collapsible section header spanning the whole grid."""

    title: str


@dataclass(frozen=True)
class Variable:
    """A query variable over a label's values (``label_values(metric, label)``), multi-select with All."""

    name: str
    label: str
    query: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    items: tuple[Panel | Row, ...]
    variables: tuple[Variable, ...] = ()
    tags: tuple[str, ...] = ("gearshift",)
    refresh: str = "10s"
    time_from: str = "now-1h"
    links: tuple[str, ...] = field(default=())
    """Uids of related dashboards, shown as links in the header."""


def _target(query: Query, ref: str) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "expr": query.expr,
        "legendFormat": query.legend or "__auto",
        "instant": query.instant,
        "range": not query.instant,
        "refId": ref,
    }


def _field_config(panel: Panel) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": colour, "value": value} for value, colour in panel.thresholds]
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "thresholds": {"mode": "absolute", "steps": steps},
        "color": {"mode": "thresholds" if panel.kind in ("stat", "bargauge") else "palette-classic"},
    }
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    if panel.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": True,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
    return {"defaults": defaults, "overrides": []}


def _options(panel: Panel) -> dict[str, Any]:
    if panel.kind == "timeseries":
        return {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max", "lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    if panel.kind in ("stat", "bargauge"):
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "orientation": "auto"}
    return {"showHeader": True}


def _panel_json(panel: Panel, pid: int, pos: dict[str, int]) -> dict[str, Any]:
    refs = [chr(ord("A") + i) for i in range(len(panel.queries))]
    body: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": pos,
        "targets": [_target(q, ref) for q, ref in zip(panel.queries, refs, strict=True)],
        "fieldConfig": _field_config(panel),
        "options": _options(panel),
    }
    if panel.kind == "table":
        body["transformations"] = [{"id": "merge", "options": {}}]
    return body


def _layout(items: tuple[Panel | Row, ...]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    x = y = line_height = 0
    for pid, item in enumerate(items, start=1):
        if isinstance(item, Row):
            y += line_height
            x = line_height = 0
            panels.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": item.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y},
                    "panels": [],
                }
            )
            y += 1
            continue
        if x + item.width > GRID_COLUMNS:
            y += line_height
            x = line_height = 0
        panels.append(_panel_json(item, pid, {"h": item.height, "w": item.width, "x": x, "y": y}))
        x += item.width
        line_height = max(line_height, item.height)
    return panels


def _variable_json(var: Variable) -> dict[str, Any]:
    return {
        "name": var.name,
        "label": var.label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": var.query, "refId": f"{var.name}-values"},
        "definition": var.query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {"selected": True, "text": "Prometheus", "value": "prometheus"},
        "hide": 0,
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (no ``id``, so provisioning keys it by ``uid``)."""
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": dashboard.refresh,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": dashboard.time_from, "to": "now"},
        "templating": {"list": [_datasource_variable(), *(_variable_json(v) for v in dashboard.variables)]},
        "annotations": {"list": []},
        "links": [
            {"type": "link", "title": uid, "url": f"/d/{uid}", "asDropdown": False, "targetBlank": False}
            for uid in dashboard.links
        ],
        "panels": _layout(dashboard.items),
    }


def expressions(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL expression) of a rendered dashboard, including variable queries."""
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard_json.get("panels", [])
        for target in panel.get("targets", [])
    ]
    for var in dashboard_json.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            found.append((f"variable {var['name']}", var["definition"]))
    return found
