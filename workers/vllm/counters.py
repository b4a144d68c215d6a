"""vLLM's speculative-decoding counters read off a ``/metrics`` text: the evidence that k changed.

Pure functions over Prometheus text (parsed with ``prometheus_client``'s parser), summed over every
``engine``/``model_name`` label set. Names come from ``fleet.vllm_metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from fleet import vllm_metrics as names


@dataclass(frozen=True)
class SpecCounters:
    """Running totals since the engine started (counts of drafts and of tokens)."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_pos: tuple[float, ...] = ()
    """Accepted draft tokens by position 0 … k_max-1."""
    generation_tokens: float = 0.0

    def __sub__(self, earlier: SpecCounters) -> SpecCounters:
        return self._combine(earlier, -1.0)

    def __add__(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, 1.0)

    def _combine(self, other: SpecCounters, sign: float) -> SpecCounters:
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        mine = self.accepted_per_pos + (0.0,) * (width - len(self.accepted_per_pos))
        theirs = other.accepted_per_pos + (0.0,) * (width - len(other.accepted_per_pos))
        return SpecCounters(
            drafts=self.drafts + sign * other.drafts,
            draft_tokens=self.draft_tokens + sign * other.draft_tokens,
            accepted=self.accepted + sign * other.accepted,
            accepted_per_pos=tuple(a + sign * b for a, b in zip(mine, theirs, strict=True)),
            generation_tokens=self.generation_tokens + sign * other.generation_tokens,
        )

    @property
    def draft_tokens_per_draft(self) -> float | None:
        """Mean proposed draft length (≤ k: ngram proposes fewer when its match sits near the end)."""
        return self.draft_tokens / self.drafts if self.drafts else None

    @property
    def tokens_per_draft(self) -> float | None:
        """Mean tokens emitted per verifying step that carried a draft: 1 + accepted / drafts."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def longest_accepted_position(self) -> int:
        """Highest draft position (0-based) with an accepted token; -1 when none was accepted."""
        return max((i for i, v in enumerate(self.accepted_per_pos) if v > 0), default=-1)


_SCALARS = {
    names.SPEC_DECODE_NUM_DRAFTS: "drafts",
    names.SPEC_DECODE_NUM_DRAFT_TOKENS: "draft_tokens",
    names.SPEC_DECODE_NUM_ACCEPTED_TOKENS: "accepted",
    names.GENERATION_TOKENS: "generation_tokens",
}


def parse_spec_counters(text: str) -> SpecCounters:
    """Totals of vLLM's speculative-decoding and generation counters in a ``/metrics`` exposition."""
    totals = dict.fromkeys(_SCALARS.values(), 0.0)
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name in _SCALARS:
                totals[_SCALARS[family.name]] += sample.value
            elif family.name == names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS:
                pos = int(sample.labels[names.LABEL_POSITION])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
    positions = tuple(per_pos.get(i, 0.0) for i in range(max(per_pos, default=-1) + 1))
    return SpecCounters(accepted_per_pos=positions, **totals)
