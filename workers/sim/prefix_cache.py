"""The simulated engine's prefix cache: KV blocks by block hash, shared while in use, evicted least recently used.

As vLLM's automatic prefix caching (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``) does it, in block
counts rather than block objects:

- A full prompt block a request has computed is *registered* under its hash (``workers.sim.prompt_tokens``); a
  block whose hash is already cached stays the request's own (the first copy wins).
- A new request *hits* the longest run of leading block hashes found in the cache, at most
  ``(prompt tokens − 1) // 16`` blocks (vLLM recomputes the last token to get logits). Those tokens skip prefill.
- A block in use counts references; when the last request holding it ends (or is preempted) it becomes
  *evictable*: still cached, but free to be taken. The cache is therefore sized by the engine's KV budget: a
  cached block occupies one of the engine's blocks until the engine needs it for new work.
- The engine takes never-cached free blocks first, then evicts the least recently released cached blocks.
  (vLLM's free queue holds both in one order; the difference is in which cold block goes first.)

Only prompt blocks are cached: the simulator's output tokens have no identity a later prompt could repeat.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """Which block hashes are cached, which of them are in use (and by how many requests), and the eviction
    order of the rest. Counts are blocks."""

    def __init__(self) -> None:
        self._refs: dict[int, int] = {}
        """Hash → running requests holding the block (≥ 1)."""
        self._evictable: OrderedDict[int, None] = OrderedDict()
        """Cached blocks nobody holds, least recently released first."""

    @property
    def evictable(self) -> int:
        """Cached blocks free to be taken (they count as free KV blocks)."""
        return len(self._evictable)

    @property
    def cached(self) -> int:
        """Every cached block, in use or evictable."""
        return len(self._refs) + len(self._evictable)

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> tuple[int, int]:
        """``(hit, evictable)``: the leading blocks of ``hashes`` (at most ``max_blocks``) that are cached, and
        how many of those are evictable (taking them uses free blocks). Changes nothing."""
        hit = evictable = 0
        refs, free = self._refs, self._evictable
        for h in hashes[: max(0, max_blocks)]:
            if h in refs:
                hit += 1
            elif h in free:
                hit += 1
                evictable += 1
            else:
                break
        return hit, evictable

    def acquire(self, hashes: Sequence[int]) -> None:
        """Hold every block of ``hashes`` (all cached: a ``lookup`` hit)."""
        refs, free = self._refs, self._evictable
        for h in hashes:
            if h in free:
                del free[h]
            refs[h] = refs.get(h, 0) + 1

    def register(self, block_hash: int) -> bool:
        """Cache a block a request has just computed and holds; False (the block stays the request's own) when
        that hash is cached already."""
        if block_hash in self._refs or block_hash in self._evictable:
            return False
        self._refs[block_hash] = 1
        return True

    def release(self, hashes: Sequence[int]) -> int:
        """Drop one hold on each of ``hashes``; returns how many blocks nobody holds any more (now evictable,
        the most recently released last, the request's later blocks before its earlier ones: vLLM frees a
        request's blocks tail first, so a shared beginning outlives its tail)."""
        freed = 0
        refs, free = self._refs, self._evictable
        for h in reversed(hashes):
            n = refs[h] - 1
            if n:
                refs[h] = n
            else:
                del refs[h]
                free[h] = None
                freed += 1
        return freed

    def evict(self, blocks: int) -> None:
        """Forget the ``blocks`` least recently released evictable blocks (the engine reuses their memory)."""
        free = self._evictable
        for _ in range(min(blocks, len(free))):
            free.popitem(last=False)
