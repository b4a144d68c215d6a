"""What a fault did, from what the clients saw and what the ledger holds: pure functions, no I/O.

- **Failures**: every request that did not end in a normal answer, except the intended ones (a limited tenant's
  429, a stream the client dropped on purpose). A failure is *clean* when the client got an answer it can act on:
  a non-200 status with an OpenAI error body, or a 200 stream that ended with an error event and ``[DONE]``.
  A request to a replica the fault SIGKILLed, in flight at the kill or sent before the bench marked it down, can
  only break: it is counted apart (``broken_by_kill``) and not held against cleanliness.
- **Ledger**: ``bench.soak.ledger.ledger_diff`` (the soak's exact check): each answered request, by its
  ``x-request-id``, once in the ledger with the tokens its usage block gave; no record of a request no client saw.
- **Over-admission** per limit, against the bound of ``docs/operations/outages.md``: RPM and TPM as the most
  admitted in any 60 s (by ``admitted_at``), concurrency as the most requests whose ``[admitted_at, at]`` overlap,
  budget as the spend counter. The budget's bound is the requests in flight when it ran out, plus, with budget
  leases (``gateway.intake.leases``), what the other replicas billed within one lease's life: a replica serving from
  its lease checks the spend counter it last read (up to ``lease_ttl_s`` old) plus its own unbilled spend, so the
  other replicas' spend since that read is not seen.
- **Time to recover**: from the fault's end to the start of the first request after which every request of the
  fault succeeded.

Times are ``time.monotonic()`` seconds for the clients' view and Unix seconds in ledger records.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bench.chaos.load import Sent
from bench.limits import max_overlap
from fleet.store.protocol import UsageRecord

WINDOW_S = 60.0
"""The rolling window of RPM and TPM."""
RPM_BUCKET_SLACK = 0.01
"""A rolling window kept in 100 buckets admits up to 1 % over its limit at the bucket edges (``bench.limits``)."""


@dataclass(frozen=True, slots=True)
class Kill:
    """A replica SIGKILLed at ``at`` (monotonic) and skipped by the clients from ``noticed_at``."""

    gateway: int
    at: float
    noticed_at: float


def intended(sent: Sent) -> bool:
    """A refusal or a drop the bench asked for: a limited tenant's 429, or a stream dropped on purpose."""
    return sent.disconnected or (sent.result.status == 429 and sent.role != "free")


def broken_by_kill(sent: Sent, kills: Sequence[Kill]) -> bool:
    r = sent.result
    return r.transport_error is not None and any(
        sent.gateway == k.gateway and r.started <= k.noticed_at and r.ended >= k.at for k in kills
    )


def clean(sent: Sent) -> bool:
    """The failure gave the client an answer: a non-200 with an error body, or an error event then ``[DONE]``."""
    r = sent.result
    if r.transport_error is not None:
        return False
    if r.status != 200:
        return r.error is not None and r.error.get("type") != "not_json"
    return r.error is not None and r.error.get("type") != "malformed_event" and r.done


def kind(sent: Sent) -> str:
    """``StreamResult.error_type``, with a client that gave up waiting (its own timeout) told apart from a broken
    connection."""
    r = sent.result
    if r.transport_error is not None and r.transport_error.startswith("TimeoutError"):
        return "client_timeout"
    return r.error_type


@dataclass(frozen=True, slots=True)
class Failures:
    requests: int
    ok: int
    intended: int
    failed: int
    """Unintended failures, ``broken_by_kill`` excluded."""
    unclean: int
    broken_by_kill: int
    kinds: dict[str, int]
    """``kind`` → how many of the failures."""


def failures(sent: Sequence[Sent], kills: Sequence[Kill] = ()) -> Failures:
    bad = [s for s in sent if not s.result.ok and not intended(s)]
    broken = [s for s in bad if broken_by_kill(s, kills)]
    rest = [s for s in bad if not broken_by_kill(s, kills)]
    return Failures(
        requests=len(sent),
        ok=sum(s.result.ok for s in sent),
        intended=sum(intended(s) for s in sent),
        failed=len(rest),
        unclean=sum(not clean(s) for s in rest),
        broken_by_kill=len(broken),
        kinds=dict(Counter(kind(s) for s in rest)),
    )


@dataclass(frozen=True, slots=True)
class Admission:
    limit: str
    configured: float
    admitted: float
    bound: float
    """How far above ``configured`` ``admitted`` may go."""
    reached: bool
    """The tenant was refused at least once (the limit was reached during the fault)."""
    detail: str = ""

    @property
    def over(self) -> float:
        return max(0.0, self.admitted - self.configured)

    @property
    def within_bound(self) -> bool:
        return self.admitted <= self.configured + self.bound + 1e-12


def most_in_window(points: Iterable[tuple[float, float]], window_s: float = WINDOW_S) -> float:
    """The largest sum of weights ``w`` of points ``(t, w)`` inside any window ``[t0, t0 + window_s)``."""
    ordered = sorted(points)
    best = total = 0.0
    lo = 0
    for t, w in ordered:
        total += w
        while ordered[lo][0] <= t - window_s:
            total -= ordered[lo][1]
            lo += 1
        best = max(best, total)
    return best


def _admitted(r: UsageRecord) -> float:
    return r.admitted_at if r.admitted_at is not None else r.at


def rpm_admission(records: Sequence[UsageRecord], limit: int, *, refused: bool, store_lost: bool) -> Admission:
    admitted = most_in_window((_admitted(r), 1.0) for r in records)
    bound = math.ceil(RPM_BUCKET_SLACK * limit) + (limit if store_lost else 0)
    return Admission("rpm", limit, admitted, bound, refused, f"{len(records)} billed")


def tpm_admission(
    records: Sequence[UsageRecord], limit: int, *, prompt_estimate: int, clients: int, refused: bool, store_lost: bool
) -> Admission:
    used = most_in_window((_admitted(r), float(r.prompt_tokens + r.completion_tokens)) for r in records)
    excess = max([0, *(r.prompt_tokens - prompt_estimate for r in records)])
    bound = clients * excess + (limit if store_lost else 0)
    return Admission("tpm", limit, used, bound, refused, f"real prompt ≤ estimate + {excess} tokens")


def concurrency_admission(records: Sequence[UsageRecord], limit: int, *, refused: bool, store_lost: bool) -> Admission:
    held = max_overlap([(_admitted(r), r.at) for r in records])
    return Admission("concurrency", limit, held, float(limit if store_lost else 0), refused, f"{len(records)} billed")


@dataclass(frozen=True, slots=True)
class Skew:
    """Replica ``gateway``'s wall clock ran ``offset_s`` seconds ahead for the requests the clients started on it in
    ``[since, until)`` (monotonic): the process the clock-skew fault started skewed served those."""

    gateway: int
    since: float
    until: float
    offset_s: float


def on_one_clock(records: Sequence[UsageRecord], sent: Iterable[Sent], skews: Sequence[Skew]) -> list[UsageRecord]:
    """``records`` with the times a skewed replica stamped (``admitted_at``, ``at``) moved back by its skew, so that
    the limits measured across replicas (a concurrency overlap, a 60 s window) compare times of one clock. A record
    of no skewed request is returned as it is."""
    if not skews:
        return list(records)
    offset: dict[str, float] = {}
    for s in sent:
        rid = s.result.headers.get("x-request-id")
        for k in skews:
            if rid is not None and s.gateway == k.gateway and k.since <= s.result.started < k.until:
                offset[rid] = k.offset_s
    out = []
    for r in records:
        off = offset.get(r.request_id)
        if off is None:
            out.append(r)
            continue
        moved = {"at": r.at - off}
        if r.admitted_at is not None:
            moved["admitted_at"] = r.admitted_at - off
        out.append(r.model_copy(update=moved))
    return out


def gateways_of(sent: Iterable[Sent]) -> dict[str, int]:
    """Request id → the replica that served it (answered or failed), for every request that had an id."""
    return {rid: s.gateway for s in sent if (rid := s.result.headers.get("x-request-id")) is not None}


def unseen_spend(records: Sequence[UsageRecord], gateway_of: Mapping[str, int], window_s: float) -> float:
    """The most that the replicas other than one billed (by finish time) within any ``window_s``, over the
    replicas: what a budget lease up to ``window_s`` old may not see. A record of no known replica counts as
    another's for every replica."""
    if window_s <= 0 or not records:
        return 0.0
    replicas = set(gateway_of.values()) or {-1}
    return max(
        most_in_window(((r.at, r.cost_usd) for r in records if gateway_of.get(r.request_id) != g), window_s)
        for g in replicas
    )


def budget_admission(
    records: Sequence[UsageRecord], budget_usd: float, spent_usd: float, *, clients: int, refused: bool,
    store_lost: bool, gateway_of: Mapping[str, int] | None = None, lease_s: float = 0.0,
) -> Admission:  # fmt: skip
    """``lease_s``: the longest a budget lease's spend serves requests (``GatewaySettings.lease_ttl_s``; 0: leases
    off); ``gateway_of``: request id → replica (``gateways_of``)."""
    biggest = max([0.0, *(r.cost_usd for r in records)])
    in_flight = clients * biggest
    unseen = unseen_spend(records, gateway_of or {}, lease_s)
    bound = in_flight * (2 if store_lost else 1) + unseen
    detail = f"largest request {biggest:.2e} USD"
    if lease_s > 0:
        detail += f", others' spend in {lease_s:g} s {unseen:.2e} USD"
    return Admission("budget", budget_usd, spent_usd, bound, refused, detail)


def time_to_recover(sent: Sequence[Sent], healed_at: float, kills: Sequence[Kill] = ()) -> float | None:
    """Seconds from ``healed_at`` to the start of the first request after which every request succeeded (0 when
    nothing failed after ``healed_at``); None when requests still failed at the end."""
    bad = [s for s in sent if not s.result.ok and not intended(s) and not broken_by_kill(s, kills)]
    if not bad:
        return 0.0
    last_bad = max(s.result.started for s in bad)
    later = [s.result.started for s in sent if s.result.started > last_bad and s.result.ok]
    if not later:
        return None
    return max(0.0, min(later) - healed_at)
