"""The overload queue's policy (pure: no clock, no asyncio): priority bands, fair sharing within a band, and
which request is refused when the queue is full or a request waits too long. ``gateway.intake.overload`` is the
mechanism that drives it.

- **Bands.** One band per tier priority (``TierConfig.priority``, lower is more important, like vLLM's
  ``priority`` field). ``pop`` serves bands in strict priority: a band is served only while every more
  important band is empty.
- **Fairness within a band: deficit round robin** (Shreedhar & Varghese) over the band's tenants, each with
  its own FIFO. The cost of a request is its reserved tokens (``CompletionRequest.reserved_tokens``: prompt
  estimate plus completion allowance). Tenants with queued requests form a ring; when the ring reaches tenant
  *i* its deficit grows by the quantum Q (tokens), ``D_i ← D_i + Q``, and it dispatches its head requests while
  ``cost(head) ≤ D_i``, ``D_i ← D_i − cost(head)``; then the ring moves on. A tenant whose FIFO empties leaves
  the ring and its deficit returns to 0. Over any busy interval each of n backlogged tenants gets
  ``1/n`` of the dispatched tokens, within ``Q + max cost`` tokens.
- **Refusals.** When the queue is full an arrival takes the place of the youngest *sheddable* entry of the
  least important band, if that entry is in a less important band than the arrival or the arrival is not
  sheddable; otherwise the arrival is refused. An entry whose ``deadline`` passes leaves the queue
  (``expired``); the mechanism answers it (429 for a sheddable tier, 503 otherwise).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    """One queued request. Times are the clock's monotonic seconds."""

    tenant: str
    priority: int
    """The tier's priority: the band (lower is more important)."""
    sheddable: bool
    cost: int
    """Reserved tokens (DRR cost)."""
    enqueued_at: float
    deadline: float
    """When the request stops waiting."""
    item: T
    """What the mechanism attaches (its waiter)."""
    seq: int = field(default=0)
    """Arrival order, set by the queue."""


@dataclass(slots=True)
class _Band(Generic[T]):
    """One priority band: a FIFO per tenant and the DRR ring of tenants with queued requests."""

    fifos: dict[str, deque[Entry[T]]] = field(default_factory=dict)
    ring: deque[str] = field(default_factory=deque)
    deficit: dict[str, int] = field(default_factory=dict)
    credited: bool = False
    """The ring's head has had its quantum for this visit."""
    size: int = 0

    def push(self, entry: Entry[T]) -> None:
        fifo = self.fifos.get(entry.tenant)
        if fifo is None:
            fifo = self.fifos[entry.tenant] = deque()
            self.ring.append(entry.tenant)
            self.deficit[entry.tenant] = 0
        fifo.append(entry)
        self.size += 1

    def remove(self, entry: Entry[T]) -> bool:
        fifo = self.fifos.get(entry.tenant)
        if fifo is None or entry not in fifo:
            return False
        fifo.remove(entry)
        self.size -= 1
        if not fifo:
            self._drop(entry.tenant)
        return True

    def _drop(self, tenant: str) -> None:
        if self.ring and self.ring[0] == tenant:
            self.credited = False
        del self.fifos[tenant], self.deficit[tenant]
        self.ring.remove(tenant)

    def pop(self, quantum: int, ready: Callable[[Entry[T]], bool] | None = None) -> Entry[T] | None:
        """The next entry by DRR among the tenants whose head entry is ``ready`` (all, without it); None when none
        is. A tenant whose head is not ready keeps its place and its deficit, and its later entries wait behind
        the head (FIFO per tenant). Bounded: each full turn of the ring adds Q to every ready tenant's deficit,
        so the largest head cost is paid within ``ceil(max cost / Q)`` turns."""
        live = [t for t in self.ring if ready is None or ready(self.fifos[t][0])]
        if not live:
            return None
        turns = len(self.ring) * (max(self.fifos[t][0].cost for t in live) // quantum + 2)
        for _ in range(turns):
            tenant = self.ring[0]
            fifo = self.fifos[tenant]
            if ready is not None and tenant not in live:
                self.ring.rotate(-1)
                self.credited = False
                continue
            if not self.credited:
                self.deficit[tenant] += quantum
                self.credited = True
            if fifo[0].cost <= self.deficit[tenant]:
                entry = fifo.popleft()
                self.deficit[tenant] -= entry.cost
                self.size -= 1
                if not fifo:
                    self._drop(tenant)
                return entry
            self.ring.rotate(-1)
            self.credited = False
        raise AssertionError("DRR made no progress")  # unreachable: the bound above always suffices

    def entries(self) -> Iterator[Entry[T]]:
        for fifo in self.fifos.values():
            yield from fifo


class FairQueue(Generic[T]):
    """A bounded queue of ``capacity`` entries in priority bands, DRR between tenants within a band."""

    def __init__(self, *, capacity: int, quantum_tokens: int) -> None:
        if capacity <= 0 or quantum_tokens <= 0:
            raise ValueError(f"capacity and quantum_tokens must be positive, got {capacity}, {quantum_tokens}")
        self.capacity = capacity
        self.quantum = quantum_tokens
        self._bands: dict[int, _Band[T]] = {}
        self._size = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._size

    def depth(self, priority: int) -> int:
        """Entries queued in one band."""
        band = self._bands.get(priority)
        return band.size if band else 0

    def bands(self) -> list[int]:
        """The priorities of every band seen so far, most important first."""
        return sorted(self._bands)

    def ahead_of(self, priority: int) -> int:
        """Entries that a new arrival in band ``priority`` would wait behind at most: its band and every more
        important one."""
        return sum(b.size for p, b in self._bands.items() if p <= priority)

    def offer(self, entry: Entry[T]) -> tuple[bool, Entry[T] | None]:
        """Queue ``entry`` if there is room or a less deserving entry to evict. Returns (queued, evicted)."""
        evicted = None
        if self._size >= self.capacity:
            victim = self._victim()
            if victim is None or (entry.sheddable and victim.priority <= entry.priority):
                return False, None
            self.remove(victim)
            evicted = victim
        self._seq += 1
        entry.seq = self._seq
        self._bands.setdefault(entry.priority, _Band()).push(entry)
        self._size += 1
        return True, evicted

    def _victim(self) -> Entry[T] | None:
        """The youngest sheddable entry of the least important band that has one."""
        for priority in sorted(self._bands, reverse=True):
            sheddable = [e for e in self._bands[priority].entries() if e.sheddable]
            if sheddable:
                return max(sheddable, key=lambda e: e.seq)
        return None

    def pop(self, ready: Callable[[Entry[T]], bool] | None = None) -> Entry[T] | None:
        """The next entry to dispatch: the most important band with a ``ready`` entry (any, without ``ready``), DRR
        within it; None when there is none."""
        for priority in sorted(self._bands):
            band = self._bands[priority]
            if band.size:
                entry = band.pop(self.quantum, ready)
                if entry is not None:
                    self._size -= 1
                    return entry
        return None

    def remove(self, entry: Entry[T]) -> bool:
        """Take ``entry`` out (it gave up or was evicted); False when it is not queued."""
        band = self._bands.get(entry.priority)
        if band is None or not band.remove(entry):
            return False
        self._size -= 1
        return True

    def expired(self, now: float) -> list[Entry[T]]:
        """Take out and return every entry whose deadline is at or before ``now``."""
        late = [e for band in self._bands.values() for e in band.entries() if e.deadline <= now]
        for entry in late:
            self.remove(entry)
        return late
