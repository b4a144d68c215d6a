"""The console in a real browser: Playwright drives Debian's Chromium (``/usr/bin/chromium``, no browser
download) against ``gearshift up``. It logs in, creates a tenant and a key, sends a request with that key
through the OpenAI client, sees the spend appear, suspends the tenant and sees a 403, edits a tier (and sees a
bad value refused by name), checks that a form without its CSRF token is refused, and logs out.

With ``CONSOLE_SCREENSHOTS_DIR=<dir>`` (not a ``GEARSHIFT_`` variable: the tests clear those) it saves a
screenshot of every page there (``scripts/console-screenshots.sh`` writes the docs' ones).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import openai
import pytest
import yaml
from playwright.async_api import Page, async_playwright, expect

from bench.procs import Proc, free_port, gearshift_argv, spawn, wait_http_ready
from fleet.config import DEV_SECRETS, load_yaml

CHROMIUM = "/usr/bin/chromium"
MODEL = "kimi-k3"
FLEET = Path(__file__).resolve().parents[2] / "fleet" / "defaults" / "fleet.yaml"
TENANT = "browser-co"
BURST = 12
"""Requests sent at once after the first, so the fleet and cost pages have latencies and costs to show."""

# Heavy: about 35 s on a quiet machine, 70-80 s beside the other helpers' work (load ~20 on 2 cores), over the
# ~30 s budget of the default suite. scripts/heavy-tests.sh and scripts/console-screenshots.sh run it.
pytestmark = [pytest.mark.browser, pytest.mark.heavy, pytest.mark.timeout(300)]


@contextmanager
def gearshift_up(tmp_path: Path) -> Iterator[str]:
    """``gearshift up`` (the embedded default, simulated workers sped up) on free ports; yields the gateway URL."""
    fleet = load_yaml(FLEET)
    for worker in fleet["workers"]:
        worker["url"] = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    port = free_port()
    env = {
        "GEARSHIFT_FLEET_FILE": str(tmp_path / "fleet.yaml"),
        "GEARSHIFT_PORT": str(port),
        "GEARSHIFT_SPOOL_DIR": str(tmp_path / "spool"),
    }
    proc: Proc = spawn("gearshift-up", gearshift_argv("up", "--speedup", "20"), log_dir=tmp_path, env=env)
    try:
        wait_http_ready(proc, f"http://127.0.0.1:{port}/readyz", timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


@asynccontextmanager
async def browser_page() -> AsyncIterator[Page]:
    assert shutil.which(CHROMIUM), "chromium not found: run scripts/bootstrap.sh (Debian package `chromium`)"
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            yield await context.new_page()
        finally:
            await browser.close()


async def shot(page: Page, name: str) -> None:
    """Save the page as ``<name>.png`` in ``CONSOLE_SCREENSHOTS_DIR`` when it is set (Playwright makes the
    folder)."""
    folder = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
    if folder:
        await page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


async def ask(client: openai.AsyncOpenAI, *, tokens: int) -> None:
    """One streamed chat (the ledger has a TPOT only for streams), read to its end."""
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=tokens, stream=True
    )
    async for _ in stream:
        pass


async def spent(page: Page) -> float:
    text = await page.locator("strong.spent").inner_text()
    return float(re.sub(r"[^0-9.]", "", text) or 0)


async def test_an_operator_runs_a_tenant_through_the_console(tmp_path: Path) -> None:
    started = time.monotonic()
    with gearshift_up(tmp_path) as url:
        console = f"{url}/console"
        async with browser_page() as page:
            await page.goto(console + "/")
            await expect(page.get_by_label("Admin key")).to_be_visible()
            await shot(page, "login")
            await page.get_by_label("Admin key").fill("not-the-key")
            await page.get_by_role("button", name="Log in").click()
            await expect(page.get_by_role("alert")).to_contain_text("Incorrect admin key")
            await page.get_by_label("Admin key").fill(DEV_SECRETS["admin_key"])
            await page.get_by_role("button", name="Log in").click()
            await expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
            await expect(page.locator("tbody tr").first).to_contain_text("sim-0")
            cookie = next(c for c in await page.context.cookies() if c["name"] == "gearshift_console")
            assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")
            assert 0 < cookie["expires"] - time.time() <= 3600

            # a tenant and a key
            await page.get_by_role("link", name="Tenants").click()
            form = page.locator("form[action$='/console/tenants']")
            await form.get_by_label("id").fill(TENANT)
            await form.get_by_label("budget USD").fill("50")
            await form.get_by_role("button", name="Create tenant").click()
            await expect(page.get_by_role("status")).to_contain_text(f"Tenant {TENANT} created")
            await page.get_by_role("link", name=TENANT).click()
            await page.get_by_role("button", name="Create key").click()
            secret = (await page.locator("#new-secret").inner_text()).strip()
            assert secret.startswith("gs-")

            # a request with that key, and its spend on the tenant's page
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0) as client:
                reply = await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=16
                )
                assert reply.usage is not None
                assert reply.usage.completion_tokens > 0
                await asyncio.gather(*(ask(client, tokens=48) for _ in range(BURST)))
                tenant_page = f"{console}/tenants/{TENANT}"
                for _ in range(50):  # the spend settles just after the response
                    await page.goto(tenant_page)
                    if await spent(page) > 0:
                        break
                    await asyncio.sleep(0.2)
                assert await spent(page) > 0
                await shot(page, "tenant")

                # suspended: its requests get a 403
                await page.get_by_role("button", name="Suspend tenant").click()
                await expect(page.get_by_role("status")).to_contain_text("suspended")
                with pytest.raises(openai.PermissionDeniedError):
                    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])

                # a form without (or with a wrong) CSRF token is refused, and changes nothing
                forged: list[dict[str, str | float | bool]] = [{}, {"csrf": "forged"}]
                for data in forged:
                    refused = await page.request.post(f"{tenant_page}/resume", form=data, max_redirects=0)
                    assert refused.status == 403, await refused.text()
                await page.goto(tenant_page)
                await expect(page.get_by_role("heading", name=f"Tenant {TENANT}")).to_contain_text("suspended")

            # a tier: a bad value is refused by name, a good one lands
            await page.get_by_role("link", name="Tiers").click()
            tier_form = page.locator("form.tier-form[data-tier='interactive']")
            await tier_form.get_by_label("TPOT target s").fill("-1")
            await tier_form.get_by_role("button", name="Save interactive").click()
            await expect(page.get_by_role("alert")).to_contain_text("tpot_target_s")
            tier_form = page.locator("form.tier-form[data-tier='interactive']")
            await tier_form.get_by_label("TPOT target s").fill("0.09")
            await tier_form.get_by_role("button", name="Save interactive").click()
            await expect(page.get_by_role("status")).to_contain_text("Tier interactive saved")
            await expect(page.locator("tbody tr", has_text="interactive")).to_contain_text("90 ms")
            await shot(page, "tiers")

            await page.get_by_role("link", name="Costs").click()
            await expect(page.locator("tbody tr", has_text=TENANT)).to_contain_text(MODEL)
            await shot(page, "costs")
            await page.get_by_role("link", name="Tenants").click()
            await expect(page.locator("table.audit")).to_contain_text("tenant.update")
            await shot(page, "tenants")
            await page.get_by_role("link", name="Fleet").click()
            await expect(page.locator("tbody").first).to_contain_text(re.compile(r"\d+ ms / \d+ ms"))
            await shot(page, "fleet")

            await page.get_by_role("button", name="Log out").click()
            await expect(page.get_by_label("Admin key")).to_be_visible()
            await page.goto(tenant_page)
            await expect(page.get_by_label("Admin key")).to_be_visible()
    print(f"console browser test: {time.monotonic() - started:.1f} s")
