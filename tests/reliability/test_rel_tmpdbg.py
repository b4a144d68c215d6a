import asyncio, sys, io
import pytest
from rel_harness import KEYS, chat, fleet_of, tenants_of, FAST
from bench.soak_client import stream_chat
from fleet.store_redis import RedisStore
from fleet.clock import SystemClock
from gateway.serve import GatewayServer
from gateway.settings import GatewaySettings
import aiohttp, uuid, random

@pytest.mark.parametrize("i", range(6))
async def test_dbg(shared_workers, redis_url, i):
    prefix = f"dbg-{uuid.uuid4().hex[:8]}:"
    stores = [RedisStore.from_url(redis_url, prefix=prefix) for _ in range(2)]
    tenants = tenants_of(alpha={"tpm": 20000})
    fleet = fleet_of([w.url for w in shared_workers])
    servers = [GatewayServer(GatewaySettings(**{**FAST, "log_level": "WARNING"}), store=s, clock=SystemClock(), fleet=fleet, tenants=tenants, rng=random.Random(1)) for s in stores]
    for s in servers: await s.start()
    sem = asyncio.Semaphore(64)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(k):
            async with sem:
                return await stream_chat(s, servers[k % 2].url, key=KEYS["alpha"], body=chat(100))
        results = await asyncio.gather(*(one(k) for k in range(400)))
    for srv in servers:
        t = asyncio.ensure_future(srv.stop())
        done, _ = await asyncio.wait({t}, timeout=8)
        if not done:
            out = io.StringIO()
            for task in asyncio.all_tasks():
                task.print_stack(limit=6, file=out)
            print("HUNG", srv.url, srv.gateway.pool.views["w0"].in_flight, srv.gateway.pool.views["w1"].in_flight, out.getvalue()[:12000])
            await t
    for st in stores: await st.close()
