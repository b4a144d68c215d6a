"""The CPU-worker measurement's arithmetic: summed counters per k, median throughput, the process-group RSS, and
the k = 0 tax (the speculation-free command line, paired rounds)."""

from __future__ import annotations

import math
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
    median_interval,
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


def test_the_cpu_time_tax_is_the_median_of_paired_rounds_of_cpu_seconds_per_token() -> None:
    def batch(tokens: int, cpu_s: float | None) -> BatchResult:
        return BatchResult(tokens, 9.9, WorkerScrape(), cpu_s=cpu_s)

    # round 3 ran while the machine was busy: both servers used twice the CPU; a total over the rounds would
    # weigh it double (3.4 / 3.0 - 1 = +13 %), the median of the paired rounds does not
    result = TaxResult(
        1,
        with_drafter=(batch(100, 1.0), batch(100, 1.2), batch(200, 4.2)),
        without=(batch(100, 1.0), batch(100, 1.0), batch(200, 4.0)),
    )
    assert result.cpu_round_taxes == pytest.approx((0.0, 0.2, 0.05))
    assert result.cpu_tax == pytest.approx(0.05)
    assert result.cpu_tax_interval is None  # 3 rounds: too few for a 95 % interval
    assert TaxResult(1, with_drafter=(batch(100, None),), without=(batch(100, 1.0),)).cpu_tax is None


def _coverage(n: int, j: int) -> float:
    """P(x_(j) <= median <= x_(n-j+1)) for n draws of a continuous distribution: 1 - 2 P(Binomial(n, 1/2) < j)."""
    return 1 - 2 * sum(math.comb(n, i) for i in range(j)) / 2**n


@pytest.mark.parametrize("n", [6, 7, 9, 12, 15, 30])
def test_the_median_interval_is_the_narrowest_pair_of_order_statistics_covering_95_percent(n: int) -> None:
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose; x_(i) = i
    interval = median_interval(values)
    assert interval is not None
    lo, hi = interval
    j = int(lo)
    assert hi == n - j + 1  # symmetric ranks
    assert _coverage(n, j) >= 0.95
    assert _coverage(n, j + 1) < 0.95  # one rank narrower would cover less


def test_no_median_interval_from_five_rounds_or_fewer() -> None:
    assert _coverage(5, 1) < 0.95
    assert all(median_interval([1.0] * n) is None for n in range(6))


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


def test_cpu_seconds_prefer_the_threads_exact_run_time_where_the_kernel_has_schedstat(tmp_path: Path) -> None:
    def proc(pid: int, pgrp: int, ticks: int, threads_ns: list[int] | None) -> None:
        d = tmp_path / str(pid)
        d.mkdir()
        rest = " ".join(["0"] * 7)
        (d / "stat").write_text(f"{pid} (vllm) S 1 {pgrp} {pgrp} {rest} {ticks} 0 0 0\n")
        for tid, ns in enumerate(threads_ns or [], start=pid):
            (d / "task" / str(tid)).mkdir(parents=True)
            (d / "task" / str(tid) / "schedstat").write_text(f"{ns} 123 45\n")

    proc(100, 100, 999, [1_250_000_000, 250_000_001])  # the tick count is ignored where schedstat exists
    proc(101, 100, 50, None)
    ticks = os.sysconf("SC_CLK_TCK")
    assert process_group_cpu_seconds(100, proc_root=tmp_path) == pytest.approx(1.500000001 + 50 / ticks)


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
    assert row[6] == "r:+0.0%…+2.0%"  # two rounds: their range, marked, not a confidence interval
    assert rotated(["p", "s", "k"], 4) == ["s", "k", "p"]
    head, labelled = format_idle_tax(run, [2], method="ngram").splitlines()
    assert head.split()[0] == "method"
    assert labelled.split() == ["ngram", *row]


def test_the_idle_tax_table_gives_the_95_percent_interval_of_the_median_round_from_six_rounds() -> None:
    from workers.vllm.measure_idle import IdleTaxRun, format_idle_tax

    def batch(seconds: float, cpu_s: float) -> BatchResult:
        return BatchResult(100, seconds, WorkerScrape(), cpu_s=cpu_s, texts=("a",))

    skip_s = (1.01, 1.03, 0.99, 1.02, 1.00, 1.04)  # over plain's 1.0: -1 % … +4 %
    run = IdleTaxRun(
        {
            ("plain", 1): tuple(batch(1.0, 1.0) for _ in skip_s),
            ("stock", 1): tuple(batch(2.0, 2.0) for _ in skip_s),
            ("skip", 1): tuple(batch(s, 2 - s) for s in skip_s),
        }
    )
    _head, row = (line.split() for line in format_idle_tax(run, [1]).splitlines())
    assert row[5] == "+1.5%"  # the median of the six rounds
    assert row[6] == "-1.0%…+4.0%"  # six rounds: the 95 % interval is x_(1)…x_(6)
    assert row[9] == "-4.0%…+1.0%"  # the same in CPU time
    assert row[10] == "6"


def test_the_acceptance_table_says_whether_each_server_is_within_two_percent() -> None:
    from workers.vllm.measure_idle import NO_CATCH_UP, AcceptanceWindow, format_acceptance

    def window(draft_tokens: float, accepted: float) -> AcceptanceWindow:
        return AcceptanceWindow(
            WorkerScrape(drafts=draft_tokens / 4, draft_tokens=draft_tokens, accepted=accepted), 1.0
        )

    table = format_acceptance(
        [("skip", window(400, 380), window(400, 374)), (NO_CATCH_UP, window(400, 380), window(400, 200))]
    )
    skip, ablation = (line.split() for line in table.splitlines()[1:])
    assert skip[1:5] == ["0.9500", "0.9350", "-1.58%", "yes"]
    assert ablation[:5] == [NO_CATCH_UP, "0.9500", "0.5000", "-47.37%", "NO"]


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
