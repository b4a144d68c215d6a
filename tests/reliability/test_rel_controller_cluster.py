"""Two ``gearshift controller`` processes on a real Redis Cluster (their own: this test kills a master): one leads
and publishes the worker's state; SIGKILL of the master that holds the lease's slot is ridden out (its replica is
promoted, a leader holds the lease again, the state is published again, the worker's schedule lease never lapses:
it must outlive half itself, the failover and one controller back-off);
then the leader itself is killed and the standby takes over, still on the cluster. Heavy: about 40 s
(``scripts/heavy-tests.sh``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from bench.procs import Proc, start_redis_cluster
from fleet.store.redis import RedisStore
from tests.gateway.harness import eventually

from .rel_types import StartSims
from .test_rel_controller_faults import CONTROL, TIMING, _controller, _env, _holder, _holder_is, _metric

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.heavy]


async def _published_after(store: RedisStore, worker: str, at: float) -> bool:
    """The probe reads the cluster as any client does: while a replica is promoted it answers CLUSTERDOWN (seen at
    load 9), which is "not yet", not a failure of the controllers under test."""
    try:
        state = (await store.worker_states()).get(worker)
    except RedisError:
        return False
    return state is not None and state.updated_at > at


async def _led(store: RedisStore) -> bool:
    try:
        return await store.lease_holder("controller") is not None
    except RedisError:  # as above
        return False


async def test_leadership_and_worker_state_survive_the_lease_masters_death_and_a_leader_kill(
    sims: StartSims, procs: list[Proc], tmp_path: Path
) -> None:
    (w,) = await sims(1)
    cluster = start_redis_cluster(log_dir=tmp_path / "cluster")
    prefix = f"rel-ctlc-{uuid.uuid4().hex[:8]}:"
    try:
        probe = RedisCluster.from_url(cluster.url)
        await probe.initialize()
        owner = probe.get_node_from_key(f"{prefix}{{lease:controller}}")
        await probe.aclose()
        assert owner is not None
        victim = next(node for node in cluster.nodes if node.port == owner.port)
        survivor = next(node for node in cluster.nodes if node is not victim)  # the startup node must live
        # The worker's lease outlives a renewal's half-lease wait + the failover (about 4 s) + one back-off (1 s).
        env = _env(tmp_path, w.url, survivor.url, prefix, redis_cluster="true", schedule_lease_s=15, max_backoff_s=1)
        store = RedisStore.from_url(survivor.url, prefix=prefix, cluster=True, wait_s=0.5)
        await store.verify()
        async with httpx.AsyncClient(base_url=w.url, timeout=5) as c:
            put = await c.put(
                "/gearshift/v1/speculation", json={"k": 4, "version": 1, "lease_seconds": 15}, headers=CONTROL
            )
            assert put.status_code == 200
            ctl = {name: _controller(name, env, procs, tmp_path) for name in ("ctl-a", "ctl-b")}
            await eventually(lambda: _led(store), timeout_s=20)
            await eventually(lambda: _published_after(store, "w0", 0.0), timeout_s=10)
            # Counted from here: the test's own first lease may lapse before a controller renews it when a controller's
            # start-up (seconds of imports) outlasts it on a loaded machine; that is not the failover's doing.
            lapsed_before = _metric((await c.get("/metrics")).text, "gearshift_worker_spec_lease_expired_total")
            assert lapsed_before is not None

            victim.kill()
            killed_at, killed_wall = time.monotonic(), time.time()
            await eventually(lambda: _published_after(store, "w0", killed_wall), timeout_s=20)
            republished_s = time.monotonic() - killed_at
            await eventually(lambda: _led(store), timeout_s=5)
            leader = await _holder(store)
            standby = "ctl-b" if leader == "ctl-a" else "ctl-a"
            assert all(p.alive() for p in ctl.values()), "a controller died with the store's master"
            lapsed = _metric((await c.get("/metrics")).text, "gearshift_worker_spec_lease_expired_total")
            print(f"lease master killed: worker state published again after {republished_s:.2f} s; "
                  f"worker leases lapsed before the kill {lapsed_before:g}, after {lapsed}")  # fmt: skip
            assert lapsed == lapsed_before, "the worker's schedule lease lapsed while the cluster failed over"

            ctl[leader].kill()
            killed_at, killed_wall = time.monotonic(), time.time()
            await eventually(lambda: _holder_is(store, standby), timeout_s=3 * TIMING["leader_lease_s"] + 2)
            assert time.monotonic() - killed_at <= 2 * TIMING["leader_lease_s"] + 1.0
            await eventually(lambda: _published_after(store, "w0", killed_wall), timeout_s=10)  # by the new leader
        await store.close()
    finally:
        cluster.stop()
