"""Full-speed gears on a GPU vLLM worker: the start-up table and capture sizes that give every k a CUDA graph.

Pure: no vLLM import. What it relies on, read from vLLM 0.32 with Model Runner V2
(``vllm/v1/worker/gpu/cudagraph_utils.py``, ``CudaGraphManager._init_candidates`` and ``dispatch``):

- uniform-decode graphs are captured only for the query lengths ``{k + 1 for k in dense_schedule[1:]}`` of the
  *start-up* ``num_speculative_tokens_per_batch_size`` (the plugin rewrites the table later; the graphs stay).
  So every gear needs a row in the start-up table: one batch size each (a "sacrificial" row) is enough;
- each capture size ``s`` becomes, per query length ``q``, a graph of ``round_up(s, q)`` tokens, kept when it
  is within ``max_cudagraph_capture_size`` and ``max_num_seqs`` requests;
- ``dispatch`` of ``n`` requests at query length ``q`` looks only at the graphs of the *smallest* captured token
  count ≥ ``n·q``. With several query lengths, a token count captured for one of them shadows the larger
  graphs of the others (e.g. sizes ``[1, 2, 4, 8]`` with query lengths 1 and 3: 3 tokens are captured for
  ``q = 3``, so three requests at ``k = 0`` find no graph and run without one). Writing every ``n·q`` as a
  capture size gives each (k, n) its exact graph.

What the GPU then captures is checked against vLLM's own code by ``tests/vllm/test_capture_coverage.py``; the
worker advertises what its model runner really captured (``internals.worker_full_speed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.fallback import fallback_table, general_mix
from fleet.perf import Profile
from fleet.speculation import FullSpeed, Schedule, full_speed_rows

DEFAULT_CAPTURE_CEILING = 512
"""vLLM 0.32's default ceiling on captured tokens off data-centre Blackwell (1024 there): the most this plan
captures when the worker names no ``--max-cudagraph-capture-size``."""
CAPTURE_CEILING_FLAG = "--max-cudagraph-capture-size"
CAPTURE_SIZES_FLAG = "--cudagraph-capture-sizes"


@dataclass(frozen=True)
class GearPlan:
    """The start-up table and capture sizes of one GPU worker, and the full-speed set they should give."""

    k_max: int
    max_num_seqs: int
    ceiling: int
    """Most tokens in one captured graph: the worker's ``--max-cudagraph-capture-size``, else the default."""
    gears: tuple[int, ...]
    """The k values with a start-up row (ascending): every k when ``max_num_seqs > k_max``."""
    table: Schedule
    """``num_speculative_tokens_per_batch_size`` rows ``(from_bs, to_bs, k)``: with a profile, its fallback table
    (what runs when no controller does); else k_max from batch size 1, then one batch size per lower gear at the
    top, k falling as the batch grows."""
    capture_sizes: tuple[int, ...]
    """``--cudagraph-capture-sizes``: every uniform decode size ``n·(k+1)`` within the ceiling."""

    def expected_full_speed(self) -> FullSpeed:
        """``(k, from_bs, to_bs)`` rows: gear k at every batch size whose decode step fits the ceiling."""
        return full_speed_rows(
            (k, n) for k in self.gears for n in range(1, self.max_num_seqs + 1) if n * (k + 1) <= self.ceiling
        )


def gear_priority(k_max: int) -> tuple[int, ...]:
    """Which gears keep a start-up row when ``max_num_seqs`` leaves too few: k_max, off, then short to long."""
    return (k_max, *range(k_max))


def capture_ceiling(extra_args: Sequence[str], *, k_max: int, max_num_seqs: int) -> tuple[int, bool]:
    """The capture ceiling in tokens, and whether the worker's ``extra_args`` named it."""
    for i, arg in enumerate(extra_args):
        if arg == CAPTURE_CEILING_FLAG and i + 1 < len(extra_args):
            return int(extra_args[i + 1]), True
        if arg.startswith(CAPTURE_CEILING_FLAG + "="):
            return int(arg.split("=", 1)[1]), True
    return min(max_num_seqs * (k_max + 1), DEFAULT_CAPTURE_CEILING), False


def gear_plan(
    *, k_max: int, max_num_seqs: int, extra_args: Sequence[str] = (), profile: Profile | None = None
) -> GearPlan:
    """The plan for a worker of ``k_max`` and ``max_num_seqs`` whose further vLLM arguments are ``extra_args``.
    With its ``profile`` the start-up table is the fallback table (``fleet.fallback``: tuned for the general
    mix, each sacrificial row where it costs least); without, k_max then one batch size per gear at the top."""
    ceiling, named = capture_ceiling(extra_args, k_max=k_max, max_num_seqs=max_num_seqs)
    gears = tuple(sorted(gear_priority(k_max)[:max_num_seqs]))
    lower = sorted((k for k in gears if k != k_max), reverse=True)
    top = max_num_seqs - len(lower)
    table: list[tuple[int, int, int]] = [(1, top, k_max)]
    table += [(top + 1 + i, top + 1 + i, k) for i, k in enumerate(lower)]
    if profile is not None:
        table = list(fallback_table(profile, general_mix(profile), max_num_seqs=max_num_seqs, gears=gears))
    sizes = {n * (k + 1) for k in gears for n in range(1, max_num_seqs + 1) if n * (k + 1) <= ceiling}
    if named:
        sizes.add(ceiling)  # vLLM refuses a named ceiling that differs from the largest named size
    return GearPlan(
        k_max=k_max,
        max_num_seqs=max_num_seqs,
        ceiling=ceiling,
        gears=gears,
        table=tuple(table),
        capture_sizes=tuple(sorted(sizes)),
    )
