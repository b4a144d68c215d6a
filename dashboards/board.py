"""A gearshift dashboard on the SDK's dashboard builder, and its rendering to the JSON Grafana provisions.

The SDK's builder lays panels out on Grafana's 24-column grid and encodes the JSON. One piece is kept by hand:
the SDK's variable model has no ``definition`` field (the query text Grafana shows in the variables list),
so :func:`render` adds it from each query variable's own query. Rendering is deterministic: the same
definitions always give the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.cog import builder as cog
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model

from dashboards.style import datasource_variable

GRID_COLUMNS = 24
Item = cog.Builder[model.Panel] | board.Row
"""A panel (any of the SDK's panel builders) or a row."""


def dashboard(
    uid: str,
    title: str,
    description: str,
    items: Sequence[Item],
    *,
    variables: Sequence[board.QueryVariable] = (),
    links: Sequence[str] = (),
) -> board.Dashboard:
    """The dashboard builder: ``items`` in reading order (ids 1, 2, … in that order), ``links`` the uids of
    related dashboards shown in the header; every dashboard also gets the ``datasource`` variable."""
    built = (
        board.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["gearshift"])
        .timezone("browser")
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .version(1)
        .time("now-1h", "now")
        .with_variable(datasource_variable())
    )
    for variable in variables:
        built.with_variable(variable)
    for uid_linked in links:
        built.link(
            board.DashboardLink(uid_linked)
            .type(model.DashboardLinkType.LINK)
            .url(f"/d/{uid_linked}")
            .as_dropdown(False)
            .target_blank(False)
        )
    for pid, item in enumerate(items, start=1):
        if isinstance(item, board.Row):
            built.with_row(item.id(pid))
        else:
            built.with_panel(_with_id(item, pid))
    return built


def _with_id(panel: cog.Builder[model.Panel], pid: int) -> cog.Builder[model.Panel]:
    panel.build().id_val = pid
    return panel


def render(built: board.Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (no ``id``, so provisioning keys it by ``uid``)."""
    data: dict[str, Any] = json.loads(json.dumps(built.build(), cls=JSONEncoder))
    for variable in data.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            variable["definition"] = variable["query"]["query"]
    return data


def expressions(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """Every (panel title, PromQL expression) of a rendered dashboard, including variable queries."""
    found = [
        (panel["title"], target["expr"])
        for panel in dashboard_json.get("panels", [])
        for target in panel.get("targets", [])
    ]
    for var in dashboard_json.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            found.append((f"variable {var['name']}", var["query"]["query"]))
    return found
