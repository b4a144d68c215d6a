"""Whether the previous release reads what this one writes, checked with the previous release's own code
(``PREVIOUS_RELEASE``'s ``fleet`` and ``gateway`` from git): a run-time tenant change as this release stores it, and
the key this release writes the admin audit log at. When it cannot, the two may not share a prefix, so this release's
``SCHEMA_VERSION`` must be higher than the previous one's (docs/operations/upgrades.md); when it can, either is
allowed. This is the record-format check ``SCHEMA_VERSION`` exists for."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import orjson

from fleet.config import TenantConfig
from fleet.store.keys import SCHEMA_VERSION, KeyLayout
from fleet.tenants import TenantChange
from gateway.usage import audit

from .test_deploy_mixed_release import PREVIOUS_RELEASE

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "gearshift:"
READER = """
import json, logging, sys
logging.disable(logging.WARNING)
from fleet.store.keys import SCHEMA_VERSION, KeyLayout
from fleet.tenants import parse_changes
from gateway.usage.audit import LOG
docs = json.load(sys.stdin)
read = {"tenants": sorted(parse_changes(docs)), "audit": KeyLayout(sys.argv[1]).log(LOG)}
print(json.dumps({"schema": SCHEMA_VERSION, **read}))
"""


def previous_tree(into: Path) -> Path:
    """The previous release's ``fleet`` and ``gateway`` packages at ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE, "fleet", "gateway"], check=True, capture_output=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def test_the_previous_release_reads_what_this_one_writes_or_the_schema_version_is_higher(tmp_path: Path) -> None:
    tenant = TenantConfig(id="acme", tier="interactive", rpm=5, suspended=True)
    change = TenantChange(tenant_id="acme", tenant=tenant, file_digest=None, changed_at=1.0, changed_by="admin-1")
    docs = {"acme": change.model_dump_json()}  # as gateway.intake.tenant_book stores it
    tree = previous_tree(tmp_path / "previous")
    done = subprocess.run(
        [sys.executable, "-c", READER, PREFIX], input=orjson.dumps(docs), capture_output=True, check=False,
        cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    previous = orjson.loads(done.stdout)
    misread = []
    if previous["tenants"] != ["acme"]:
        misread.append("it ignores the run-time tenant changes this release stores")
    if previous["audit"] != KeyLayout(PREFIX).log(audit.LOG):
        misread.append(f"it reads the audit log at {previous['audit']}, this release writes it elsewhere")
    if misread:
        assert previous["schema"] < SCHEMA_VERSION, (
            f"the previous release ({PREVIOUS_RELEASE}, schema {previous['schema']}) misreads this one's store: "
            f"{'; '.join(misread)}. Raise SCHEMA_VERSION (fleet/store/keys.py) with its upgrade step"
        )
