"""The run's metrics folded as the run goes (``bench.policy.lab.RunSink``), so a replay's memory is bounded by the
requests in flight, not by the trace: the same figures as ``bench.policy.run_metrics.summarise`` and the replay's
per-tier table (``bench.replay.run``), bit for bit (``tests/bench/test_replay.py`` compares them field by field).

What is kept, and why it is exact:

- **steps**: integer sums per window and per phase, the float sums (busy, drafter and extra verify seconds) added
  in step order as the full run adds them, the last k per worker for the k changes;
- **requests**: a finished request leaves its TTFT and TPOT (8 bytes each) in its (phase, tier, in-window)
  bucket, its verdict's contribution to every boundary's delivered tokens (integers: a suffix difference array
  from its finish, plus its in-flight marks) and its open interval (integers over the boundaries). Quantiles sort,
  so the buckets' order does not matter;
- **boundary marks**: only the requests in flight at a boundary leave their tokens so far; a request finished
  by then has delivered all its tokens, one not yet arrived none.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from bench.policy.lab import RawRun, TickSample, boundaries
from bench.policy.run_metrics import (
    Backlog,
    PhaseMetrics,
    RunMetrics,
    extra_verify_s,
    meets_sla,
    price_split,
    rejected_fractions,
    rejected_seconds,
    verdict_at,
)
from bench.policy.scenario import Scenario
from fleet.perf import Profile
from fleet.stats import percentile
from workers.sim.records import RequestRecord, StepRecord


@dataclass(slots=True)
class _Latencies:
    """TTFT and TPOT (s) of finished requests (TPOT NaN with fewer than 2 tokens)."""

    ttft: array[float] = field(default_factory=lambda: array("d"))
    tpot: array[float] = field(default_factory=lambda: array("d"))


@dataclass(slots=True)
class _PhaseSteps:
    tokens: int = 0
    decoding: int = 0
    decode_seqs: int = 0


@dataclass(frozen=True, slots=True)
class TierFigures:
    """What the replay's per-tier table needs of one tier (``bench.replay.run.TierLatency`` before division)."""

    delivered_good_tokens: int
    finished_tokens: int
    requests: int
    ttft_s: tuple[float, ...]
    tpot_s: tuple[float, ...]


class StreamedRun:
    """A ``RunSink`` that folds one run of ``scenario`` into its metrics (see the module docstring)."""

    def __init__(self, scenario: Scenario, profile: Profile) -> None:
        self.scenario = scenario
        self.profile = profile
        self.start, self.end = scenario.warmup_s, scenario.duration_s
        bounds = list(scenario.phase_bounds())
        self._names = [p.name for p, _, _ in bounds]
        self._starts = [a for _, a, _ in bounds]
        self._ends = [b for _, _, b in bounds]
        self.times = boundaries(scenario)
        self._end_index = self.times.index(self.end)
        n = len(self.times)
        # steps
        self._window_tokens = 0
        self._busy: float = 0  # sum() starts at int 0 too
        self._drafter: float = 0
        self._extra_cache: dict[tuple[int, int, int], float] = {}
        self._extra_s: dict[tuple[int, int], float] = defaultdict(float)
        self._drafted: dict[tuple[int, int], int] = defaultdict(int)
        self._accepted: dict[tuple[int, int], int] = defaultdict(int)
        self._decode_tokens = self._decode_seqs = 0
        self._k_seqs = self._decoding_seqs = 0
        self._step_k: dict[int, int] = {}
        self._step_k_changes = 0
        self._phase_steps = [_PhaseSteps() for _ in bounds]
        self._phase = 0
        # ticks
        self._tick_k: dict[int, int] = {}
        self._tick_k_changes = 0
        self.k_over_time: list[tuple[float, float]] = []
        self._tick_t: float | None = None
        self._tick_ks: list[int] = []
        # requests
        self._latencies: dict[tuple[int, str, bool], _Latencies] = defaultdict(_Latencies)
        self._marks: dict[str, list[tuple[int, int]]] = {}
        self._good_from: dict[str, list[int]] = defaultdict(lambda: [0] * (n + 1))
        """Tier → tokens added to every boundary from index i on (a finished good request's total)."""
        self._good_at: dict[str, list[int]] = defaultdict(lambda: [0] * n)
        """Tier → tokens at boundary i only (a good request's marks while in flight)."""
        self._rises = [0] * (n + 1)
        self._tags: set[str] = set()
        self._window_requests: dict[str, int] = defaultdict(int)
        self._judged: dict[str, int] = defaultdict(int)
        self._met: dict[str, int] = defaultdict(int)
        self._phase_requests = [0] * len(bounds)
        self._finished_in_window = 0
        self._finished_tokens: dict[str, int] = defaultdict(int)
        self._closed = False

    # ------------------------------------------------------------------------------------------- steps
    def step(self, s: StepRecord) -> None:
        worker, start_s, duration_s, k, seqs, prefill, tokens, _, drafter_s = s
        end_s = start_s + duration_s
        ends = self._ends
        j = self._phase  # steps end in time order: the phase only moves forward
        while j < len(ends) and ends[j] < end_s:
            j += 1
        self._phase = j
        if j < len(ends) and self._starts[j] < end_s:
            ph = self._phase_steps[j]
            ph.tokens += tokens
            if seqs > 0:
                ph.decoding += 1
                ph.decode_seqs += seqs
        if not self.start < end_s <= self.end:
            return
        self._window_tokens += tokens
        self._busy += duration_s
        self._drafter += drafter_s
        if seqs > 0:
            self._k_seqs += k * seqs
            self._decoding_seqs += seqs
            last = self._step_k.get(worker)
            if last is not None and last != k:
                self._step_k_changes += 1
            self._step_k[worker] = k
            if k > 0:
                shape = (seqs, k, prefill)
                extra = self._extra_cache.get(shape)
                if extra is None:
                    extra = self._extra_cache[shape] = extra_verify_s(self.profile, seqs, k, prefill)
                key = (worker, k)
                self._extra_s[key] += extra
                if prefill == 0:
                    self._decode_tokens += tokens
                    self._decode_seqs += seqs
                    self._drafted[key] += seqs * k
                    self._accepted[key] += max(tokens - seqs, 0)

    # ------------------------------------------------------------------------------------------- ticks
    def tick(self, sample: TickSample) -> None:
        if self.start <= sample.t_s <= self.end:
            if sample.worker in self._tick_k and self._tick_k[sample.worker] != sample.k:
                self._tick_k_changes += 1
            self._tick_k[sample.worker] = sample.k
        if sample.t_s != self._tick_t:
            self._flush_tick()
            self._tick_t = sample.t_s
        self._tick_ks.append(sample.k)

    def _flush_tick(self) -> None:
        if self._tick_t is not None and self._tick_ks:
            self.k_over_time.append((self._tick_t, sum(self._tick_ks) / len(self._tick_ks)))
        self._tick_ks = []

    # ---------------------------------------------------------------------------------------- requests
    def mark(self, t_s: float, in_flight: Iterable[RequestRecord]) -> None:
        index = bisect.bisect_left(self.times, t_s)
        at_end = index == self._end_index
        for r in in_flight:
            tokens = r.output_tokens
            marks = self._marks.get(r.request_id)
            if tokens:
                if marks is None:
                    marks = self._marks[r.request_id] = []
                marks.append((index, tokens))
            if at_end and r.arrival_s < self.end:
                self._judge(r, verdict_at(r, tokens, self.end, self.scenario.tiers.get(r.tag)), marks or [])
        if at_end:
            self._marks.clear()  # every verdict is taken; later finishes add nothing to the boundaries

    def _judge(self, r: RequestRecord, good: bool | None, marks: list[tuple[int, int]]) -> None:
        """The request's verdict at the window's end, and (when met) its tokens at every boundary."""
        if self.start <= r.arrival_s < self.end and good is not None:
            self._judged[r.tag] += 1
            self._met[r.tag] += good
        if good is True:
            at = self._good_at[r.tag]
            for i, tokens in marks:
                at[i] += tokens

    def finished(self, r: RequestRecord) -> None:
        marks = self._marks.pop(r.request_id, [])
        if r.arrival_s < self.end and r.finish_s <= self.end:
            good = meets_sla(r, self.scenario.tiers.get(r.tag))
            self._judge(r, good, marks)
            if good:
                self._good_from[r.tag][bisect.bisect_left(self.times, r.finish_s)] += r.output_tokens
        self._count(r)
        phase = self._phase_of(r.arrival_s)
        in_window = self.start <= r.arrival_s < self.end
        lat = self._latencies[phase, r.tag, in_window]
        lat.ttft.append(r.ttft_s)
        lat.tpot.append(r.tpot_s)
        if in_window and r.finish_s <= self.end:
            self._finished_in_window += 1
            self._finished_tokens[r.tag] += r.output_tokens

    def close(self, unfinished: Iterable[RequestRecord]) -> None:
        for r in unfinished:
            self._count(r)
        self._flush_tick()
        self._closed = True

    def _count(self, r: RequestRecord) -> None:
        """Once per request, finished or not: tags, arrivals per window and phase, the open interval."""
        self._tags.add(r.tag)
        if self.start <= r.arrival_s < self.end:
            self._window_requests[r.tag] += 1
        phase = self._phase_of(r.arrival_s)
        if phase >= 0:
            self._phase_requests[phase] += 1
        first = bisect.bisect_right(self.times, r.arrival_s)
        past = bisect.bisect_left(self.times, r.finish_s) if r.finished else len(self.times)
        if first < past:
            self._rises[first] += 1
            self._rises[past] -= 1

    def _phase_of(self, arrival_s: float) -> int:
        j = bisect.bisect_right(self._starts, arrival_s) - 1
        return j if j >= 0 and arrival_s < self._ends[j] else -1

    # ----------------------------------------------------------------------------------------- results
    def _good_tokens(self, tiers: Iterable[str]) -> list[int]:
        """Tokens delivered by each boundary by the met requests of ``tiers``."""
        out = [0] * len(self.times)
        for tier in tiers:
            running = 0
            frm, at = self._good_from.get(tier), self._good_at.get(tier)
            for i in range(len(self.times)):
                running += frm[i] if frm is not None else 0
                out[i] += running + (at[i] if at is not None else 0)
        return out

    def _open(self) -> list[int]:
        out, running = [], 0
        for rise in self._rises[:-1]:
            running += rise
            out.append(running)
        return out

    def _values(
        self, *, phase: int | None = None, tier: str | None = None, in_window: bool | None = None
    ) -> _Latencies:
        out = _Latencies()
        for (p, t, w), lat in self._latencies.items():
            if (phase is None or p == phase) and (tier is None or t == tier) and (in_window is None or w == in_window):
                out.ttft.extend(lat.ttft)
                out.tpot.extend(lat.tpot)
        return out

    def metrics(self, raw: RawRun) -> RunMetrics:
        """The run's ``RunMetrics`` (``raw``: what ``run_policy`` returned with this sink)."""
        if not self._closed:
            raise RuntimeError("the run has not ended: close() was not called")
        sc, start, end = self.scenario, self.start, self.end
        window = end - start
        good = self._good_tokens(self._tags)
        index = {t: i for i, t in enumerate(self.times)}
        opened = self._open()
        lat = self._values(in_window=True)
        tpots = [t for t in lat.tpot if not math.isnan(t)]
        attainment = {
            tier: self._met[tier] / self._judged[tier] if self._judged[tier] else math.nan
            for tier in sorted(t for t, n in self._window_requests.items() if n)
        }
        rejected = rejected_seconds(self._extra_s, rejected_fractions(self._drafted, self._accepted))
        split, drafter_share, rejected_share = price_split(
            sc, start, end, busy=self._busy, drafter=self._drafter, rejected=rejected, tokens=self._window_tokens
        )
        worker_minutes = sc.workers * window / 60.0
        requests = sum(self._window_requests.values())
        return RunMetrics(
            scenario=sc.name,
            policy=raw.policy,
            window_s=window,
            throughput_tok_s=self._window_tokens / window,
            goodput_tok_s=(good[index[end]] - good[index[start]]) / window,
            sla_attainment=attainment,
            requests_finished=self._finished_in_window,
            requests_unfinished=requests - self._finished_in_window,
            ttft_p50_s=percentile(lat.ttft, 0.5),
            ttft_p99_s=percentile(lat.ttft, 0.99),
            tpot_p50_s=percentile(tpots, 0.5),
            tpot_p99_s=percentile(tpots, 0.99),
            per_user_tok_s_p50=percentile([1.0 / t for t in tpots if t > 0], 0.5),
            accepted_length=self._decode_tokens / self._decode_seqs if self._decode_seqs else 1.0,
            mean_k=self._k_seqs / max(self._decoding_seqs, 1),
            cost=split,
            drafter_share=drafter_share,
            rejected_share=rejected_share,
            switches_per_worker_min=self._tick_k_changes / worker_minutes,
            step_k_changes_per_worker_min=self._step_k_changes / worker_minutes,
            phases=self._phases(good, index, opened),
            ticks=[],
            model_cost=raw.model_cost,
            backlog=Backlog(opened[index[start]], opened[index[end]], requests),
        )

    def _phases(self, good: list[int], index: dict[float, int], opened: list[int]) -> list[PhaseMetrics]:
        out = []
        for j, (name, start, end) in enumerate(zip(self._names, self._starts, self._ends, strict=True)):
            steps = self._phase_steps[j]
            tpots = [t for t in self._values(phase=j).tpot if not math.isnan(t)]
            a, b = index[start], index[end]
            out.append(
                PhaseMetrics(
                    name=name,
                    duration_s=end - start,
                    throughput_tok_s=steps.tokens / (end - start),
                    goodput_tok_s=(good[b] - good[a]) / (end - start),
                    per_user_tok_s_p50=percentile([1.0 / t for t in tpots if t > 0], 0.5),
                    tpot_p50_s=percentile(tpots, 0.5),
                    mean_decode_batch=steps.decode_seqs / steps.decoding if steps.decoding else 0.0,
                    backlog=Backlog(opened[a], opened[b], self._phase_requests[j]),
                )
            )
        return out

    def tiers(self) -> dict[str, TierFigures]:
        """Per tier (every tier a request carried): what ``bench.replay.run``'s tier table needs."""
        index_start, index_end = self.times.index(self.start), self._end_index
        out = {}
        for tier in sorted(self._tags):
            good = self._good_tokens([tier])
            lat = self._values(tier=tier, in_window=True)
            out[tier] = TierFigures(
                delivered_good_tokens=good[index_end] - good[index_start],
                finished_tokens=self._finished_tokens[tier],
                requests=self._window_requests[tier],
                ttft_s=tuple(lat.ttft),
                tpot_s=tuple(t for t in lat.tpot if not math.isnan(t)),
            )
        return out
