"""The brownout switch: while it is on, new requests of a tier with ``brownout_max_tokens`` have their
``max_tokens`` capped there, so an overloaded fleet finishes more requests sooner.

The operator sets the mode through the admin API (``PUT /admin/v1/brownout``): ``on``, ``off`` or ``auto``.
In ``auto`` (the default when ``brownout_auto`` is set, else ``off``) the switch turns itself on once the
overload queue has been non-empty for ``brownout_after_s`` seconds without a break, and off again once it has
been empty for ``brownout_recover_s``. The state is this replica's own (each replica sees its own queue).
"""

from __future__ import annotations

from typing import Literal

from fleet.config import TierConfig
from gateway.upstream.body import CompletionRequest

Mode = Literal["on", "off", "auto"]
MODES: tuple[Mode, ...] = ("on", "off", "auto")


class Brownout:
    """The switch and its automatic trigger. Times are the clock's monotonic seconds."""

    def __init__(self, *, mode: Mode, after_s: float, recover_s: float) -> None:
        self.mode: Mode = mode
        self._after_s = after_s
        self._recover_s = recover_s
        self._auto_on = False
        self._since: float | None = None
        """When the queue last changed between empty and non-empty."""
        self._overloaded = False

    @property
    def active(self) -> bool:
        return self.mode == "on" or (self.mode == "auto" and self._auto_on)

    @property
    def auto_on(self) -> bool:
        """The automatic trigger's verdict (applied only in ``auto`` mode)."""
        return self._auto_on

    def observe(self, *, overloaded: bool, now: float) -> None:
        """Feed one tick's view: is any request queued?"""
        if overloaded != self._overloaded or self._since is None:
            self._overloaded, self._since = overloaded, now
        held = now - self._since
        if overloaded and held >= self._after_s:
            self._auto_on = True
        elif not overloaded and held >= self._recover_s:
            self._auto_on = False


def cap_max_tokens(req: CompletionRequest, tier: TierConfig, *, default_max_tokens: int) -> bool:
    """Lower ``req``'s ``max_tokens`` (body and reservation) to the tier's ``brownout_max_tokens``; False when the
    tier has no cap or the request already asks for no more."""
    cap = tier.brownout_max_tokens
    return cap is not None and req.cap_max_tokens(cap, default_max_tokens=default_max_tokens)
