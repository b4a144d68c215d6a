"""Outside views of a running gateway process (Linux ``/proc``): resident memory, open file descriptors, and
established TCP connections on its listening port; plus gauges it exports on ``/metrics`` when present."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from fleet.scrape import exposition_samples

TASKS_METRIC = "gearshift_gateway_asyncio_tasks"
CONNECTIONS_METRIC = "gearshift_gateway_open_connections"


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid``, MiB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def established(port: int) -> int:
    """TCP connections in state ESTABLISHED whose local end is 127.0.0.1:``port`` (clients of that server)."""
    local = f"0100007F:{port:04X}"
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return 0
    return sum(1 for line in lines if (f := line.split()) and len(f) > 3 and f[1] == local and f[3] == "01")


def scrape_gauge(url: str, name: str) -> float | None:
    """The value of an unlabelled gauge ``name`` on ``url``'s ``/metrics``; None when it is not exported."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2.0) as resp:
            text = resp.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None
    return next((value for sample, _, value in exposition_samples(text) if sample == name), None)
