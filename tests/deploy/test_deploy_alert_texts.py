"""Alert texts have one source: ``deploy/prometheus/rules``. The Prometheus Operator's copy and the promtool
unit tests' expectations must say the same, and the no-leader alert and its runbook must quote the start-up
table the launcher actually writes (issue 27: both still quoted the table from before ``fleet.fallback``)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from fleet.config import load_fleet
from fleet.perf import load_profile
from workers.vllm.launcher import worker_gear_plan

from .deploy_contracts import ROOT
from .deploy_promql import rules

KIMI_FLEET = ROOT / "deploy" / "fleets" / "kimi-k3-dspark.yaml"
KIMI_WORKER = "kimi-k3-0"
PROMETHEUS_RULE = ROOT / "deploy" / "kubernetes" / "monitoring" / "prometheusrule.yaml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "alerts.test.yml"
NO_LEADER_RUNBOOK = ROOT / "docs" / "operations" / "runbooks" / "controller-no-leader.md"
_TABLE = re.compile(r"\[\[[\d,\s\[\]]*\]\]")
_FULL_BATCH = re.compile(r"full batch of (\d+)\s+runs k = (\d+)")


def _alerts(found: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in found if "alert" in rule}


def _operator_rules() -> list[dict[str, Any]]:
    spec = yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def _kimi_table() -> list[list[int]]:
    fleet = load_fleet(KIMI_FLEET)
    worker = fleet.worker(KIMI_WORKER)
    assert worker is not None
    plan = worker_gear_plan(worker, load_profile(fleet.profile_of(KIMI_WORKER)))
    return [list(row) for row in plan.table]


def _quoted_tables(text: str) -> list[list[list[int]]]:
    return [json.loads(match) for match in _TABLE.findall(text)]


def test_the_operator_rule_says_what_the_rule_files_say() -> None:
    assert _alerts(_operator_rules()) == _alerts(rules())


def test_the_unit_tests_expect_the_rules_untemplated_annotations() -> None:
    """promtool compares these too, but only where promtool runs; this holds without it."""
    source = _alerts(rules())
    checked = 0
    for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for case in test["alert_rule_test"]:
            for alert in case.get("exp_alerts") or []:
                for key, value in alert.get("exp_annotations", {}).items():
                    template = source[case["alertname"]]["annotations"][key]
                    if "{{" not in template:
                        assert value == template, f"{case['alertname']}.{key}"
                        checked += 1
    assert checked >= 10


def test_the_no_leader_alert_and_runbook_quote_the_table_the_launcher_writes() -> None:
    expected = _kimi_table()
    description = _alerts(rules())["GearshiftControllerNoLeader"]["annotations"]["description"]
    for text in (description, NO_LEADER_RUNBOOK.read_text()):
        tables = _quoted_tables(text)
        assert tables, "no start-up table quoted"
        assert tables[0] == expected
    full = _FULL_BATCH.search(description)
    assert full is not None
    assert [int(full.group(1)), int(full.group(2))] == expected[-1][1:]


def test_a_quoted_table_is_parsed_whole() -> None:
    assert _quoted_tables("is [[1,25,7],[26,26,5]] and [[1, 2, 3]].") == [[[1, 25, 7], [26, 26, 5]], [[1, 2, 3]]]
    assert _quoted_tables("[[1,25,7],…,[32,32,0]]") == []
