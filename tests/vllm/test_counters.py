"""Parsing vLLM's speculative-decoding counters from text made by a real prometheus_client registry."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

from fleet import vllm_metrics as names
from workers.vllm.counters import SpecCounters, parse_spec_counters
from workers.vllm.measure import process_group_rss_bytes


def vllm_like_text(drafts: float, draft_tokens: float, accepted_per_pos: list[float], generated: float) -> str:
    """Exposition shaped like vLLM 0.32's: counters with engine/model_name labels, per-position counter."""
    registry = CollectorRegistry()
    labels = ["engine", "model_name"]
    for name, value in (
        (names.SPEC_DECODE_NUM_DRAFTS, drafts),
        (names.SPEC_DECODE_NUM_DRAFT_TOKENS, draft_tokens),
        (names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, sum(accepted_per_pos)),
        (names.GENERATION_TOKENS, generated),
    ):
        Counter(name, "doc", labels, registry=registry).labels("0", "tiny").inc(value)
    per_pos = Counter(names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS, "doc", [*labels, "position"], registry=registry)
    for pos, value in enumerate(accepted_per_pos):
        per_pos.labels("0", "tiny", str(pos)).inc(value)
    return generate_latest(registry).decode()


def test_parse_reads_totals_and_positions() -> None:
    counters = parse_spec_counters(vllm_like_text(10, 35, [9, 8, 7, 0], 200))
    assert counters == SpecCounters(
        drafts=10, draft_tokens=35, accepted=24, accepted_per_pos=(9, 8, 7, 0), generation_tokens=200
    )
    assert counters.draft_tokens_per_draft == 3.5
    assert counters.tokens_per_draft == 3.4
    assert counters.longest_accepted_position == 2


def test_difference_of_two_readings() -> None:
    before = parse_spec_counters(vllm_like_text(10, 35, [9, 8, 7, 0], 200))
    after = parse_spec_counters(vllm_like_text(14, 43, [13, 12, 7, 0], 260))
    delta = after - before
    assert (delta.drafts, delta.draft_tokens, delta.accepted_per_pos) == (4, 8, (4, 4, 0, 0))
    assert delta.longest_accepted_position == 1
    assert delta.draft_tokens_per_draft == 2


def test_no_drafts_means_no_ratio() -> None:
    counters = parse_spec_counters(vllm_like_text(0, 0, [0, 0], 50))
    assert counters.draft_tokens_per_draft is None
    assert counters.tokens_per_draft is None
    assert counters.longest_accepted_position == -1


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


def test_sum_of_readings_pads_positions() -> None:
    a = SpecCounters(drafts=1, draft_tokens=2, accepted=2, accepted_per_pos=(1, 1), generation_tokens=3)
    b = SpecCounters(drafts=2, draft_tokens=6, accepted=3, accepted_per_pos=(2, 1, 0), generation_tokens=9)
    assert a + b == SpecCounters(drafts=3, draft_tokens=8, accepted=5, accepted_per_pos=(3, 2, 0), generation_tokens=12)
