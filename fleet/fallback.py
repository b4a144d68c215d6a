"""The worker's start-up table: what runs when no controller does, so it must do no harm.

Two pure steps on the shared performance model (``fleet.capacity``):

- ``tuned_table``: vLLM's ``num_speculative_tokens_per_batch_size`` tuned offline for a traffic mix, the best
  static k per batch-size band (1, 2–3, 4–7, …, 128–max). The lab runs it as its ``vllm-table`` baseline
  (``bench.policy.suite``); the worker runs it for ``general_mix`` (every acceptance class of the profile alike).
- ``fallback_table``: that table, tuned per batch size (a band of one each, so no batch runs a band's
  compromise), with one batch size given to each gear it lacks, because Model Runner V2
  captures a decode graph only for the gears of the start-up table (``workers.vllm.gears``). Each such
  sacrificial row goes where the predicted relative goodput loss is smallest: a batch size the KV cache never
  reaches costs nothing, and the rows go to the batch sizes just under the reach: a saturated worker sits at
  the reach (the old table ran k = 0 there) and a quiet one at small batch sizes (a closed loop of c clients sits
  at exactly c: a row at batch 4 cost the lab's concurrency-4 phase 60 %), while the sizes just under the full
  batch are only passed through as the batch fills or drains. Elsewhere only when those cannot hold every gear.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.capacity import MixPoint, best_k, max_batch, throughput
from fleet.perf import Profile
from fleet.speculation import Schedule

TABLE_BANDS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
"""Lower edges of the batch-size bands a tuned table gives one k each."""
GENERAL_PROMPT_TOKENS = 1024.0
GENERAL_OUTPUT_TOKENS = 256.0
"""Mean request shape of the general mix: a chat-sized prompt and answer."""


def general_mix(profile: Profile) -> MixPoint:
    """Every acceptance class of ``profile`` weighted alike, at the general request shape."""
    return MixPoint(
        workloads=tuple((name, 1.0) for name in profile.classes),
        prompt_tokens=GENERAL_PROMPT_TOKENS,
        output_tokens=GENERAL_OUTPUT_TOKENS,
    )


def tuned_table(profile: Profile, mix: MixPoint, max_num_seqs: int, *, bands: Sequence[int] = TABLE_BANDS) -> Schedule:
    """The best static k per batch-size band (lower edges ``bands``) up to ``max_num_seqs``, adjacent equal
    bands merged."""
    rows: list[list[int]] = []
    bands = [b for b in bands if b <= max_num_seqs]
    reachable = max_batch(profile, mix, max_num_seqs)
    for i, lo in enumerate(bands):
        hi = bands[i + 1] - 1 if i + 1 < len(bands) else max_num_seqs
        probe = max(lo, min(hi, round((lo * hi) ** 0.5), reachable))
        k = best_k(profile, mix, probe)
        if rows and rows[-1][2] == k:
            rows[-1][1] = hi
        else:
            rows.append([lo, hi, k])
    return tuple((a, b, k) for a, b, k in rows)


def dense(table: Schedule, max_num_seqs: int) -> list[int]:
    """k for batch sizes 1…max_num_seqs (index ``batch - 1``); a batch size no row covers raises."""
    out: list[int | None] = [None] * max_num_seqs
    for lo, hi, k in table:
        for batch in range(lo, min(hi, max_num_seqs) + 1):
            out[batch - 1] = k
    if any(k is None for k in out):
        missing = [i + 1 for i, k in enumerate(out) if k is None]
        raise ValueError(f"table {table} leaves batch sizes {missing} uncovered")
    return [k for k in out if k is not None]


def rows_of(ks: Sequence[int]) -> Schedule:
    """The ``(from_bs, to_bs, k)`` rows of a dense list, equal neighbours merged."""
    rows: list[list[int]] = []
    for i, k in enumerate(ks, start=1):
        if rows and rows[-1][2] == k:
            rows[-1][1] = i
        else:
            rows.append([i, i, k])
    return tuple((a, b, k) for a, b, k in rows)


def goodput(profile: Profile, mix: MixPoint, batch: int, k: int) -> float:
    """Predicted output tokens/s of one worker decoding ``batch`` sequences at ``k``."""
    return throughput(profile, mix, batch, k)[0]


def placement_loss(profile: Profile, mix: MixPoint, batch: int, *, k_from: int, k_to: int, reachable: int) -> float:
    """Relative goodput lost at ``batch`` by running ``k_to`` instead of ``k_from``; 0 past the KV cache's reach
    (the worker never holds that many sequences for this mix)."""
    if batch > reachable:
        return 0.0
    before = goodput(profile, mix, batch, k_from)
    return (before - goodput(profile, mix, batch, k_to)) / before


def fallback_table(profile: Profile, mix: MixPoint, *, max_num_seqs: int, gears: Sequence[int]) -> Schedule:
    """The table tuned per batch size, with one batch size for each of ``gears`` it lacks: the assignment of
    least summed loss (exact, by dynamic programming over the missing gears) among the batch sizes just under the
    KV cache's reach (or past it), others only when those cannot hold every gear; a batch size is taken only
    from a k that keeps another."""
    if len(set(gears)) > max_num_seqs:
        raise ValueError(f"{len(set(gears))} gears need {len(set(gears))} batch sizes; max_num_seqs is {max_num_seqs}")
    ks = dense(tuned_table(profile, mix, max_num_seqs, bands=range(1, max_num_seqs + 1)), max_num_seqs)
    reachable = max_batch(profile, mix, max_num_seqs)
    missing = sorted(set(gears) - set(ks))
    spare = {k: ks.count(k) - 1 for k in set(ks)}
    window = range(max(2, reachable - len(missing)), reachable)
    penalty = 1.0 if len(window) >= len(missing) else 0.0
    cost = [
        [
            placement_loss(profile, mix, b, k_from=ks[b - 1], k_to=g, reachable=reachable)
            + (penalty if b <= reachable and b not in window else 0.0)
            for g in missing
        ]
        for b in range(1, max_num_seqs + 1)
    ]
    for batch, gear in _assign(cost, ks, spare, len(missing)):
        ks[batch - 1] = missing[gear]
    return rows_of(ks)


def _assign(cost: list[list[float]], ks: list[int], spare: dict[int, int], m: int) -> list[tuple[int, int]]:
    """``(batch, gear index)`` pairs of least summed ``cost[batch - 1][gear]``, each gear once, each batch at most
    once, no k giving up more batch sizes than ``spare[k]`` (ties: later batches)."""
    full = (1 << m) - 1
    # best[mask] = (cost, picks, used per k) over the batches seen so far
    best: dict[int, tuple[float, tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]] = {0: (0.0, (), ())}
    for b in range(len(cost), 0, -1):
        nxt = dict(best)
        for mask, (total, picks, used) in best.items():
            taken = dict(used).get(ks[b - 1], 0)
            if taken >= spare[ks[b - 1]]:
                continue
            for g in range(m):
                if mask >> g & 1:
                    continue
                new_mask, new_total = mask | 1 << g, total + cost[b - 1][g]
                if new_mask not in nxt or new_total < nxt[new_mask][0] - 1e-12:
                    new_used = tuple(sorted({**dict(used), ks[b - 1]: taken + 1}.items()))
                    nxt[new_mask] = (new_total, (*picks, (b, g)), new_used)
        best = nxt
    if full not in best:
        raise ValueError("the start-up table cannot give every gear a batch size")
    return list(best[full][1])
