"""What a worker runs at full speed, as the controller uses it (``SpeculationState.full_speed``, issue 14).

A GPU vLLM worker advertises in ``GET /gearshift/v1/speculation`` the ``(k, from_bs, to_bs)`` rows that replay a
captured CUDA graph; any other (k, batch size) runs eager, slower than the profile predicts, and a PUT that asks
for one is refused (400). Null (the simulator, the CPU build): every k at every batch size. So:

- ``excluded_reason``: at the expected decode batch B (the window mean, rounded: ``expected_batch_size``) a k is
  a candidate when one of its rows has lo ≤ b ≤ hi; where no k has one (a batch wider than every captured
  graph, where every k runs the same slow path) every k is;
- ``gear_schedule``: the chosen k becomes a schedule that uses only advertised pairs: k at every batch size
  where (k, bs) is advertised or no k is, elsewhere the largest advertised k below it (else the smallest above),
  so ``check_full_speed`` passes on it by construction (the loop checks again before each PUT). A one-row
  ``[[1, max_num_seqs, k]]`` would be refused wherever k has no graph and a lower gear has one.
"""

from __future__ import annotations

from collections.abc import Iterable

from fleet.speculation import FullSpeed, Schedule


def advertised_gears(k_max: int, full_speed: FullSpeed | None, k_tiers: Iterable[int] | None = None) -> tuple[int, ...]:
    """Every gear a worker may be given: each k in 0…``k_max`` it runs at full speed at some batch size (every k
    when it advertises nothing), restricted to the operator's ``k_tiers`` when set (issue 25: a fixed tier list
    left k = 7 on a k_max = 7 checkpoint out of the candidates)."""
    fast = None if full_speed is None else {k for k, _, _ in full_speed}
    allowed = set(range(k_max + 1)) if k_tiers is None else {k for k in k_tiers if 0 <= k <= k_max}
    return tuple(sorted(k for k in allowed if fast is None or k in fast))


def expected_batch_size(batch: float) -> int:
    """The batch size the controller expects: the mean decode batch rounded, at least 1."""
    return max(1, round(batch))


def _ks_at(full_speed: FullSpeed, bs: int) -> set[int]:
    return {k for k, lo, hi in full_speed if lo <= bs <= hi}


def excluded_reason(k: int, full_speed: FullSpeed | None, batch: float) -> str:
    """Why ``k`` is not a candidate at mean decode batch ``batch`` ('' when it is one)."""
    if full_speed is None:
        return ""
    bs = expected_batch_size(batch)
    ks = _ks_at(full_speed, bs)
    if not ks or k in ks:
        return ""
    ranges = [f"{lo}-{hi}" for k_row, lo, hi in full_speed if k_row == k]
    where = f"batch sizes {', '.join(ranges)}" if ranges else "no batch size"
    return f"k={k} not at full speed at batch {bs} (advertised for {where})"


def advertised_text(full_speed: FullSpeed | None) -> str:
    """The advertised set, one phrase per k: ``k=0: 1-8; k=1: 1-4`` (or every k when nothing is advertised)."""
    if full_speed is None:
        return "every k at every batch size (nothing advertised)"
    by_k: dict[int, list[str]] = {}
    for k, lo, hi in full_speed:
        by_k.setdefault(k, []).append(f"{lo}-{hi}")
    return "; ".join(f"k={k}: {', '.join(r)}" for k, r in sorted(by_k.items()))


def _gear_at(k: int, full_speed: FullSpeed, bs: int) -> int:
    ks = _ks_at(full_speed, bs)
    if not ks or k in ks:
        return k
    below = [g for g in ks if g < k]
    return max(below) if below else min(ks)


def gear_schedule(k: int, full_speed: FullSpeed, *, max_num_seqs: int) -> Schedule:
    """The schedule that runs ``k`` wherever it is at full speed and the nearest lower advertised gear elsewhere."""
    rows: list[tuple[int, int, int]] = []
    for bs in range(1, max_num_seqs + 1):
        g = _gear_at(k, full_speed, bs)
        if rows and rows[-1][2] == g:
            rows[-1] = (rows[-1][0], bs, g)
        else:
            rows.append((bs, bs, g))
    return tuple(rows)
