"""deploy/prometheus: promtool accepts the scrape configs and the rules, the rules' unit tests pass, and every
rule selects only metrics the code exports or other rules record."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .deploy_contracts import ROOT, exported_series
from .deploy_promql import metric_names, promtool, recorded_names, rule_files, rules

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"


def _with_local_rules(config: dict[str, object], tmp_path: Path) -> Path:
    """The config with ``rule_files`` pointed at the repository's rules, written under ``tmp_path``."""
    config = {**config, "rule_files": [str(path) for path in rule_files()]}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.prometheus
def test_promtool_accepts_the_compose_config_with_its_rules(tmp_path: Path) -> None:
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-compose.yml").read_text())
    result = promtool("check", "config", str(_with_local_rules(config, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_files())} rule files found" in result.stdout


@pytest.mark.prometheus
def test_promtool_accepts_the_kubernetes_config(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes discovery, so the discovery block is swapped for a static
    target; the relabelling (the part gearshift wrote) is checked as is."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus-kubernetes.yml").read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs")[0]["role"] == "pod"
        job["static_configs"] = [{"targets": ["gateway:8080"]}]
    result = promtool("check", "config", str(_with_local_rules(config, tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.prometheus
def test_promtool_accepts_every_rule_file() -> None:
    result = promtool("check", "rules", *map(str, rule_files()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(rule_files()) >= 2


@pytest.mark.prometheus
def test_alert_and_recording_rules_behave_as_their_unit_tests_say() -> None:
    tests = PROMETHEUS_DIR / "tests" / "alerts.test.yml"
    result = promtool("test", "rules", str(tests))
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {rule["alert"] for rule in rules() if "alert" in rule}
    tested = {case["alertname"] for t in yaml.safe_load(tests.read_text())["tests"] for case in t["alert_rule_test"]}
    assert {"GearshiftAcceptanceCollapse", "GearshiftControllerNoLeader", "GearshiftCostPerMtokHigh"} <= tested
    assert {"GearshiftWorkerEjected", "GearshiftSLABurnFast"} <= tested <= alerts


def test_rules_select_only_metrics_the_code_exports() -> None:
    known = exported_series() | recorded_names()
    for rule in rules():
        unknown = metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: unknown metrics {sorted(unknown)}"


def test_metric_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (tier, le) (rate(a_bucket{tier=~"$tier", le="0.05"}[$__rate_interval])))'
        " / ignoring (position) group_left sum by (worker) (rate(vllm:b_total[5m] offset 1h)) * 1e6 and on (x) c"
    )
    assert metric_names(expr) == {"a_bucket", "vllm:b_total", "c"}
    assert metric_names("label_values(vllm:num_requests_running, worker)") == {"vllm:num_requests_running"}
