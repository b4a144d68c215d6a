"""gearshift's house style on grafana-foundation-sdk's typed builders: the few panel kinds the dashboards use.

Each factory returns the SDK's own builder, pre-set to the house style, so a dashboard definition goes on
chaining the SDK's methods (``.description(…)``, ``.span(8)``, ``.decimals(2)``). Every query targets the
``${datasource}`` variable, so one file works with any Prometheus data source. Panels are 12 columns wide and
8 high unless a definition says otherwise; the SDK's dashboard builder lays them out on the 24-column grid in
the order given, wrapping when a line is full.
"""

from __future__ import annotations

from typing import TypeVar

from grafana_foundation_sdk.builders import bargauge, common, prometheus, stat, timeseries
from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.models import common as viz
from grafana_foundation_sdk.models import dashboard as model

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
WIDTH = 12
HEIGHT = 8
BASE_COLOUR = "green"
Viz = TypeVar("Viz", timeseries.Panel, stat.Panel, bargauge.Panel)


def query(expr: str, legend: str = "", *, instant: bool = False) -> prometheus.Dataquery:
    """One PromQL query; ``legend`` is Grafana's legend format (``{{worker}}``), Grafana's own when empty."""
    built = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DATASOURCE)
    return built.instant() if instant else built.range()


def _thresholds(steps: tuple[tuple[float, str], ...]) -> board.ThresholdsConfig:
    """Absolute thresholds: the base colour, then each (value, colour) step above it."""
    base = [model.Threshold(value=None, color=BASE_COLOUR)]
    above = [model.Threshold(value=value, color=colour) for value, colour in steps]
    return board.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(base + above)


def _targets(panel: Viz, queries: tuple[prometheus.Dataquery, ...]) -> Viz:
    """The queries as the panel's targets, with Grafana's reference ids A, B, …"""
    for index, target in enumerate(queries):
        panel.with_target(target.ref_id(chr(ord("A") + index)))
    return panel


def _framed(panel: Viz, title: str, unit: str, thresholds: tuple[tuple[float, str], ...]) -> Viz:
    """The house frame of every panel: its title, the data source variable, the default size, unit, thresholds."""
    return (
        panel.title(title)
        .description("")
        .datasource(DATASOURCE)
        .span(WIDTH)
        .height(HEIGHT)
        .unit(unit)
        .thresholds(_thresholds(thresholds))
    )


def timeseries_panel(
    title: str,
    *queries: prometheus.Dataquery,
    unit: str = "short",
    stacked: bool = False,
    thresholds: tuple[tuple[float, str], ...] = (),
) -> timeseries.Panel:
    """Lines over time, stacked or not, with a table legend of mean, max and last."""
    panel = (
        _framed(timeseries.Panel(), title, unit, thresholds)
        .color_scheme(board.FieldColor().mode(model.FieldColorModeId.PALETTE_CLASSIC))
        .draw_style(viz.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(10)
        .show_points(viz.VisibilityMode.NEVER)
        .span_nulls(True)
        .stacking(
            common.StackingConfig().mode(viz.StackingMode.NORMAL if stacked else viz.StackingMode.NONE).group("A")
        )
        .legend(
            common.VizLegendOptions()
            .display_mode(viz.LegendDisplayMode.TABLE)
            .placement(viz.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common.VizTooltipOptions().mode(viz.TooltipDisplayMode.MULTI).sort(viz.SortOrder.DESCENDING))
    )
    return _targets(panel, queries)


LastValue = TypeVar("LastValue", stat.Panel, bargauge.Panel)


def _last_value_panel(
    panel: LastValue,
    title: str,
    queries: tuple[prometheus.Dataquery, ...],
    unit: str,
    thresholds: tuple[tuple[float, str], ...],
) -> LastValue:
    """A panel of each series' last value, coloured by its thresholds (a stat, a bar gauge)."""
    last = common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
    styled = (
        _framed(panel, title, unit, thresholds)
        .color_scheme(board.FieldColor().mode(model.FieldColorModeId.THRESHOLDS))
        .reduce_options(last)
        .orientation(viz.VizOrientation.AUTO)
    )
    return _targets(styled, queries)


def stat_panel(
    title: str, *queries: prometheus.Dataquery, unit: str = "short", thresholds: tuple[tuple[float, str], ...] = ()
) -> stat.Panel:
    """One big number: the last value, coloured by thresholds."""
    return _last_value_panel(stat.Panel(), title, queries, unit, thresholds)


def bargauge_panel(
    title: str, *queries: prometheus.Dataquery, unit: str = "short", thresholds: tuple[tuple[float, str], ...] = ()
) -> bargauge.Panel:
    """One bar per series: the last value, coloured by thresholds."""
    return _last_value_panel(bargauge.Panel(), title, queries, unit, thresholds)


def row(title: str) -> board.Row:
    """A section header spanning the whole grid (expanded)."""
    return board.Row(title).collapsed(False)


def label_variable(name: str, label: str, values_of: str) -> board.QueryVariable:
    """A multi-select variable (with All) over a label's values: ``values_of`` is ``label_values(metric, label)``."""
    return (
        board.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": values_of, "refId": f"{name}-values"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(selected=True, text=["All"], value=["$__all"]))
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


def datasource_variable() -> board.DatasourceVariable:
    """The Prometheus data source every query targets (``${datasource}``)."""
    return (
        board.DatasourceVariable("datasource")
        .label("Prometheus")
        .type("prometheus")
        .current(model.VariableOption(selected=True, text="Prometheus", value="prometheus"))
        .hide(model.VariableHide.DONT_HIDE)
    )
