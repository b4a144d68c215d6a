"""The prefix benchmark's parts: the session load's closed loop and growing prompts, and a small run of the arms."""

from __future__ import annotations

import itertools

from bench.prefix import PrefixBenchConfig, report, run_arm
from workers.sim.arrivals import Lengths
from workers.sim.records import RequestRecord
from workers.sim.sessions import SessionShape

SMALL = PrefixBenchConfig(
    workers=2,
    sessions=8,
    duration_s=80.0,
    warmup_s=15.0,
    sweep=(),
    shape=SessionShape(turns=4, shared_tokens=2000, first_tokens=Lengths(1000), turn_tokens=Lengths(500),
                       answer_tokens=Lengths(100), think_s=1.0),
)  # fmt: skip


def test_each_turn_extends_the_previous_prompt_and_waits_for_its_answer() -> None:
    _, records = run_arm(SMALL, "off")
    by_stream: dict[int | None, list[RequestRecord]] = {}
    for r in sorted(records.requests, key=lambda r: r.arrival_s):
        by_stream.setdefault(r.stream, []).append(r)
    checked = 0
    for turns in by_stream.values():
        for previous, current in itertools.pairwise(turns):
            if current.phase == "turn-0":
                assert current.prompt_tokens == 2000 + 1000  # a new session
                continue
            assert current.prompt_tokens == previous.prompt_tokens + previous.max_tokens + 500
            assert current.arrival_s >= previous.finish_s + 1.0 - 1e-9
            checked += 1
    assert checked > 15


def test_affinity_raises_the_hit_rate_and_the_report_has_every_arm() -> None:
    off, on, unbounded = (run_arm(SMALL, arm)[0] for arm in ("off", "affinity", "affinity-unbounded"))
    assert on.hit_rate > off.hit_rate
    text = report(
        SMALL, [off, on, unbounded], command="gearshift bench prefix", load="load average 0 0 0", swept=[(4, on)]
    )
    for arm in ("off", "affinity", "affinity-unbounded"):
        assert f"| {arm} |" in text
    assert "| 4 | affinity |" in text
