"""The simulated engine core: vLLM V1-style continuous batching with block-parallel speculative decoding.

Clock-agnostic and free of I/O: a driver (the real-time server or the virtual-time lab) sets ``now_s``,
calls ``step()``, advances its clock by ``StepOutcome.duration_s`` and delivers the emitted tokens.

One step, as vLLM V1 schedules it:

1. ``control.expire()``; k = the schedule's k for the number of requests ready to decode.
2. Running requests first, in order: a decoding request asks for 1 + k tokens (its last sampled token and k
   drafts, whose KV is reserved as lookahead); a request still prefilling asks for the rest of its prompt,
   chunked to the step's token budget. When KV blocks run out, the lowest-ranked running request (the last
   admitted under FCFS; the largest ``(priority, arrival)`` under priority) is preempted: its KV is freed and it
   goes back to the waiting queue to recompute its prompt and the tokens it had generated.
3. If nothing was preempted, waiting requests are admitted while batch slots, budget and KV blocks last. With
   prefix caching (``workers.sim.prefix_cache``) a request admitted afresh starts on the cached blocks of its
   prompt's beginning, which it does not prefill again.
4. Step time comes from ``fleet.perf.step_time``; each decoding request's drafts are accepted position by
   position with the profile's conditional probabilities at its current context length (seeded RNG).
   With adaptive verification on (``workers.sim.adaptive``), k is the cap: every decoding request drafts k
   tokens, the engine verifies a per-request prefix of them chosen from the confidence head and the profiled
   step cost, and the step is timed at what it verified. A k = 0 step on an engine started with its drafter
   (``drafter_loaded``, the default) pays the profile's idle-drafter tax of its ``idle_drafter`` mode
   (``DrafterModel.idle_tax``: vLLM's own, or the gearshift plugin's skip); an engine started without
   speculation does not.

Counters follow vLLM: a *draft* is one request-step with k > 0; ``num_draft_tokens`` grows by the drafts
verified (k per draft, or the adaptive choice, which may be 0); accepted tokens are counted per position before
the ``max_tokens`` cap is applied.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from fleet.perf import IdleDrafterMode, Profile, StepShape, conditional_acceptance, step_time_of
from fleet.speculation import SpeculationControl
from workers.sim.adaptive import AdaptiveVerification, AdaptiveVerifier, VerifyPlan, probits
from workers.sim.prefix_cache import PrefixCache
from workers.sim.scheduler import SchedulingPolicy, WaitingQueue, make_queue
from workers.sim.stats import EngineStats

KV_BLOCK_TOKENS = 16
"""KV cache block size, tokens (vLLM's default ``block_size``)."""
_CONTEXT_BUCKET_SHIFT = 6
"""Acceptance probabilities are cached per 2**6 = 64-token bucket of context length (they vary slowly)."""
_DECODING = attrgetter("decoding")
_COMPUTED = attrgetter("computed")


@dataclass
class SimRequest:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    workload: str
    """Acceptance class name; unknown names fall back to the profile's default workload."""
    priority: int = 0
    """Lower runs first under priority scheduling (vLLM semantics)."""
    arrival_s: float = 0.0
    """Engine-clock time the request arrived, seconds (for queue time and TTFT)."""
    block_hashes: Sequence[int] = ()
    """Hashes of the prompt's full KV blocks (``workers.sim.prompt_tokens``), for the prefix cache."""
    cached_tokens: int = 0
    """Set by the engine: prompt tokens found in its prefix cache when first scheduled (vLLM's
    ``num_cached_tokens``)."""


@dataclass(slots=True)
class StepOutcome:
    duration_s: float
    k: int
    decode_seqs: int
    prefill_tokens: int
    emitted: dict[str, int]
    """request_id → output tokens produced this step (first token at the end of prefill, else 1 + accepted)."""
    finished: list[str]
    preempted: list[str]
    target_s: float
    drafter_s: float


@dataclass(eq=False, slots=True)
class _Seq:
    req: SimRequest
    order: int
    rid: str
    max_tokens: int
    output_tokens: int = 0
    computed: int = 0
    """Tokens whose KV is in the cache (prompt + output, minus the last sampled token while decoding)."""
    blocks: int = 0
    decoding: bool = False
    """Prefill (or recompute) done: the next step verifies the last sampled token plus drafts."""
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float = 0.0
    bucket: int = -1
    """Context bucket ``probs`` was computed for."""
    probs: tuple[float, ...] = ()
    """Conditional acceptance per draft position at the current context (cached per bucket)."""
    mus: tuple[float, ...] = ()
    """Probits of ``probs`` (adaptive verification only; cached per bucket)."""
    held: list[int] = field(default_factory=list)
    """Hashes of the prefix-cache blocks among ``blocks`` (hit or registered by this request)."""
    registered: int = 0
    """Leading prompt blocks already hit or offered to the prefix cache."""

    @property
    def sort_key(self) -> tuple[int, float, int]:
        return (self.req.priority, self.req.arrival_s, self.order)

    @property
    def total(self) -> int:
        return self.req.prompt_tokens + self.output_tokens


@dataclass(slots=True)
class _Batch:
    """What a step scheduled: decoding requests (1 + drafts tokens each) and prefill chunks."""

    k: int
    budget: int
    decode: list[_Seq] = field(default_factory=list)
    prefill: list[tuple[_Seq, int]] = field(default_factory=list)
    trimmed: dict[_Seq, int] = field(default_factory=dict)
    """Decoding requests whose drafts the token budget cut below k."""
    preempted: list[_Seq] = field(default_factory=list)


@dataclass(slots=True)
class _Executed:
    emitted: dict[str, int] = field(default_factory=dict)
    finished: list[str] = field(default_factory=list)
    gaps: dict[float, int] = field(default_factory=dict)
    """Last-token time → requests, to observe inter-token latencies in bulk."""


class EngineCore:
    """One simulated engine (a vLLM ``EngineCore``): scheduler, KV cache and the performance model.

    Read counters through ``stats`` (it folds the per-step accumulators into the ``EngineStats``).
    """

    def __init__(
        self,
        profile: Profile,
        control: SpeculationControl,
        *,
        max_num_seqs: int = 256,
        scheduling: SchedulingPolicy = "fcfs",
        seed: int = 0,
        kv_capacity_tokens: int | None = None,
        max_num_batched_tokens: int | None = None,
        adaptive: AdaptiveVerification | None = None,
        drafter_loaded: bool = True,
        prefix_caching: bool = True,
        idle_drafter: IdleDrafterMode = IdleDrafterMode.STOCK,
    ) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be ≥ 1, got {max_num_seqs}")
        self.profile = profile
        self.control = control
        self.max_num_seqs = max_num_seqs
        self.scheduling: SchedulingPolicy = scheduling
        self.k_max = profile.drafter.k_max
        capacity = kv_capacity_tokens if kv_capacity_tokens is not None else profile.hardware.kv_capacity_tokens
        self.total_blocks = capacity // KV_BLOCK_TOKENS
        if self.total_blocks < 1:
            raise ValueError(f"kv_capacity_tokens: must hold at least one {KV_BLOCK_TOKENS}-token block")
        self.max_num_batched_tokens = max_num_batched_tokens or profile.chunked_prefill_tokens
        self.now_s = 0.0
        self._rng = random.Random(seed)
        self._free_blocks = self.total_blocks
        self._running: list[_Seq] = []
        self._waiting: WaitingQueue[_Seq] = make_queue(scheduling)
        self._by_id: dict[str, _Seq] = {}
        self._order = 0
        self._accept_cache: dict[tuple[str, int], tuple[float, ...]] = {}
        self._accepted_hist = [0] * (self.k_max + 1)
        """Drafts by number of accepted tokens; per-position counts are its tail sums."""
        self._stats = EngineStats(k_max=self.k_max)
        self._probit_cache: dict[tuple[str, int], tuple[float, ...]] = {}
        self.adaptive: AdaptiveVerifier | None = None
        """Adaptive verification (None: every decoding request verifies the schedule's k)."""
        self.drafter_loaded = drafter_loaded
        self.idle_drafter = idle_drafter
        """Which idle-drafter tax term its k = 0 steps pay when ``drafter_loaded`` (``StepShape.idle_drafter``)."""
        self.prefix_cache = PrefixCache() if prefix_caching else None
        """vLLM's automatic prefix caching (``--enable-prefix-caching``, on by default in V1); None: off."""
        """The engine was started with its drafter (a speculative config): its k = 0 steps pay the idle-drafter
        tax. False: started without speculation, so it decodes at k = 0 whatever its schedule says."""
        if adaptive is not None:
            self.set_adaptive_verification(adaptive)

    def set_adaptive_verification(self, config: AdaptiveVerification | None) -> None:
        """Turn adaptive verification on with ``config`` (None: off). A start-up setting: call before stepping."""
        self.adaptive = AdaptiveVerifier(self.profile, config) if config is not None else None

    # ------------------------------------------------------------------------------------------ requests
    @property
    def kv_capacity_tokens(self) -> int:
        return self.total_blocks * KV_BLOCK_TOKENS

    def add(self, req: SimRequest) -> None:
        """Queue a request. Raises ``ValueError`` for a duplicate id or one that could never fit the KV cache."""
        if req.request_id in self._by_id:
            raise ValueError(f"request_id: {req.request_id!r} is already in the engine")
        if req.prompt_tokens < 1 or req.max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens: must be ≥ 1")
        need = req.prompt_tokens + req.max_tokens + self.k_max
        if need > self.kv_capacity_tokens:
            raise ValueError(
                f"prompt_tokens + max_tokens: {need - self.k_max} tokens cannot fit this engine's KV cache "
                f"of {self.kv_capacity_tokens} tokens"
            )
        seq = _Seq(req, self._order, req.request_id, req.max_tokens)
        self._order += 1
        self._by_id[req.request_id] = seq
        self._waiting.push(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request wherever it is; True if it was known. Its latency so far is recorded as finished."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return False
        if seq in self._running:
            self._running.remove(seq)
        else:
            self._waiting.remove(seq)
        self._free(seq)
        self._record_finish(seq, self.now_s)
        return True

    def has_work(self) -> bool:
        return bool(self._running) or len(self._waiting) > 0

    @property
    def prompt_tokens(self) -> int:
        """``stats.prompt_tokens`` without refreshing every gauge (the lab's router reads it per request)."""
        return self._stats.prompt_tokens

    @property
    def stats(self) -> EngineStats:
        s = self._stats
        s.running = len(self._running)
        s.waiting = len(self._waiting)
        s.kv_usage = 1.0 - self._free_blocks / self.total_blocks
        tail = 0
        for pos in range(self.k_max - 1, -1, -1):
            tail += self._accepted_hist[pos + 1]
            s.accepted_per_pos[pos] = tail
        return s

    # -------------------------------------------------------------------------------------------- a step
    def step(self) -> StepOutcome:
        """Schedule, time and execute one engine iteration starting at ``now_s`` (which it does not advance)."""
        self.control.expire()
        running = self._running
        ready = sum(map(_DECODING, running))
        k = min(self.control.k_for(ready), self.k_max) if ready and self.drafter_loaded else 0
        batch = _Batch(k=k, budget=self.max_num_batched_tokens)
        if running:
            self._schedule_running(batch)
        if not batch.preempted and len(self._waiting):
            self._admit_waiting(batch)
        prefill_tokens = sum(n for _, n in batch.prefill) if batch.prefill else 0
        decode_seqs = len(batch.decode)
        step_k = k if decode_seqs else 0
        context_tokens = sum(map(_COMPUTED, batch.decode))
        plan = None
        if self.adaptive is not None and step_k > 0:
            shape = StepShape(
                decode_seqs, step_k, context_tokens, prefill_tokens, self.drafter_loaded, self.idle_drafter
            )
            plan = self._plan_adaptive(batch, shape)
            t = plan.time
        else:
            t = step_time_of(
                self.profile,
                decode_seqs,
                step_k,
                context_tokens,
                prefill_tokens,
                self.drafter_loaded,
                self.idle_drafter,
            )
        end_s = self.now_s + t.total_s
        done = _Executed()
        if batch.decode:
            self._execute_decode(batch, end_s, done, plan)
        new_prompt = self._execute_prefill(batch, end_s, done) if batch.prefill else 0
        itl = self._stats.itl_s
        for last_s, count in done.gaps.items():
            itl.observe(end_s - last_s, count)
        emitted = done.emitted
        self._account(t.target_s, t.drafter_s, sum(emitted.values()), new_prompt)
        return StepOutcome(
            t.total_s,
            step_k,
            decode_seqs,
            prefill_tokens,
            emitted,
            done.finished,
            [s.req.request_id for s in batch.preempted] if batch.preempted else [],
            t.target_s,
            t.drafter_s,
        )

    def _schedule_running(self, batch: _Batch) -> None:
        k, block = batch.k, KV_BLOCK_TOKENS
        k1 = k + 1
        decode, prefill, trimmed, preempted = batch.decode, batch.prefill, batch.trimmed, batch.preempted
        for seq in list(self._running):
            budget = batch.budget
            if budget <= 0:
                break
            if seq.blocks == 0 and seq in preempted:
                continue  # preempted earlier in this step to make room for a request ahead of it
            computed = seq.computed
            if seq.decoding:
                n = k1 if budget > k else budget
            else:
                n = seq.req.prompt_tokens + seq.output_tokens - computed
                if n > budget:
                    n = budget
            if (computed + n + block - 1) // block > seq.blocks and not self._allocate(seq, computed + n, batch):
                continue  # seq itself was the victim
            batch.budget -= n
            if seq.decoding:
                decode.append(seq)
                if n <= k:
                    trimmed[seq] = n - 1
            else:
                prefill.append((seq, n))

    def _allocate(self, seq: _Seq, tokens: int, batch: _Batch) -> bool:
        """Grow ``seq``'s KV to hold ``tokens``, preempting others if needed; False if ``seq`` was preempted."""
        need = -(-tokens // KV_BLOCK_TOKENS) - seq.blocks
        while need > self._free_blocks:
            victim = self._victim()
            self._preempt(victim, batch)
            if victim is seq:
                return False
        self._take_blocks(need)
        seq.blocks += need
        return True

    def _victim(self) -> _Seq:
        if self.scheduling == "priority":
            return max(self._running, key=lambda s: s.sort_key)
        return self._running[-1]

    def _preempt(self, seq: _Seq, batch: _Batch) -> None:
        self._running.remove(seq)
        if seq in batch.decode:
            batch.decode.remove(seq)
            batch.budget += 1 + batch.trimmed.pop(seq, batch.k)
        for i, (s, n) in enumerate(batch.prefill):
            if s is seq:
                del batch.prefill[i]
                batch.budget += n
                break
        self._free(seq)
        seq.computed = 0
        seq.decoding = False
        batch.preempted.append(seq)
        self._waiting.push_front(seq)
        self._stats.num_preemptions += 1

    def _admit_waiting(self, batch: _Batch) -> None:
        while len(self._waiting) and batch.budget > 0 and len(self._running) < self.max_num_seqs:
            seq = self._waiting.peek()
            assert seq is not None
            hit, taken = self._cache_lookup(seq)
            computed = seq.computed + hit * KV_BLOCK_TOKENS
            n = min(seq.total - computed, batch.budget)
            need = -(-(computed + n) // KV_BLOCK_TOKENS) - seq.blocks - hit
            if need + taken > self._free_blocks:
                break
            self._waiting.pop()
            if self.prefix_cache is not None and seq.computed == 0:
                self._use_cached(seq, hit, taken)
            self._take_blocks(need)
            seq.blocks += need
            self._running.append(seq)
            if seq.scheduled_s is None:
                seq.scheduled_s = self.now_s
            batch.prefill.append((seq, n))
            batch.budget -= n

    def _plan_adaptive(self, batch: _Batch, shape: StepShape) -> VerifyPlan:
        assert self.adaptive is not None
        trimmed, k = batch.trimmed, batch.k
        caps = [trimmed.get(seq, k) if trimmed else k for seq in batch.decode]
        mus = []
        for seq in batch.decode:
            self._refresh_acceptance(seq)
            if not seq.mus:
                key = (seq.req.workload, seq.bucket)
                seq.mus = self._probit_cache.get(key) or self._probit_cache.setdefault(key, probits(seq.probs))
            mus.append(seq.mus)
        return self.adaptive.plan(mus, caps, shape, self._rng)

    def _refresh_acceptance(self, seq: _Seq) -> None:
        bucket = (seq.computed + 1) >> _CONTEXT_BUCKET_SHIFT
        if bucket != seq.bucket:
            seq.bucket, seq.probs, seq.mus = bucket, self._acceptance(seq.req.workload, bucket), ()

    # ------------------------------------------------------------------------------------------ execution
    def _execute_decode(self, batch: _Batch, end_s: float, done: _Executed, plan: VerifyPlan | None) -> None:
        """Verify each decoding request's drafts: accept position by position (or as ``plan`` verified them),
        emit 1 + accepted tokens."""
        rand = self._rng.random
        hist = self._accepted_hist
        emitted, gaps, trimmed, k = done.emitted, done.gaps, batch.trimmed, batch.k
        drafts_total = draft_tokens = accepted_total = 0
        verified = plan.verified if plan is not None else None
        accepted_by_plan = plan.accepted if plan is not None else None
        shift = _CONTEXT_BUCKET_SHIFT
        for index, seq in enumerate(batch.decode):
            drafts = trimmed.get(seq, k) if trimmed else k
            accepted = 0
            if drafts:
                if verified is not None and accepted_by_plan is not None:
                    drafts, accepted = verified[index], accepted_by_plan[index]
                else:
                    bucket = (seq.computed + 1) >> shift
                    if bucket != seq.bucket:
                        seq.bucket, seq.probs, seq.mus = bucket, self._acceptance(seq.req.workload, bucket), ()
                    probs = seq.probs
                    while accepted < drafts and rand() < probs[accepted]:
                        accepted += 1
                hist[accepted] += 1
                drafts_total += 1
                draft_tokens += drafts
                accepted_total += accepted
            out = 1 + accepted
            seq.computed += out
            room = seq.max_tokens - seq.output_tokens
            last = seq.last_token_s
            gaps[last] = gaps.get(last, 0) + 1
            seq.last_token_s = end_s
            if out >= room:
                seq.output_tokens += room
                emitted[seq.rid] = room
                done.finished.append(seq.rid)
                self._finish(seq, end_s)
            else:
                seq.output_tokens += out
                emitted[seq.rid] = out
        st = self._stats
        st.num_drafts += drafts_total
        st.num_draft_tokens += draft_tokens
        st.num_accepted_tokens += accepted_total

    def _execute_prefill(self, batch: _Batch, end_s: float, done: _Executed) -> int:
        """Advance prefill chunks; a request whose prompt (or recompute) completes samples one token.
        Returns the prompt tokens of requests that produced their first token (vLLM's prompt counter)."""
        new_prompt = 0
        for seq, n in batch.prefill:
            seq.computed += n
            if seq.registered < len(seq.req.block_hashes) and self.prefix_cache is not None:
                self._register_blocks(seq)
            if seq.computed < seq.total:
                continue  # more prompt chunks to go
            seq.decoding = True
            if seq.first_token_s is None:
                new_prompt += seq.req.prompt_tokens
                self._stats.prompt_tokens_cached += seq.req.cached_tokens
                seq.first_token_s = end_s
                self._stats.ttft_s.observe(end_s - seq.req.arrival_s)
            else:
                done.gaps[seq.last_token_s] = done.gaps.get(seq.last_token_s, 0) + 1
            seq.last_token_s = end_s
            seq.output_tokens += 1
            done.emitted[seq.rid] = 1
            if seq.output_tokens >= seq.max_tokens:
                done.finished.append(seq.rid)
                self._finish(seq, end_s)
        return new_prompt

    def _acceptance(self, workload: str, bucket: int) -> tuple[float, ...]:
        key = (workload, bucket)
        probs = self._accept_cache.get(key)
        if probs is None:
            probs = conditional_acceptance(self.profile, workload, bucket << _CONTEXT_BUCKET_SHIFT)
            self._accept_cache[key] = probs
        return probs

    def _finish(self, seq: _Seq, at_s: float) -> None:
        self._running.remove(seq)
        del self._by_id[seq.rid]
        self._free(seq)
        self._record_finish(seq, at_s)

    def _record_finish(self, seq: _Seq, at_s: float) -> None:
        st = self._stats
        st.finished_requests += 1
        st.e2e_s.observe(at_s - seq.req.arrival_s)
        if seq.scheduled_s is not None:
            st.queue_s.observe(seq.scheduled_s - seq.req.arrival_s)
        if seq.first_token_s is not None and seq.output_tokens > 1:
            st.tpot_s.observe((seq.last_token_s - seq.first_token_s) / (seq.output_tokens - 1))

    def _free(self, seq: _Seq) -> None:
        freed = seq.blocks
        if seq.held:
            assert self.prefix_cache is not None
            freed += self.prefix_cache.release(seq.held) - len(seq.held)  # shared blocks stay in use
            seq.held = []
        self._free_blocks += freed
        seq.blocks = 0

    # -------------------------------------------------------------------------------------- prefix cache
    def _take_blocks(self, n: int) -> None:
        """Use ``n`` free blocks: never-cached ones first, then the least recently used cached ones."""
        cache = self.prefix_cache
        if cache is not None:
            short = n - (self._free_blocks - cache.evictable)
            if short > 0:
                cache.evict(short)
        self._free_blocks -= n

    def _cache_lookup(self, seq: _Seq) -> tuple[int, int]:
        """``(hit, evictable)`` blocks of a waiting request's prompt in the prefix cache (``PrefixCache.lookup``),
        at most ``(tokens − 1) // 16`` blocks: vLLM recomputes the last token to get its logits."""
        hashes = seq.req.block_hashes
        if self.prefix_cache is None or not hashes or seq.computed:
            return 0, 0
        return self.prefix_cache.lookup(hashes, (seq.total - 1) // KV_BLOCK_TOKENS)

    def _use_cached(self, seq: _Seq, hit: int, taken: int) -> None:
        """Admit ``seq`` onto its ``hit`` cached blocks (``taken`` of them were evictable, counted as free);
        count the lookup as vLLM does: a request's first scheduling only, in tokens."""
        assert self.prefix_cache is not None
        held = list(seq.req.block_hashes[:hit])
        self.prefix_cache.acquire(held)
        seq.held, seq.registered = held, hit
        seq.blocks += hit
        seq.computed = hit * KV_BLOCK_TOKENS
        self._free_blocks -= taken
        if seq.scheduled_s is None:
            seq.req.cached_tokens = seq.computed
            self._stats.prefix_cache_queries += seq.req.prompt_tokens
            self._stats.prefix_cache_hits += seq.computed

    def _register_blocks(self, seq: _Seq) -> None:
        """Offer the prompt blocks ``seq`` has now computed in full to the prefix cache."""
        assert self.prefix_cache is not None
        hashes = seq.req.block_hashes
        full = min(seq.computed, seq.req.prompt_tokens) // KV_BLOCK_TOKENS
        full = min(full, len(hashes))
        for i in range(seq.registered, full):
            if self.prefix_cache.register(hashes[i]):
                seq.held.append(hashes[i])
        seq.registered = max(seq.registered, full)

    def _account(self, target_s: float, drafter_s: float, generated: int, new_prompt: int) -> None:
        st = self._stats
        st.steps += 1
        st.target_s += target_s
        st.drafter_s += drafter_s
        st.busy_s += target_s + drafter_s
        st.prompt_tokens += new_prompt
        st.generation_tokens += generated
        st.iteration_tokens.observe(generated + new_prompt)
