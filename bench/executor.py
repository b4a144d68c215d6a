"""Where the lab's independent runs execute: one interface, two pools.

A sweep (``gearshift bench policies``, ``bench robustness``, ``bench replay``) is a list of jobs, each a pure
function of its arguments (a seeded virtual-time run), so where a job runs cannot change its result:

- ``LocalPool`` (the default): worker processes of this machine (``concurrent.futures.ProcessPoolExecutor``), or
  this process when ``processes`` ≤ 1 or there is a single job;
- ``RayPool`` (``--executor ray``, the ``ray`` extra): Ray tasks, on a running cluster (``address``, or
  ``RAY_ADDRESS``) or on a single-node cluster it starts on this machine and stops on ``close``.

Both give every job's result in job order. ``shared`` is one large argument every job takes first (a replay's
trace): the local pool hands it to each worker process once, at its start (a forked process inherits it without
pickling), Ray puts it in its object store once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Literal, Protocol, Self, TypeVar

R = TypeVar("R")
ExecutorName = Literal["local", "ray"]
EXECUTORS: tuple[ExecutorName, ...] = ("local", "ray")
_NO_SHARED: Any = object()


class Executor(Protocol):
    """Runs ``fn(*job)`` (``fn(shared, *job)`` with ``shared``) for every job; results in job order, each yielded
    once it and every job before it are done (so a caller can report progress as they come)."""

    def map(
        self, fn: Callable[..., R], jobs: Sequence[tuple[Any, ...]], *, shared: Any = _NO_SHARED
    ) -> Iterator[R]: ...

    def close(self) -> None:
        """Release what the executor started (processes, a cluster); it may not be used afterwards."""

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


class _Closing:
    """``with executor:`` closes it at the end."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass


_SHARED: Any = None
"""The local pool's ``shared`` argument inside one of its worker processes (set by the pool's initializer)."""


def _install(shared: Any) -> None:
    global _SHARED
    _SHARED = shared


def _with_shared(fn: Callable[..., R], *job: Any) -> R:
    return fn(_SHARED, *job)


class LocalPool(_Closing):
    """``processes`` worker processes of this machine, one pool per ``map``; in this process when
    ``processes`` ≤ 1 or there is only one job."""

    def __init__(self, processes: int | None = None) -> None:
        self.processes = processes or min(2, os.cpu_count() or 1)

    def map(self, fn: Callable[..., R], jobs: Sequence[tuple[Any, ...]], *, shared: Any = _NO_SHARED) -> Iterator[R]:
        head: tuple[Any, ...] = () if shared is _NO_SHARED else (shared,)
        if self.processes <= 1 or len(jobs) <= 1:
            for job in jobs:
                yield fn(*head, *job)
            return
        initargs = head or (None,)
        with ProcessPoolExecutor(max_workers=self.processes, initializer=_install, initargs=initargs) as pool:
            if head:
                futures = [pool.submit(_with_shared, fn, *job) for job in jobs]
            else:
                futures = [pool.submit(fn, *job) for job in jobs]
            for future in futures:
                yield future.result()


class RayPool(_Closing):
    """Ray tasks, one per job, each asking for one CPU. Without a running Ray (``ray.is_initialized()``), the first
    ``map`` connects to ``address`` (default: ``RAY_ADDRESS``, else a new single-node cluster of ``num_cpus``
    CPUs on this machine), and ``close`` disconnects (stopping a cluster it started)."""

    def __init__(self, *, address: str | None = None, num_cpus: int | None = None) -> None:
        self.address = address
        self.num_cpus = num_cpus
        self._started = False

    def _ray(self) -> Any:
        try:
            import ray
        except ImportError as exc:  # pragma: no cover: the message is the point
            raise RuntimeError("--executor ray needs Ray: pip install 'gearshift[ray]'") from exc
        if not ray.is_initialized():
            ray.init(
                address=self.address, num_cpus=self.num_cpus, include_dashboard=False, configure_logging=False
            )  # fmt: skip
            self._started = True
        return ray

    def map(self, fn: Callable[..., R], jobs: Sequence[tuple[Any, ...]], *, shared: Any = _NO_SHARED) -> Iterator[R]:
        ray = self._ray()
        task = ray.remote(num_cpus=1)(fn)
        head: tuple[Any, ...] = () if shared is _NO_SHARED else (ray.put(shared),)
        refs = [task.remote(*head, *job) for job in jobs]
        for ref in refs:
            yield ray.get(ref)

    def close(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


EXECUTOR_HELP = (
    "Where the runs execute: 'local' (--processes worker processes here) or 'ray' (Ray tasks, the ray extra: on "
    "RAY_ADDRESS's cluster, else a new one on this machine). Same results either way."
)


def make_executor(name: str, *, processes: int | None = None) -> Executor:
    """The executor a command's ``--executor`` names: ``local`` (``processes`` worker processes) or ``ray``."""
    if name == "local":
        return LocalPool(processes)
    if name == "ray":
        return RayPool()
    raise ValueError(f"--executor: one of {', '.join(EXECUTORS)}, got {name!r}")
