"""``gearshift top`` draws the tenants in force, not only the tenants file's: a tenant created or re-tiered at run
time shows in its tenants table, read from the store (``GEARSHIFT_REDIS_URL``) or through a real gateway's admin
API (``gearshift up``), every frame."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from rich.console import Console

from bench.procs import free_port
from fleet.clock import SystemClock
from fleet.config import TenantConfig
from fleet.store.memory import MemoryStore
from gateway.intake.tenant_book import TenantBook
from gateway.settings import GatewaySettings
from gateway.usage import audit
from gearshift.cli.top import GatewayAdminStates, StoreStates, run_top
from tests.gateway.harness import ADMIN_KEY, PEPPER, make_fleet, make_tenants, serve_gateway

ENTRY = audit.entry(who="admin", action="tenant.update", target="-", now=0.0)
"""The audit entry a run-time change is stored with (one write)."""


async def test_the_store_source_merges_the_run_time_changes_over_the_file() -> None:
    file = make_tenants()
    store = MemoryStore(clock=SystemClock())
    book = TenantBook(file, store, on_change=lambda _: None)
    await book.save(
        "beta",
        file.tenants[1].model_copy(update={"tier": "interactive"}),
        by="admin",
        now=0.0,
        log=audit.LOG,
        entry=ENTRY,
    )
    await book.save("delta", TenantConfig(id="delta", tier="batch"), by="admin", now=0.0, log=audit.LOG, entry=ENTRY)
    await book.save("gamma", None, by="admin", now=0.0, log=audit.LOG, entry=ENTRY)
    tiers = {t.id: t.tier for t in (await StoreStates(store).tenants(file)).tenants}
    assert tiers == {"alpha": "interactive", "beta": "interactive", "delta": "batch"}


async def test_top_draws_a_tenant_created_and_one_re_tiered_at_run_time_through_the_gateway(tmp_path: Path) -> None:
    file = make_tenants()
    fleet = make_fleet([f"http://127.0.0.1:{free_port()}"])  # no worker answers: only the tenants table matters
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet.model_dump(mode="json")))
    (tmp_path / "tenants.yaml").write_text(yaml.safe_dump(file.model_dump(mode="json")))
    settings = GatewaySettings(
        fleet_file=tmp_path / "fleet.yaml", tenants_file=tmp_path / "tenants.yaml", admin_key=ADMIN_KEY,
        key_pepper=PEPPER, allow_dev_secrets=True,
    )  # fmt: skip
    async with serve_gateway(fleet, file) as g, g.admin() as admin:
        assert (await admin.patch("/admin/v1/tenants/beta", json={"tier": "interactive"})).status_code == 200
        assert (await admin.post("/admin/v1/tenants", json={"id": "delta", "tier": "batch"})).status_code == 201
        console = Console(width=200, record=True, color_system=None)
        await run_top(settings, gateway_url=g.url, interval_s=0.1, once=True, console=console)
    rows = {cells[0]: cells for line in console.export_text().splitlines() if (cells := _cells(line))}
    assert rows["beta"][1] == "interactive"
    assert rows["delta"][1] == "batch"
    assert rows["gamma"][1] == "interactive"


async def test_the_gateway_source_falls_back_to_the_file_while_the_gateway_is_away() -> None:
    file = make_tenants()
    async with httpx.AsyncClient(timeout=2) as client:
        source = GatewayAdminStates(client, f"http://127.0.0.1:{free_port()}", ADMIN_KEY)
        assert await source.tenants(file) == file


def _cells(line: str) -> list[str]:
    """A table row's cells (empty for a line that is not a row)."""
    parts = line.split("│")
    return [p.strip() for p in parts[1:-1]] if len(parts) > 3 else []
