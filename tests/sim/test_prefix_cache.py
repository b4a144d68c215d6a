"""The simulator's prefix cache: the LRU of blocks, the engine skipping cached prefill, and the sim's tokens."""

from __future__ import annotations

from fleet.clock import ManualClock
from fleet.perf import load_profile
from fleet.speculation import SpeculationControl, uniform_schedule
from workers.sim.engine import KV_BLOCK_TOKENS, EngineCore, SimRequest
from workers.sim.prefix_cache import PrefixCache
from workers.sim.prompt_tokens import BLOCK_TOKENS, SessionBlocks, block_hashes, chat_token_text, text_token_text
from workers.sim.text import count_chat_tokens, count_text_tokens

PROFILE = load_profile("kimi-k3-dspark-tp16")


# ---------------------------------------------------------------------------------------------- the LRU
def test_lookup_stops_at_the_first_miss_and_respects_the_cap() -> None:
    cache = PrefixCache()
    for h in (1, 2, 3, 5):
        assert cache.register(h)
    assert cache.lookup([1, 2, 3, 4, 5], 10) == (3, 0)
    assert cache.lookup([1, 2, 3], 2) == (2, 0)
    assert cache.lookup([9, 1], 10) == (0, 0)


def test_a_block_is_evictable_only_when_nobody_holds_it() -> None:
    cache = PrefixCache()
    cache.register(1)
    cache.acquire([1])  # a second request shares it
    assert cache.release([1]) == 0
    assert (cache.evictable, cache.cached) == (0, 1)
    assert cache.release([1]) == 1
    assert (cache.evictable, cache.cached) == (1, 1)
    assert cache.lookup([1], 1) == (1, 1)  # still a hit, one taken from the free blocks
    cache.acquire([1])
    assert cache.evictable == 0


def test_eviction_takes_the_least_recently_released_and_a_requests_tail_first() -> None:
    cache = PrefixCache()
    for h in (1, 2, 3):
        cache.register(h)
    cache.release([1, 2, 3])  # freed tail first: 3, 2, 1 in eviction order
    cache.register(10)
    cache.release([10])
    cache.evict(2)
    assert cache.lookup([1], 1) == (1, 1)
    assert cache.lookup([3], 1) == (0, 0)
    assert cache.lookup([2], 1) == (0, 0)
    assert cache.lookup([10], 1) == (1, 1)
    assert not cache.register(1)  # the first copy of a block stays the cached one


# --------------------------------------------------------------------------------------------- the engine
def _engine(*, kv_tokens: int = 64_000, caching: bool = True) -> EngineCore:
    control = SpeculationControl(
        worker_id="w", method="dspark", k_max=PROFILE.drafter.k_max, max_num_seqs=8,
        fallback=uniform_schedule(0, max_num_seqs=8), clock=ManualClock(),
    )  # fmt: skip
    return EngineCore(PROFILE, control, max_num_seqs=8, kv_capacity_tokens=kv_tokens, prefix_caching=caching)


def _serve(engine: EngineCore, req: SimRequest) -> tuple[float, int]:
    """Run ``req`` alone to completion; (seconds to its first token, prompt tokens prefilled)."""
    engine.add(req)
    start, first, prefilled = engine.now_s, None, 0
    for _ in range(10_000):
        if not engine.has_work():
            break
        out = engine.step()
        prefilled += out.prefill_tokens
        engine.now_s += out.duration_s
        if first is None and out.emitted:
            first = engine.now_s - start
    assert first is not None
    return first, prefilled


def test_a_shared_prefix_skips_its_prefill_and_is_counted_as_vllm_counts_it() -> None:
    engine = _engine()
    first_ttft, first_prefill = _serve(engine, SimRequest("a", 8000, 4, "chat", block_hashes=SessionBlocks(1, 8000)))
    assert first_prefill == 8000
    follow = SimRequest("b", 9000, 4, "chat", block_hashes=SessionBlocks(1, 9000))
    ttft, prefilled = _serve(engine, follow)
    assert follow.cached_tokens == 8000  # every full block of the first prompt
    assert prefilled == 1000
    assert ttft < first_ttft / 3
    st = engine.stats
    assert (st.prefix_cache_queries, st.prefix_cache_hits, st.prompt_tokens_cached) == (17_000, 8000, 8000)


def test_the_last_token_is_always_computed_and_caching_off_caches_nothing() -> None:
    engine = _engine()
    _serve(engine, SimRequest("a", 1600, 2, "chat", block_hashes=SessionBlocks(1, 1600)))
    again = SimRequest("b", 1600, 2, "chat", block_hashes=SessionBlocks(1, 1600))
    _, prefilled = _serve(engine, again)
    assert again.cached_tokens == 1600 - KV_BLOCK_TOKENS  # the whole prompt hit: its last block is recomputed
    assert prefilled == KV_BLOCK_TOKENS
    off = _engine(caching=False)
    _serve(off, SimRequest("a", 1600, 2, "chat", block_hashes=SessionBlocks(1, 1600)))
    again = SimRequest("b", 1600, 2, "chat", block_hashes=SessionBlocks(1, 1600))
    assert _serve(off, again)[1] == 1600
    assert (off.stats.prefix_cache_queries, again.cached_tokens) == (0, 0)


def test_the_cache_lives_in_the_kv_budget_and_keeps_a_shared_beginning_longest() -> None:
    engine = _engine(kv_tokens=20_000)
    _serve(engine, SimRequest("a", 8000, 4, "chat", block_hashes=SessionBlocks(1, 8000)))
    assert engine.stats.kv_usage == 0.0  # cached blocks count as free
    _serve(engine, SimRequest("big", 15_000, 4, "chat", block_hashes=SessionBlocks(2, 15_000)))
    again = SimRequest("c", 8000, 4, "chat", block_hashes=SessionBlocks(1, 8000))
    _serve(engine, again)
    free_blocks = engine.total_blocks - -(-(15_000 + 4) // KV_BLOCK_TOKENS)
    assert 0 < again.cached_tokens <= free_blocks * KV_BLOCK_TOKENS  # evicted down to what the big one left
    assert again.cached_tokens % KV_BLOCK_TOKENS == 0
    assert engine.prefix_cache is not None
    assert engine.prefix_cache.cached <= engine.total_blocks


def test_concurrent_requests_share_cached_blocks_and_free_them_once() -> None:
    engine = _engine(kv_tokens=20_000)
    _serve(engine, SimRequest("warm", 4000, 2, "chat", block_hashes=SessionBlocks(1, 4000)))
    for rid in ("x", "y"):
        engine.add(SimRequest(rid, 4800, 50, "chat", block_hashes=SessionBlocks(1, 4800)))
    engine.step()
    held = engine.total_blocks * (1 - engine.stats.kv_usage)
    # both hold the same 250 cached blocks; each adds its own 50 uncached ones (plus room for the step's tokens)
    assert engine.total_blocks - held < 250 + 2 * 60
    for _ in range(1000):
        if not engine.has_work():
            break
        engine.now_s += engine.step().duration_s
    assert engine.stats.kv_usage == 0.0


# -------------------------------------------------------------------------------------------- sim tokens
def test_chat_tokens_match_the_count_and_a_next_turn_shares_the_previous_messages() -> None:
    turn1 = [("system", "You are a coding agent. " * 40), ("user", "Fix the failing test in the parser module.")]
    text1 = chat_token_text(turn1)
    assert len(text1) // 4 == count_chat_tokens([c for _, c in turn1])
    turn2 = [*turn1, ("assistant", "I will read the test first. " * 10), ("user", "Go on.")]
    h1, h2 = block_hashes(text1), block_hashes(chat_token_text(turn2))
    shared = (len(text1) // 4 - 3) // BLOCK_TOKENS  # the messages, not the reply priming
    assert h1[:shared] == h2[:shared]
    other = [("system", "You are a coding agent! " * 40), *turn1[1:]]
    assert block_hashes(chat_token_text(other))[0] != h1[0]


def test_text_and_token_id_prompts_and_an_exact_length() -> None:
    prompt = "abcd" * 100
    assert len(text_token_text(prompt)) // 4 == count_text_tokens(prompt)
    base = block_hashes(text_token_text(prompt))
    assert len(base) == 100 // BLOCK_TOKENS
    assert block_hashes(text_token_text(prompt + "more text"))[: len(base)] == base
    assert len(block_hashes(list(range(40)))) == 2
    assert block_hashes(list(range(40)))[0] == block_hashes(list(range(16)))[0]
    padded = block_hashes(text_token_text(prompt), length=1000)
    assert len(padded) == 1000 // BLOCK_TOKENS
    assert padded[: len(base)] == base
    assert block_hashes(text_token_text(prompt + "x"), length=1000)[len(base) :] != padded[len(base) :]
    assert block_hashes(text_token_text(prompt), length=20) == base[:1]


def test_session_blocks_share_the_common_beginning_only() -> None:
    a, b = SessionBlocks(1, 4000, shared_tokens=1600), SessionBlocks(2, 4000, shared_tokens=1600)
    assert len(a) == 4000 // BLOCK_TOKENS
    assert list(a[:100]) == list(b[:100])
    assert a[100] != b[100]
    assert list(SessionBlocks(1, 8000, shared_tokens=1600)[: len(a)]) == list(a)
