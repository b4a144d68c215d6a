"""The CPU-worker measurement's arithmetic: summed counters per k, median throughput, the process-group RSS."""

from __future__ import annotations

from pathlib import Path

from fleet.scrape import WorkerScrape
from workers.vllm.measure import BatchResult, KResult, format_table, process_group_rss_bytes


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
