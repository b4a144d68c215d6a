"""Counter deltas between two scrapes of one worker, over a window in which k was constant.

A window is refused (``WindowBreak``) when the worker restarted (a counter went backwards), when its applied
speculation version or schedule changed between the scrapes (the window mixes two k), or when no time passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleet.scrape import COUNTER_FIELDS, WorkerScrape


class WindowBreak(ValueError):
    """The two scrapes do not form a usable window; the message says why."""


@dataclass(frozen=True, slots=True)
class Window:
    """What one worker did between two scrapes. Counts are deltas; gauges are the mean of both ends."""

    duration_s: float
    k: int
    """The k in force through the window."""
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_pos: tuple[float, ...]
    preemptions: float
    generation_tokens: float
    prompt_tokens: float
    steps: float
    running: float
    waiting: float
    kv_usage: float
    """KV usage at the end of the window (the risk is about now), 0…1."""
    busy: bool
    """The engine had requests at both ends and stepped in between, so ``duration_s / steps`` is a step time."""

    @property
    def accepted_length(self) -> float | None:
        """Observed mean tokens per decoding request-step, 1 + accepted/drafts; None without drafts."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def decode_batch(self) -> float:
        """Mean decoding sequences per engine step over the window.

        With drafting on, every decoding request-step is one draft, so drafts/steps is exact; with k = 0 it
        is generation tokens per step (one token per decoding sequence). Never the instantaneous gauge.
        """
        if self.steps <= 0:
            return 0.0
        if self.k > 0 and self.drafts > 0:
            return self.drafts / self.steps
        return self.generation_tokens / self.steps

    @property
    def step_s(self) -> float | None:
        """Observed mean engine step time, seconds, when the engine was busy throughout; else None."""
        return self.duration_s / self.steps if self.busy and self.steps > 0 else None


def window_between(prev: WorkerScrape, cur: WorkerScrape, *, k: int) -> Window:
    """The window from ``prev`` to ``cur``; ``k`` is the k the controller knows to be applied, used when the
    worker does not export its schedule. Raises ``WindowBreak``."""
    duration = cur.at_s - prev.at_s
    if duration <= 0:
        raise WindowBreak("no time passed between the scrapes")
    delta = cur - prev
    for name in COUNTER_FIELDS:
        if getattr(delta, name) < 0:
            raise WindowBreak(f"counter reset: {name} went backwards (worker restarted)")
    if prev.spec_version != cur.spec_version or prev.spec_schedule != cur.spec_schedule:
        raise WindowBreak("speculation schedule changed inside the window")
    if cur.spec_k is not None:
        k = cur.spec_k
    return Window(
        duration_s=duration,
        k=k,
        drafts=delta.drafts,
        draft_tokens=delta.draft_tokens,
        accepted=delta.accepted,
        accepted_per_pos=tuple(max(v, 0.0) for v in delta.accepted_per_pos),
        preemptions=delta.preemptions,
        generation_tokens=delta.generation_tokens,
        prompt_tokens=delta.prompt_tokens,
        steps=delta.steps,
        running=(prev.running + cur.running) / 2,
        waiting=(prev.waiting + cur.waiting) / 2,
        kv_usage=cur.kv_usage,
        busy=prev.running > 0 and cur.running > 0 and delta.steps > 0,
    )
