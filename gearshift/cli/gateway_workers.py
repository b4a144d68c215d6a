"""``gearshift gateway --workers N``: N gateway processes listening on one port with SO_REUSEPORT (the kernel spreads
connections across them), each building its own ``GatewayDeps`` from the same settings.

They share state only through the store, so N > 1 needs Redis (the memory store is one process's). ``/metrics`` is
one view: Prometheus's multiprocess mode, a directory made here and shared by the children
(``GatewayMetrics.exposition``). Each process has its own spool directory (``<spool_dir>/worker-<i>``: a spool is one
process's) and its own prefix-affinity index (not shared: each process learns which worker holds which prompt from
its own requests, so with N processes a session's turns meet a warm index only when they reach the same process).

What that loses, exactly: a keep-alive client's connection stays on one process, so its turns lose nothing. A client
that opens a connection per turn is spread uniformly; of a session's T turns, each process's first one is routed on
load alone, ``N(1 − (1 − 1/N)^T) − 1`` more than with one process (about one more per session for N = 2). Measured in
the lab (``python -m bench.gateway.prefix_split``: ``bench.prefix``'s 48 agentic sessions on 4 simulated workers,
300 virtual s, each turn to a random process): later-turn TTFT p50 0.287 s with 1 process, 0.377 s with 2, 0.529 s
with 4; the engines' prefix-cache hit rate 0.808, 0.807, 0.759 (the shared system prompt is cached everywhere). A
shared index (in the store) would recover it at a store call per request; not built.

The parent reserves the port (bound, not listening: it receives no connections), starts the children, forwards
SIGINT/SIGTERM to them, and exits with the worst exit status once they have all stopped.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import uvloop

from gateway.settings import GatewaySettings
from gateway.usage.metrics import MULTIPROC_DIR_ENV


class WorkersRefused(ValueError):
    """``--workers N`` cannot run with these settings; the message says why."""


def _reserve(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _child(overrides: dict[str, Any]) -> None:
    import logging

    from gearshift.cli.gateway import serve

    settings = GatewaySettings(**overrides)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(settings, reuse_port=True))


def serve_workers(settings: GatewaySettings, overrides: dict[str, Any], *, workers: int) -> int:
    """Run ``workers`` gateway processes on ``settings.host:settings.port`` until they stop; their worst status."""
    if not settings.redis_url:
        raise WorkersRefused(
            f"--workers {workers} needs a shared store: the memory store is one process's, so each worker would "
            "enforce the limits and keep the ledger alone. Set GEARSHIFT_REDIS_URL, or run one worker."
        )
    reserved = _reserve(settings.host, settings.port)
    port = int(reserved.getsockname()[1])
    given = os.environ.get(MULTIPROC_DIR_ENV)
    metrics_dir = Path(given or tempfile.mkdtemp(prefix="gearshift-gateway-metrics-"))
    os.environ[MULTIPROC_DIR_ENV] = str(metrics_dir)  # before the children import prometheus_client
    spool = settings.model_copy(update={"port": port}).spool_path()
    ctx = multiprocessing.get_context("spawn")
    children = []
    for i in range(workers):
        child_overrides = {**overrides, "port": port}
        if spool is not None:
            child_overrides["spool_dir"] = spool / f"worker-{i}"
        children.append(ctx.Process(target=_child, args=(child_overrides,), name=f"gateway-{i}", daemon=False))

    def forward(signum: int, _frame: FrameType | None) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for child in children:
            child.start()
        multiprocessing.connection.wait([c.sentinel for c in children])  # one stopped (a signal, or a failure)
    finally:
        forward(signal.SIGTERM, None)
        for child in children:
            child.join(timeout=10)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        reserved.close()
        if not given:
            shutil.rmtree(metrics_dir, ignore_errors=True)
            del os.environ[MULTIPROC_DIR_ENV]
    return max((abs(c.exitcode or 0) for c in children), default=0)
