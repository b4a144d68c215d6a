"""dashboards/: the committed JSON is what the generator makes, every panel query is valid PromQL over metric
names the code defines, and the layout fits Grafana's grid."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import build
from dashboards.board import GRID_COLUMNS, expressions
from dashboards.compare import differences
from dashboards.sla import bucket_bounds, sla_rules, threshold
from fleet.config import load_tenants
from gateway.usage.metrics import TPOT, TTFT

from .deploy_contracts import ROOT, exported_series
from .deploy_promql import grafana_to_promql, metric_names, promtool, recorded_names

DASHBOARDS = sorted((ROOT / "dashboards" / "grafana").glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_committed_files_are_what_the_generator_makes(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["--check"]) == 0, capsys.readouterr().err
    assert {p.name for p in DASHBOARDS} == {p.name for p in build.generate(None, objective=0.99) if p.suffix == ".json"}


def test_the_four_dashboards_cover_fleet_speculation_cost_and_tenants() -> None:
    titles = {load(p)["uid"]: [panel["title"] for panel in load(p)["panels"]] for p in DASHBOARDS}
    assert set(titles) == {"gearshift-fleet", "gearshift-speculation", "gearshift-cost", "gearshift-tenants"}
    assert any("Time per output token" in t for t in titles["gearshift-fleet"])
    assert any("Desired vs applied k" in t for t in titles["gearshift-speculation"])
    assert any("Acceptance per draft position" in t for t in titles["gearshift-speculation"])
    assert any("$/Mtok per tenant" in t for t in titles["gearshift-cost"])
    assert any("SLA attainment" in t for t in titles["gearshift-tenants"])


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_query_uses_only_metrics_the_code_defines(path: Path) -> None:
    known = exported_series() | recorded_names()
    found = expressions(load(path))
    assert found
    for title, expr in found:
        names = metric_names(expr)
        assert names or expr.startswith("vector("), f"{title}: selects no metric: {expr}"
        assert names <= known, f"{title}: unknown metrics {sorted(names - known)} in {expr}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_panels_fit_the_grid_without_overlap(path: Path) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in load(path)["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= GRID_COLUMNS, panel["title"]
        covered = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])


@pytest.mark.prometheus
def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    """Each panel query, with Grafana's variables filled in, as a recording rule: promtool parses the PromQL."""
    rules = [
        {"record": f"panel:{path.stem.replace('-', '_')}:{i}", "expr": grafana_to_promql(expr)}
        for path in DASHBOARDS
        for i, (_, expr) in enumerate(expressions(load(path)))
        if not expr.startswith("label_values(")
    ]
    rule_file = tmp_path / "panels.rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    result = promtool("check", "rules", str(rule_file))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(rules)} rules found" in result.stdout


def test_sla_thresholds_are_the_largest_bucket_bounds_within_each_target() -> None:
    for histogram in (TPOT, TTFT):
        bounds = [b for b, _ in bucket_bounds(histogram)]
        for target in (bounds[0], bounds[len(bounds) // 2] * 1.3, bounds[-1] * 2):
            chosen = float(threshold(target, histogram))
            assert chosen <= target
            assert all(b <= chosen or b > target for b in bounds)
        with pytest.raises(ValueError, match="below the smallest bucket"):
            threshold(bounds[0] / 2, histogram)


def test_sla_rules_cover_every_tier_target_and_reject_a_bad_objective() -> None:
    tenants = load_tenants()
    rules = [r for g in sla_rules(tenants)["groups"] for r in g["rules"]]
    targets = {(n, slo) for n, t in tenants.tiers.items() for slo in ("tpot", "ttft") if getattr(t, f"{slo}_target_s")}
    recorded = {
        (r["expr"].split('tier="')[1].split('"')[0], r["labels"]["slo"])
        for r in rules
        if "record" in r and "labels" in r
    }
    assert recorded == targets
    with pytest.raises(ValueError, match="objective"):
        sla_rules(tenants, objective=1.0)


def test_the_content_comparison_sees_a_changed_query_title_unit_or_position() -> None:
    """dashboards.compare (used to check the SDK port panel for panel) reports what a viewer would see change."""
    board = load(ROOT / "dashboards" / "grafana" / "gearshift-cost.json")
    assert differences(board, copy.deepcopy(board)) == []
    panel = next(i for i, p in enumerate(board["panels"]) if p["type"] == "timeseries")
    edits: dict[str, Callable[[dict[str, Any]], None]] = {
        "expr": lambda p: p["targets"][0].update(expr="up"),
        "legendFormat": lambda p: p["targets"][0].update(legendFormat="{{job}}"),
        "title": lambda p: p.update(title="Renamed"),
        "unit": lambda p: p["fieldConfig"]["defaults"].update(unit="bytes"),
        "gridPos": lambda p: p["gridPos"].update(w=6),
        "stacking": lambda p: p["fieldConfig"]["defaults"]["custom"]["stacking"].update(mode="percent"),
    }
    for key, edit in edits.items():
        changed = copy.deepcopy(board)
        edit(changed["panels"][panel])
        assert any(key in line for line in differences(board, changed)), key
    shorter = copy.deepcopy(board)
    shorter["panels"].pop()
    assert differences(board, shorter)
