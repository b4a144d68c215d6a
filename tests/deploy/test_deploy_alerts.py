"""Alerts: every rule links to a runbook page with its four sections, and the operations alerts (store down, spool
filling and full, ledger backlog, error ratio, shedding, actuation failures, controller absent) fire in a real
Prometheus, with the rule's own expression, on series exported by the code's own metric registries, and stay
silent on a healthy fleet."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from prometheus_client import generate_latest

from bench.procs import free_port
from controller.metrics import ControllerMetrics
from gateway.usage.metrics import GatewayMetrics

from .deploy_contracts import ROOT
from .deploy_promql import RULES_DIR, rules
from .deploy_stack import prometheus_scraping

RUNBOOKS = ROOT / "docs" / "operations" / "runbooks"
RUNBOOK_BASE = "https://github.com/gearshift/gearshift/blob/main/docs/operations/runbooks/"
SECTIONS = ("Symptom", "Impact", "Checks", "Actions")
OPERATIONS = {
    "GearshiftStoreDown",
    "GearshiftSpoolFilling",
    "GearshiftSpoolFull",
    "GearshiftLedgerBacklog",
    "GearshiftErrorRatioHigh",
    "GearshiftShedding",
    "GearshiftActuationFailures",
    "GearshiftControllerAbsent",
}


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


# ----------------------------------------------------------------------------------------------- runbooks
def test_every_alert_links_to_its_runbook_page_with_the_four_sections() -> None:
    assert len(alerts()) >= 19
    linked = set()
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), rule["alert"]
        page = RUNBOOKS / url.removeprefix(RUNBOOK_BASE)
        assert page.is_file(), f"{rule['alert']}: {page} does not exist"
        text = page.read_text()
        assert text.splitlines()[0] == f"# {rule['alert']}", page.name
        assert rule["labels"]["severity"] in text.split("\n## ")[0], f"{page.name}: the severity it pages with"
        bodies = dict(section.split("\n", 1) for section in text.split("\n## ")[1:])
        assert tuple(bodies) == SECTIONS, f"{page.name}: sections {tuple(bodies)}"
        assert all(len(body.split()) >= 12 for body in bodies.values()), f"{page.name}: an empty section"
        linked.add(page.name)
    pages = {p.name for p in RUNBOOKS.glob("*.md")} - {"index.md"}
    assert pages == linked, f"runbooks no alert links to: {sorted(pages - linked)}"


def test_runbook_cross_links_resolve() -> None:
    for page in RUNBOOKS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+\.md)", page.read_text()):
            assert (page.parent / target).resolve().is_file(), f"{page.name}: {target}"


def test_the_no_leader_alert_says_the_fallback_table_runs() -> None:
    (rule,) = [r for r in alerts() if r["alert"] == "GearshiftControllerNoLeader"]
    assert "fallback table runs" in rule["annotations"]["description"]
    assert "fallback table runs" in (RUNBOOKS / "controller-no-leader.md").read_text()


# ------------------------------------------------------------------------------ firing in real Prometheus
class Exporter:
    """The gateway's and the controller's real registries on loopback, moved a step at every scrape by ``tick``."""

    def __init__(self, tick: Callable[[GatewayMetrics, ControllerMetrics], None]) -> None:
        self.gateway, self.controller = GatewayMetrics(), ControllerMetrics()
        self.tick = tick
        self.controller_up = True

    async def serve_gateway(self, request: web.Request) -> web.Response:
        self.tick(self.gateway, self.controller)
        return web.Response(body=generate_latest(self.gateway.registry), content_type="text/plain")

    async def serve_controller(self, request: web.Request) -> web.Response:
        if not self.controller_up:
            return web.Response(status=503)
        return web.Response(body=generate_latest(self.controller.registry), content_type="text/plain")


def healthy(gw: GatewayMetrics, ctl: ControllerMetrics) -> None:
    """A fleet at work: requests finish, a few client errors, the store answers, nothing spooled or shed."""
    gw.store_up.set(1)
    gw.requests.labels("acme", "kimi-k3", "kimi-k3-0", "ok").inc(50)
    gw.errors.labels("api_error").inc(1)  # 2 %: under the 5 % threshold
    gw.errors.labels("rate_limit_error").inc(10)  # client-side: not counted
    gw.ledger_backlog.set(40)
    gw.spool_bytes.set(0)
    ctl.leader.set(1)
    ctl.actuation_failures.labels("kimi-k3-0")  # a series at 0


def failing(gw: GatewayMetrics, ctl: ControllerMetrics) -> None:
    """Everything the operations alerts watch goes wrong at once."""
    gw.store_up.set(0)
    gw.requests.labels("acme", "kimi-k3", "kimi-k3-0", "ok").inc(50)
    gw.errors.labels("api_error").inc(10)  # 20 % server-side errors
    gw.ledger_backlog.set(5000)
    gw.spool_bytes.inc(4096)
    gw.spool_full.set(1)
    gw.shed.labels("batch", "queue_full").inc(3)
    ctl.leader.set(1)
    ctl.actuation_failures.labels("kimi-k3-0").inc()


def instant_rules(tmp_path: Path) -> Path:
    """The operations alert group as committed, with ``for`` set to 0 s (its durations are checked apart)."""
    groups = yaml.safe_load((RULES_DIR / "gearshift.rules.yml").read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "gearshift-operations-alerts"]
    path = tmp_path / "operations.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{**group, "rules": [{**r, "for": "0s"} for r in group["rules"]]}]}))
    return path


@contextlib.asynccontextmanager
async def serving(exporter: Exporter) -> AsyncIterator[dict[str, list[tuple[str, dict[str, str]]]]]:
    """The gateway's and the controller's /metrics on two loopback ports, as scrape targets by job."""
    runners: list[web.AppRunner] = []
    targets: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for job, handler in (
        ("gearshift-gateway", exporter.serve_gateway),
        ("gearshift-controller", exporter.serve_controller),
    ):
        app = web.Application()
        app.router.add_get("/metrics", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        targets[job] = [(f"127.0.0.1:{port}", {})]
    try:
        yield targets
    finally:
        for runner in runners:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def prometheus_on(tmp_path: Path, exporter: Exporter) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    async with (
        serving(exporter) as targets,
        prometheus_scraping(targets, tmp_path, rules=[instant_rules(tmp_path)]) as url,
        httpx.AsyncClient(timeout=5) as client,
    ):
        yield client, url


async def firing(client: httpx.AsyncClient, prometheus: str) -> set[str]:
    found = (await client.get(f"{prometheus}/api/v1/alerts")).json()["data"]["alerts"]
    return {a["labels"]["alertname"] for a in found if a["state"] == "firing"}


async def evaluated(client: httpx.AsyncClient, prometheus: str, rounds: int) -> bool:
    """Every rule evaluated without error, on data at least ``rounds`` scrapes old."""
    groups = (await client.get(f"{prometheus}/api/v1/rules")).json()["data"]["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert {r["name"] for r in loaded} == OPERATIONS
    assert all(r["health"] in ("ok", "unknown") for r in loaded), [r.get("lastError") for r in loaded]
    query = {"query": "count_over_time(gearshift_gateway_store_up[1m])"}
    result = (await client.get(f"{prometheus}/api/v1/query", params=query)).json()["data"]["result"]
    return bool(result) and float(result[0]["value"][1]) >= rounds and all(r["health"] == "ok" for r in loaded)


async def until(check: Callable[[], Awaitable[bool]], *, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        await asyncio.sleep(0.5)


@pytest.mark.prometheus
async def test_no_operations_alert_fires_on_a_healthy_fleet(tmp_path: Path) -> None:
    async with prometheus_on(tmp_path, Exporter(healthy)) as (client, url):
        await until(lambda: evaluated(client, url, rounds=8), seconds=30, what="8 scrapes evaluated")
        assert await firing(client, url) == set()


@pytest.mark.prometheus
async def test_each_operations_alert_fires_in_real_prometheus_with_its_own_expression(tmp_path: Path) -> None:
    exporter = Exporter(failing)
    async with prometheus_on(tmp_path, exporter) as (client, url):

        async def all_but_absent() -> bool:
            return await firing(client, url) >= OPERATIONS - {"GearshiftControllerAbsent"}

        await until(all_but_absent, seconds=30, what="the failing fleet's alerts")
        assert "GearshiftControllerAbsent" not in await firing(client, url), "a controller is scraped"
        exporter.controller_up = False  # its scrape fails: Prometheus marks its series stale

        async def absent() -> bool:
            return "GearshiftControllerAbsent" in await firing(client, url)

        await until(absent, seconds=20, what="GearshiftControllerAbsent")


@pytest.mark.prometheus
def test_the_operations_alerts_have_durations_and_the_group_is_what_the_test_loads() -> None:
    names = {r["alert"] for r in alerts()}
    assert names >= OPERATIONS
    groups = yaml.safe_load((RULES_DIR / "gearshift.rules.yml").read_text())["groups"]
    (group,) = [g for g in groups if g["name"] == "gearshift-operations-alerts"]
    assert {r["alert"] for r in group["rules"]} == OPERATIONS
    for rule in group["rules"]:
        assert re.fullmatch(r"\d+m", rule["for"]), f"{rule['alert']}: a `for` of whole minutes keeps blips quiet"
