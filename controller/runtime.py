"""The controller's memory of one worker (``WorkerRuntime``), which every stage of the tick reads and writes, and
the TPOT/TTFT targets a worker's loop decides against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controller.cost import WorkerCost
from controller.estimator import Estimate, WorkerEstimator
from controller.policy import Decision
from controller.stabiliser import Action, StabiliserState
from controller.window import Window
from fleet.config import TenantsConfig, TierConfig, WorkerConfig
from fleet.perf import Profile
from fleet.scrape import WorkerScrape
from fleet.speculation import FullSpeed, Schedule, SpeculationState


def _tightest(model: str, tenants: TenantsConfig, target: Callable[[TierConfig], float | None]) -> float | None:
    """The smallest ``target`` among the tiers of tenants allowed to use ``model`` (None: no tier has one)."""
    found = [v for t in tenants.tenants if t.allows(model) and (v := target(tenants.tiers[t.tier])) is not None]
    return min(found) if found else None


def tpot_target(model: str, tenants: TenantsConfig) -> float | None:
    """The tightest TPOT target among the tiers of tenants allowed to use ``model`` (seconds; None: none)."""
    return _tightest(model, tenants, lambda tier: tier.tpot_target_s)


def ttft_target(model: str, tenants: TenantsConfig) -> float | None:
    """The tightest TTFT target among the tiers of tenants allowed to use ``model`` (seconds; None: none)."""
    return _tightest(model, tenants, lambda tier: tier.ttft_target_s)


@dataclass
class WorkerRuntime:
    """The controller's memory of one worker."""

    config: WorkerConfig
    profile: Profile
    """The worker's own model's profile (``FleetConfig.profile_of``)."""
    estimator: WorkerEstimator
    tpot_target_s: float | None
    first_seen_s: float
    ttft_target_s: float | None = None
    """The tightest TTFT target of the tiers that may use the worker's model, seconds (None: none)."""
    prev: WorkerScrape | None = None
    last_ok_s: float | None = None
    stab: StabiliserState | None = None
    version: int | None = None
    k_applied: int | None = None
    schedule_applied: Schedule | None = None
    """The worker's applied schedule, as its last GET, PUT or scrape showed it."""
    lapsed: bool = False
    """The worker's last GET showed a version without a lease: it fell back to its start-up schedule, so the
    applied version names a schedule it no longer runs and the next PUT needs a new version."""
    full_speed: FullSpeed | None = None
    """What the worker advertises it runs at full speed (``SpeculationState.full_speed``), read with its version
    on the first GET and again after it restarts; None: every k at every batch size."""
    max_num_seqs: int | None = None
    """The worker's largest batch, from its start-up schedule (None until its first GET)."""
    renew_at_s: float = 0.0
    rebase: bool = False
    window: Window | None = None
    estimate: Estimate | None = None
    decision: Decision | None = None
    action: Action | None = None
    cost: WorkerCost | None = None
    savings_usd: float = 0.0
    usd_since_attribution: float = 0.0
    """The worker's cost since the last tenant attribution, USD (all time, whether or not a window was usable)."""
    elapsed_s: float = 0.0
    """Seconds between the last two successful scrapes."""
    stale_since_s: float | None = None
    switches: list[tuple[float, int]] = field(default_factory=list)
    """``(controller time, k)`` for every applied change (for reports and flap checks)."""
    drafter_loaded: bool = True
    """Runs with its drafter (``controller.gear_mode``); a drafter-free worker is held at k = 0, never actuated."""

    @property
    def k_desired(self) -> int | None:
        return self.stab.k if self.stab else None

    @property
    def k_max(self) -> int:
        """The largest k the worker and its profile's drafter both allow."""
        return min(self.config.drafter.k_max, self.profile.drafter.k_max)

    @property
    def seqs(self) -> int:
        """The worker's largest batch: from its start-up schedule once read, else its fleet file's."""
        return self.max_num_seqs or self.config.max_num_seqs

    def learn(self, state: SpeculationState) -> None:
        """Take in what the worker's control endpoint (GET or PUT) says it runs."""
        self.version = state.version
        self.lapsed = state.version > 0 and state.lease_expires_at is None
        self.k_applied = max(row[2] for row in state.schedule)
        self.schedule_applied = tuple((lo, hi, k) for lo, hi, k in state.schedule)
