"""PromQL helpers for the checks: the metric names an expression selects, Grafana variables, promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .deploy_contracts import ROOT

RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS |= {"inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'")
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_GRAFANA_VAR = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:])\d+(\.\d+)?([eE][+-]?\d+)?((ms|[smhdwy])\d*)*")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*,\s*\w+\s*\)\s*$")


def metric_names(expr: str) -> set[str]:
    """Names of the series an expression (or a Grafana ``label_values(metric, label)`` query) selects."""
    values = _LABEL_VALUES.match(expr)
    if values:
        return {values.group(1)}
    text = _GRAFANA_VAR.sub("", _STRING.sub('""', expr))
    text = _GROUPING.sub(" ", _RANGES.sub("", _MATCHERS.sub("", text)))
    text = _NUMBER.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group(0).lower() in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables by values Prometheus accepts, so promtool can parse panel queries."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "1h").replace("$__interval", "15s")
    return _GRAFANA_VAR.sub(".*", expr)


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def rules() -> list[dict[str, Any]]:
    return [
        rule for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run Debian's promtool (installed by scripts/bootstrap.sh); fails the test when it is missing."""
    exe = shutil.which("promtool")
    assert exe is not None, "promtool not found: run scripts/bootstrap.sh (Debian package `prometheus`)"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False)
