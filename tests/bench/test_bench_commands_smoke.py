"""Tiny versions of both benchmark commands: they write a well-formed report with valid PNGs.

Timings are never asserted: the machine running the suite is not the benchmark machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.gateway.targets import CommandLauncher
from bench.markdown import parse_table
from bench.policy.report import PLAN_KEY
from bench.policy.suite import family_profiles
from gearshift.cli.app import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _pngs(markdown: str, directory: Path) -> list[Path]:
    names = [line.split("](", 1)[1].rstrip(")") for line in markdown.splitlines() if line.startswith("![")]
    return [directory / n for n in names]


def _assert_pngs(markdown: str, directory: Path, count: int) -> None:
    paths = _pngs(markdown, directory)
    assert len(paths) == count
    for path in paths:
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC
        assert data[12:16] == b"IHDR"
        assert len(data) > 1000


def test_bench_policies_smoke(tmp_path: Path) -> None:
    """A family run on both profiles: one targets table per profile, policies.json, the PNGs of each."""
    result = CliRunner().invoke(
        app,
        ["bench", "policies", "--out", str(tmp_path), "--scenario", "phase-shift", "--scenario",
         "random-sweep-mi355x", "--profiles", "all", "--scale", "0.03", "--processes", "1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    md = (tmp_path / "policies.md").read_text()
    tp16, mi355x = "kimi-k3-dspark-tp16", "kimi-k3-dspark-mi355x-tp8"
    header, rows = parse_table(md, f"### Goodput table — {tp16}")
    assert header == ["scenario", "k=0", "k=1", "k=2", "k=4", "k=7", "vllm-table", "gate", "no-drafter", "gearshift",
                      "adaptive", "gearshift+adaptive", "fleet-plan", "k=0@plugin", "gearshift@plugin",
                      "oracle-k", "best-uniform-static", "best-static-placement"]  # fmt: skip
    assert [r[0] for r in rows] == ["phase-shift"], "the MI355X-only sweep is not run on tp16"
    _, rows = parse_table(md, f"### Goodput table — {mi355x}")
    assert [r[0] for r in rows] == ["phase-shift", "random-sweep-mi355x"]
    for profile in (tp16, mi355x):
        header, rows = parse_table(md, f"#### Targets table — {profile}")
        assert header == ["target", "scenario", "figure", "status"]
        assert {r[0] for r in rows} >= {"≥ 97 % of the oracle's goodput", "never > 3 % below the best static k"}
        assert all(r[3] in ("met", "**not met**") for r in rows)
        header, rows = parse_table(md, f"### Targets of issues 25 and 24 — {profile}")
        assert [r[0] for r in rows][:4] == [
            "fleet plan ≥ 0.98× best of {best uniform static, vllm-table, no-drafter}",
            "fleet plan ≥ 1.10× that best (day-long, steady-batch)",
            "fleet plan ≥ 97 % of best-fleet-plan",
            "gearshift+adaptive ≥ 0.99× adaptive",
        ]
        _, rows = parse_table(md, f"### Honest references (issue 25) — {profile}")
        assert "phase-shift" in [r[0] for r in rows]
    header, rows = parse_table(md, f"#### phase-shift table — {tp16}")
    assert header[:3] == ["policy", "goodput tok/s", "throughput tok/s"]
    model_cost = header.index("$/Mtok (cost model)")
    assert all(float(r[model_cost].replace(",", "")) > 0 for r in rows), "the controller's cost model prices every run"
    assert len(rows) == 17
    summary = json.loads((tmp_path / "policies.json").read_text())
    assert set(summary) == {"phase-shift", "random-sweep-mi355x", PLAN_KEY}
    plan = summary[PLAN_KEY][tp16]
    assert {"phase-shift/oracle@1x", "phase-shift/best-fleet-plan@3x"} <= set(plan["references"])
    assert {c["scenario"] for c in plan["targets"]} >= {"phase-shift", "phase-shift @ 0.25× restart"}
    assert set(summary["random-sweep-mi355x"]) == {mi355x}
    run = summary["phase-shift"][tp16]["gearshift"]
    assert set(run) >= {"goodput_tok_s", "throughput_tok_s", "backlog_requests", "sla_attainment",
                        "switches_per_worker_min"}  # fmt: skip
    assert run["sla_attainment"].keys() == {"interactive"}
    _assert_pngs(md, tmp_path, 4 * len(family_profiles()))  # goodput, frontier, cost, k over time


@pytest.mark.redis
def test_bench_gateway_smoke(tmp_path: Path) -> None:
    other = f"floor2={sys.executable} -m bench.gateway.passthrough --port {{port}} --upstream {{upstream}}"
    args = ["bench", "gateway", "--out", str(tmp_path), "--duration", "1", "--concurrency", "1",
            "--profile-seconds", "0", "--ttfc-seconds", "0.5", "--proxy-cmd", other]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    md = (tmp_path / "gateway.md").read_text()
    targets = ("direct", "passthrough", "gearshift-memory", "gearshift-redis", "gearshift-redis-2proc", "floor2")
    header, rows = parse_table(md, "### Throughput and latency table")
    assert header[:5] == ["mode", "c", "target", "req/s", "CPU µs/req"]
    assert {(r[0], r[2]) for r in rows} == {(mode, t) for mode in ("json", "stream") for t in targets}
    assert all(r[-1] == "0" for r in rows), "no request may fail"
    assert all((r[4] == "—") == (r[2] == "direct") for r in rows), "every proxy's CPU cost is measured"
    assert all(float(r[4].replace(",", "")) > 0 for r in rows if r[2] != "direct")
    _, rows = parse_table(md, "### Time to first chunk table")
    assert {r[0] for r in rows} == set(targets)
    assert all(int(r[1]) > 0 for r in rows)
    assert all(r[-1] == "0" for r in rows)
    _, rows = parse_table(md, "### Targets table")
    assert {r[0] for r in rows} == set(targets) - {"direct"}
    header, rows = parse_table(md, "### Redis command mix table")  # each Redis target's own commands, by name
    assert {(r[0], r[1]) for r in rows} == {("gearshift-redis", "1"), ("gearshift-redis-2proc", "1")}
    assert header[:4] == ["target", "c", "requests", "cmd/req"]
    assert any(name.startswith("evalsha:") for name in header[4:])
    assert "Concurrency 100,000: **exact**" in md
    assert "## Failures" not in md
    _assert_pngs(md, tmp_path, 2)


def test_proxy_command_spec_parsing() -> None:
    named = CommandLauncher.parse("nginx=nginx -c /x.conf -g 'daemon off;'", 1)
    assert (named.name, named.command) == ("nginx", "nginx -c /x.conf -g 'daemon off;'")
    anonymous = CommandLauncher.parse("litellm --port {port}", 2)
    assert (anonymous.name, anonymous.command) == ("proxy-2", "litellm --port {port}")
