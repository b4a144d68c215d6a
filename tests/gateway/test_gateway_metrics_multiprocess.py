"""The measured gauges (asyncio tasks, open connections) in Prometheus's multiprocess mode (``gearshift gateway
--workers N``): each process writes its value, one scrape shows their sum. Two real processes write to one
directory; the scrape is read as the gateway builds it (``MultiProcessCollector``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from prometheus_client.parser import text_string_to_metric_families

from gateway.usage.metrics import MULTIPROC_DIR_ENV, OPEN_CONNECTIONS

_PROCESS = """
import sys
from gateway.usage.metrics import GatewayMetrics
metrics = GatewayMetrics()
connections = float(sys.argv[1])
metrics.measure(metrics.open_connections, lambda: connections)
metrics.sample()
"""


def _gauge(text: str, name: str) -> float:
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    return sum(s.value for s in family.samples)


def test_each_process_measured_gauge_is_summed_in_one_scrape(tmp_path: Path) -> None:
    env = {**os.environ, MULTIPROC_DIR_ENV: str(tmp_path)}
    for connections in (3, 4):
        subprocess.run([sys.executable, "-c", _PROCESS, str(connections)], env=env, check=True, timeout=60)
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged, path=str(tmp_path))
    assert _gauge(generate_latest(merged).decode(), OPEN_CONNECTIONS) == 7.0
