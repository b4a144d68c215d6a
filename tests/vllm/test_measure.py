"""The CPU-worker measurement's arithmetic: summed counters per k, median throughput, the process-group RSS, and
the k = 0 tax (the speculation-free command line, paired rounds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet.scrape import WorkerScrape
from workers.vllm.cpu_server import tiny_plan, tiny_worker
from workers.vllm.measure import (
    BatchResult,
    KResult,
    TaxResult,
    format_table,
    format_tax_table,
    process_group_cpu_seconds,
    process_group_rss_bytes,
    without_speculation,
)


def test_rss_sums_the_process_group(tmp_path: Path) -> None:
    def proc(pid: int, pgrp: int, rss_kib: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} (python -m x) S 1 {pgrp} {pgrp} 0 -1\n")
        (d / "status").write_text(f"Name:\tpython\nVmRSS:\t{rss_kib} kB\n")

    proc(100, 100, 1000)
    proc(101, 100, 500)
    proc(200, 200, 7000)
    assert process_group_rss_bytes(100, proc_root=tmp_path) == 1500 * 1024


def test_a_k_sums_its_batches_counters_and_takes_the_median_throughput() -> None:
    batches = (
        BatchResult(100, 1.0, WorkerScrape(drafts=10, draft_tokens=20, accepted=15, accepted_per_pos=(8, 7))),
        BatchResult(100, 2.0, WorkerScrape(drafts=30, draft_tokens=60, accepted=25, accepted_per_pos=(20, 4, 1))),
        BatchResult(100, 4.0, WorkerScrape()),
    )
    result = KResult(k=2, batches=batches)
    assert result.counters == WorkerScrape(drafts=40, draft_tokens=80, accepted=40, accepted_per_pos=(28, 11, 1))
    assert result.tokens_per_second == 50.0
    assert format_table([result]).splitlines()[1].split() == ["2", "40", "2.00", "2.00", "50.0"]


def test_the_worker_without_speculation_is_the_same_command_less_its_speculative_config(tmp_path: Path) -> None:
    plan = tiny_plan(tiny_worker(port=8000, model_dir=tmp_path))
    plain = without_speculation(plan)
    i = plan.argv.index("--speculative-config")
    assert plain.argv == plan.argv[:i] + plan.argv[i + 2 :]
    assert plain.env == plan.env
    assert without_speculation(plain) == plain


def test_the_k0_tax_is_the_median_of_paired_rounds() -> None:
    def batch(seconds: float, drafts: float = 0.0) -> BatchResult:
        return BatchResult(400, seconds, WorkerScrape(drafts=drafts))

    # 4 requests × 100 tokens: seconds × 4 / 400 per token. Round 2 ran while the machine was busy (both slower).
    result = TaxResult(
        4, with_drafter=(batch(1.1), batch(2.4), batch(1.0)), without=(batch(1.0), batch(2.0), batch(1.0))
    )
    assert [round(t, 6) for t in result.round_taxes] == [0.1, 0.2, 0.0]
    assert round(result.tax, 6) == 0.1 == round(result.tpot_with_drafter_s / result.tpot_without_s - 1, 6)
    assert round(result.tpot_without_s, 9) == 0.01
    assert result.drafts == 0
    row = format_tax_table([result]).splitlines()[1].split()
    assert row == ["4", "11.000", "10.000", "+10.0%", "+0.0%…+20.0%", "-", "0"]


def test_the_cpu_time_tax_compares_cpu_seconds_per_token_over_all_rounds() -> None:
    def batch(tokens: int, cpu_s: float | None) -> BatchResult:
        return BatchResult(tokens, 9.9, WorkerScrape(), cpu_s=cpu_s)

    result = TaxResult(1, with_drafter=(batch(100, 1.0), batch(100, 1.2)), without=(batch(100, 1.0), batch(100, 1.0)))
    assert result.cpu_tax is not None
    assert round(result.cpu_tax, 6) == 0.1
    assert TaxResult(1, with_drafter=(batch(100, None),), without=(batch(100, 1.0),)).cpu_tax is None


def test_cpu_seconds_sum_user_and_system_time_of_the_process_group(tmp_path: Path) -> None:
    def proc(pid: int, pgrp: int, utime: int, stime: int) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        rest = " ".join(["0"] * 7)  # tty_nr … cmajflt: fields 4-10 after "(comm)" and the state
        (d / "stat").write_text(f"{pid} (vllm (engine)) S 1 {pgrp} {pgrp} {rest} {utime} {stime} 0 0\n")

    proc(100, 100, 300, 100)
    proc(101, 100, 50, 50)
    proc(200, 200, 9000, 0)
    ticks = os.sysconf("SC_CLK_TCK")
    assert process_group_cpu_seconds(100, proc_root=tmp_path) == 500 / ticks


def test_the_idle_tax_pairs_each_server_with_plain_in_its_round_and_compares_greedy_texts() -> None:
    from workers.vllm.measure_idle import IdleTaxRun, format_idle_tax, rotated

    def batch(seconds: float, texts: tuple[str, ...] = ("a", "b")) -> BatchResult:
        return BatchResult(200, seconds, WorkerScrape(), texts=texts)

    run = IdleTaxRun(
        {
            ("plain", 2): (batch(1.0), batch(2.0)),
            ("stock", 2): (batch(1.8), batch(3.6)),
            ("skip", 2): (batch(1.02), batch(2.0, texts=("a", "c"))),
        }
    )
    assert run.tax("stock", 2).round_taxes == pytest.approx((0.8, 0.8))
    assert run.tax("skip", 2).tax == pytest.approx(0.01)
    assert run.outputs_equal("stock", 2)
    assert not run.outputs_equal("skip", 2)
    row = format_idle_tax(run, [2]).splitlines()[1].split()
    assert row[4:6] == ["+80.0%", "+1.0%"]
    assert row[-1] == "NO"
    assert rotated(["p", "s", "k"], 4) == ["s", "k", "p"]
    head, labelled = format_idle_tax(run, [2], method="ngram").splitlines()
    assert head.split()[0] == "method"
    assert labelled.split() == ["ngram", *row]


def test_measure_k0_tax_refuses_an_unknown_method_before_building_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gearshift.cli.app import app

    work = tmp_path / "work"
    result = CliRunner().invoke(
        app, ["worker", "measure", "--k0-tax", "--methods", "draft-model,eagle", "--work-dir", str(work)]
    )
    assert result.exit_code == 2
    assert "unknown method(s) eagle" in result.output
    assert not work.exists()
