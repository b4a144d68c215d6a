"""Canary gate: new k values reach one worker first, the rest only after it ran them without regression.

A k is *validated* once the canary worker has run it for ``ticks`` consecutive windows in which its observed
per-sequence speed (tokens per request-step / step time) was at least ``1 − tolerance`` of what the policy had
predicted for that k. Other workers may move only to validated k values, except for safety moves (fast down,
stale default), which are never held back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.policy import Candidate
from controller.stabiliser import Action, ActionKind
from controller.window import Window

_SAFETY = frozenset({ActionKind.FAST_DOWN, ActionKind.STALE_DEFAULT, ActionKind.HOLD})


@dataclass
class CanaryGate:
    canary_id: str
    ticks: int
    tolerance: float = 0.2
    validated: set[int] = field(default_factory=set)
    trial_k: int | None = None
    trial_ok: int = 0

    def allows(self, worker_id: str, action: Action) -> bool:
        return worker_id == self.canary_id or action.kind in _SAFETY or action.k in self.validated

    def observe(self, worker_id: str, window: Window | None, predicted: Candidate | None) -> None:
        """Feed the canary's latest window and the prediction made for its k before that window."""
        if worker_id != self.canary_id or window is None or window.step_s is None:
            return
        if predicted is None or predicted.k != window.k:
            return
        observed_speed = (window.accepted_length or 1.0) / window.step_s
        predicted_speed = predicted.accepted_length / predicted.step_s
        if self.trial_k != window.k:
            self.trial_k, self.trial_ok = window.k, 0
        self.trial_ok = self.trial_ok + 1 if observed_speed >= (1 - self.tolerance) * predicted_speed else 0
        if self.trial_ok >= self.ticks:
            self.validated.add(window.k)
