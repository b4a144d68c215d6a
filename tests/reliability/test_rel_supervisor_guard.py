"""Defect 11 (issue 23): the vLLM supervisor's restart control applies the dev-secret guard every other gearshift
server applies, and a DNS-named ``restart_url`` that names this machine listens on that address, not on every
interface.

Before the fix ``serve`` started vLLM and served ``POST /gearshift/v1/restart`` on ``0.0.0.0`` with the public
development control token (anyone on the network could restart the worker), and the CLI bound ``0.0.0.0`` for any
DNS name (``workers.vllm.launcher.bind_host``)."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from bench.procs import free_port
from fleet.config import DEV_SECRETS, ConfigError
from workers.vllm.launcher import LaunchPlan
from workers.vllm.supervisor import Supervisor, restart_bind_host, serve

DEV_TOKEN = DEV_SECRETS["control_token"]


def _stand_in(root: Path) -> tuple[Supervisor, list[bool]]:
    """A supervisor whose "vLLM" is Python's file server with a ``health`` file; the modes it started."""
    (root / "health").write_text("ok")
    port, started = free_port(), []

    def plan_for(drafter: bool) -> LaunchPlan:
        started.append(drafter)
        argv = (sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root))
        return LaunchPlan(argv)

    return Supervisor(plan_for, url=f"http://127.0.0.1:{port}", log_dir=root, ready_timeout_s=20.0), started


async def _serve_once(supervisor: Supervisor, **kw: object) -> None:
    """``serve`` with ``stop`` already set: it starts, listens, and returns (or raises before starting)."""
    stop = asyncio.Event()
    stop.set()
    await serve(supervisor, port=free_port(), stop=stop, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "redis_url"),
    [("0.0.0.0", None), ("127.0.0.1", "redis://redis:6379/0")],
    ids=["beyond-loopback", "shared-mode"],
)
async def test_the_development_control_token_is_refused_before_vllm_starts(
    host: str, redis_url: str | None, tmp_path: Path
) -> None:
    supervisor, started = _stand_in(tmp_path)
    with pytest.raises(ConfigError, match="GEARSHIFT_CONTROL_TOKEN"):
        await _serve_once(supervisor, host=host, control_token=DEV_TOKEN, redis_url=redis_url)
    assert started == [], "vLLM must not start behind a public token"


async def test_a_real_token_or_the_explicit_dev_opt_in_or_loopback_serves(tmp_path: Path) -> None:
    for kw in (
        {"host": "0.0.0.0", "control_token": "a-real-secret-token"},
        {"host": "0.0.0.0", "control_token": DEV_TOKEN, "allow_dev_secrets": True},
        {"host": "127.0.0.1", "control_token": DEV_TOKEN},
    ):
        supervisor, started = _stand_in(tmp_path)
        await _serve_once(supervisor, **kw)
        assert started == [True], kw


def test_a_dns_named_restart_url_listens_on_the_local_address_it_names() -> None:
    name = socket.gethostname()  # resolves to one of this machine's addresses (here through /etc/hosts)
    resolved = {info[4][0] for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    host = restart_bind_host(f"http://{name}:8001")
    assert host in resolved, (host, resolved)
    assert host != "0.0.0.0"
    assert restart_bind_host("http://10.1.2.3:8001") == "10.1.2.3"
    assert restart_bind_host("http://localhost:8001") == "127.0.0.1"
    # a name that resolves to nothing (RFC 2606 .invalid) or to no local address: every interface, and the guard
    assert restart_bind_host("http://restart.gearshift.invalid:8001") == "0.0.0.0"
