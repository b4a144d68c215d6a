"""The ledger-retention CronJob's own command line (deploy/kubernetes/base/ledger-retention.yaml), run with the
real CLI against a real Redis: it trims what is older than its age bound, after exporting exactly that, and the
export directory is the mounted volume."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleet.config import CommonSettings
from fleet.store.factory import build_store
from fleet.store.ledger_export import ExportDirectory
from fleet.store.protocol import UsageRecord
from gearshift.cli.app import app

from .deploy_kustomize import build
from .deploy_pods import container_args, container_env, pods

pytestmark = pytest.mark.redis
K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _job_args(tmp_path: Path) -> tuple[list[str], str]:
    root = tmp_path / "kubernetes"
    shutil.copytree(K8S, root)
    shutil.copy(root / "base" / "secrets.env.example", root / "base" / "secrets.env")
    resources = build(root / "sim")
    (job,) = [r for r in resources if r["kind"] == "CronJob" and r["metadata"]["name"] == "ledger-retention"]
    (pod,) = pods(job)
    (container,) = pod.spec["containers"]
    argv = container_args(pod, container, container_env(pod, container, resources))
    (mount,) = container["volumeMounts"]
    assert argv[argv.index("--export-dir") + 1] == mount["mountPath"], "exports go to the mounted volume"
    return argv, mount["mountPath"]


async def test_the_cronjob_command_trims_old_records_after_exporting_them(tmp_path: Path, redis_url: str) -> None:
    argv, mount = _job_args(tmp_path)
    exports = tmp_path / "exports"
    argv[argv.index(mount)] = str(exports)
    prefix = f"retain-{uuid.uuid4().hex[:8]}:"
    store = build_store(CommonSettings(redis_url=redis_url, key_prefix=prefix))
    now = time.time()
    old = [
        UsageRecord(
            request_id=f"old-{i}",
            tenant="acme",
            model="m",
            worker_id="w",
            prompt_tokens=1,
            completion_tokens=1,
            cost_usd=0.0,
            status="ok",
            at=now - 3 * 86400 + i,
        )
        for i in range(50)
    ]
    fresh = [r.model_copy(update={"request_id": f"new-{i}", "at": now - 60 + i}) for i, r in enumerate(old[:10])]
    try:
        await store.append_usage_many([*old, *fresh])
        env = {"GEARSHIFT_REDIS_URL": redis_url, "GEARSHIFT_KEY_PREFIX": prefix}
        result = await asyncio.to_thread(CliRunner().invoke, app, argv, env=env)
        assert result.exit_code == 0, result.output
        assert "acme: trimmed 50 records" in result.output
        left = await store.usage("acme", since=0, until=now + 1, limit=100)
        assert [r.request_id for r in left.records] == [r.request_id for r in fresh]
        assert [r.request_id for r in ExportDirectory(exports).records()] == [r.request_id for r in old]
    finally:
        await store.close()
