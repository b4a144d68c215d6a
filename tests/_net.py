"""Loopback helpers shared by the test suite (no gearshift imports)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it; callers retry if they lose a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, *, timeout_s: float = 10.0, alive: Callable[[], bool] | None = None) -> bool:
    """Poll until something accepts connections on 127.0.0.1:``port``; False after ``timeout_s`` seconds
    or as soon as ``alive()`` says the server process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False
