"""A simulated worker served from a background thread, so sync and async clients can both reach it."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

import httpx
from prometheus_client.parser import text_string_to_metric_families

from workers.sim.server import SimServer
from workers.sim.settings import SimWorkerSettings

CONTROL_TOKEN = "test-control-token"


class ThreadedSimServer:
    def __init__(self, settings: SimWorkerSettings) -> None:
        self.server = SimServer(settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sim-server", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:
            self._error = exc
            self._loop.close()
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.server.stop())
        self._loop.close()

    def __enter__(self) -> ThreadedSimServer:
        self._thread.start()
        if not self._ready.wait(timeout=10):
            raise TimeoutError("simulated worker did not start within 10 s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def url(self) -> str:
        return self.server.url


def metric_value(http: httpx.Client, base_url: str, sample_name: str, **labels: str) -> float:
    """One sample's value from the worker's /metrics."""
    text = http.get(f"{base_url}/metrics").text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise KeyError(sample_name)
