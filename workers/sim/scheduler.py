"""Waiting queues for the simulated scheduler: FCFS and priority, as vLLM V1 orders them.

FCFS serves in arrival order; a preempted request goes back to the *front*. Priority serves the lowest
``(priority, arrival_s)`` first (vLLM semantics: lower value = more urgent), preempted ones included.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Literal, Protocol, TypeVar

SchedulingPolicy = Literal["fcfs", "priority"]


class Queued(Protocol):
    @property
    def sort_key(self) -> tuple[int, float, int]:
        """``(priority, arrival_s, admission order)``."""
        ...


Q = TypeVar("Q", bound=Queued)


class WaitingQueue(Protocol[Q]):
    def push(self, item: Q) -> None: ...
    def push_front(self, item: Q) -> None:
        """Return a preempted request to the queue (to the front under FCFS)."""
        ...

    def peek(self) -> Q | None: ...
    def pop(self) -> Q: ...
    def remove(self, item: Q) -> bool: ...
    def __len__(self) -> int: ...


class FcfsQueue(WaitingQueue[Q]):
    def __init__(self) -> None:
        self._items: deque[Q] = deque()

    def push(self, item: Q) -> None:
        self._items.append(item)

    def push_front(self, item: Q) -> None:
        self._items.appendleft(item)

    def peek(self) -> Q | None:
        return self._items[0] if self._items else None

    def pop(self) -> Q:
        return self._items.popleft()

    def remove(self, item: Q) -> bool:
        try:
            self._items.remove(item)
        except ValueError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._items)


class PriorityQueue(WaitingQueue[Q]):
    def __init__(self) -> None:
        self._heap: list[tuple[tuple[int, float, int], Q]] = []

    def push(self, item: Q) -> None:
        heapq.heappush(self._heap, (item.sort_key, item))

    def push_front(self, item: Q) -> None:
        self.push(item)  # the heap orders a preempted request by its key, as any other (a method: mypyc has no alias)

    def peek(self) -> Q | None:
        return self._heap[0][1] if self._heap else None

    def pop(self) -> Q:
        return heapq.heappop(self._heap)[1]

    def remove(self, item: Q) -> bool:
        for i, (_, it) in enumerate(self._heap):
            if it is item:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return True
        return False

    def __len__(self) -> int:
        return len(self._heap)


def make_queue(policy: SchedulingPolicy) -> WaitingQueue[Q]:
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(f"scheduling: unknown policy {policy!r}; expected 'fcfs' or 'priority'")
