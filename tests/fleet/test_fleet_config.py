"""Configuration: the embedded defaults load; bad files fail with messages naming the file and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fleet.config import (
    CommonSettings,
    ConfigError,
    FleetConfig,
    key_digest,
    load_fleet,
    load_tenants,
)

DEV_PEPPER = CommonSettings().key_pepper.get_secret_value()

GOOD_FLEET = """
models:
  - name: kimi-k3
workers:
  - id: w0
    url: http://127.0.0.1:9000
    model: kimi-k3
  - id: w1
    url: http://127.0.0.1:9001
    model: kimi-k3
    gpus: 8
    usd_per_gpu_hour: 2.5
"""

GOOD_TENANTS = """
tiers:
  gold: {priority: 0, tpot_target_s: 0.05, speculation: speed}
tenants:
  - id: acme
    tier: gold
    rpm: 60
    keys:
      - {id: k1, digest: "hmac-sha256:%s"}
""" % ("ab" * 32)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_embedded_defaults_load() -> None:
    fleet = load_fleet()
    tenants = load_tenants()
    assert len(fleet.workers) >= 2
    for worker in fleet.workers:
        assert fleet.model(worker.model) is not None
        assert worker.url.startswith("http://127.0.0.1:")
    assert {t.tier for t in tenants.tenants} <= set(tenants.tiers)


def test_default_demo_keys_match_their_digests() -> None:
    tenants = load_tenants()
    digests = {k.digest: t.id for t in tenants.tenants for k in t.keys}
    assert digests[key_digest("gs-demo-key", pepper=DEV_PEPPER)] == "demo"
    assert digests[key_digest("gs-batch-key", pepper=DEV_PEPPER)] == "batch-demo"


def test_good_files_load(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, "fleet.yaml", GOOD_FLEET))
    worker = fleet.worker("w1")
    assert worker is not None
    assert worker.usd_per_second == pytest.approx(8 * 2.5 / 3600)
    tenants = load_tenants(write(tmp_path, "tenants.yaml", GOOD_TENANTS))
    acme = tenants.tenant("acme")
    assert acme is not None
    assert acme.allows("anything")


def assert_config_error(path: Path, loader: object, *fragments: str) -> None:
    assert callable(loader)
    with pytest.raises(ConfigError) as info:
        loader(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_unknown_tier_names_the_tenant(tmp_path: Path) -> None:
    path = write(tmp_path, "t.yaml", GOOD_TENANTS + "  - {id: other, tier: platinum}\n")
    assert_config_error(path, load_tenants, f"{path}: tenants[1].tier: unknown tier 'platinum'")


def test_unknown_model_names_the_worker(tmp_path: Path) -> None:
    path = write(tmp_path, "f.yaml", GOOD_FLEET.replace("model: kimi-k3\n    gpus", "model: kimi-k2\n    gpus"))
    assert_config_error(path, load_fleet, f"{path}: workers[1].model: unknown model 'kimi-k2'")


def test_bad_digest_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "t.yaml", GOOD_TENANTS.replace("hmac-sha256:" + "ab" * 32, "sha1:deadbeef"))
    assert_config_error(path, load_tenants, f"{path}: tenants[0].keys[0].digest: String should match pattern")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (GOOD_FLEET.replace("id: w1", "id: w0"), "workers: duplicate worker id"),
        (GOOD_FLEET.replace("models:\n  - name: kimi-k3", "models:\n  - name: kimi-k3\n  - name: kimi-k3"), "models"),
    ],
)
def test_duplicate_fleet_ids(tmp_path: Path, text: str, fragment: str) -> None:
    assert_config_error(write(tmp_path, "f.yaml", text), load_fleet, fragment)


def test_duplicate_tenant_ids(tmp_path: Path) -> None:
    text = GOOD_TENANTS + "  - {id: acme, tier: gold}\n"
    assert_config_error(write(tmp_path, "t.yaml", text), load_tenants, "duplicate tenant id")


def test_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    assert_config_error(write(tmp_path, "f.yaml", "models: [\n  - name: x\n"), load_fleet, "not valid YAML")


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    assert_config_error(tmp_path / "absent.yaml", load_fleet, "cannot read")


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("gpus: 8", "gpus: 0", "workers[1].gpus"),
        ("url: http://127.0.0.1:9001", "url: ftp://x", "workers[1].url"),
        ("gpus: 8", "gpus: 8\n    colour: blue", "workers[1].colour"),
    ],
)
def test_bad_field_values_name_the_field(tmp_path: Path, old: str, new: str, fragment: str) -> None:
    assert_config_error(write(tmp_path, "f.yaml", GOOD_FLEET.replace(old, new)), load_fleet, fragment)


def test_empty_file_fails(tmp_path: Path) -> None:
    assert_config_error(write(tmp_path, "f.yaml", ""), load_fleet, "(top level)")


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write(tmp_path, "fleet.yaml", GOOD_FLEET)
    monkeypatch.setenv("GEARSHIFT_FLEET_FILE", str(path))
    monkeypatch.setenv("GEARSHIFT_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("GEARSHIFT_KEY_PREFIX", "gs2:")
    settings = CommonSettings()
    assert (settings.redis_url, settings.key_prefix) == ("redis://127.0.0.1:1/0", "gs2:")
    assert isinstance(settings.fleet(), FleetConfig)
    assert [w.id for w in settings.fleet().workers] == ["w0", "w1"]


def test_settings_reject_unknown_fields() -> None:
    with pytest.raises(ValueError, match="redis_ulr"):
        CommonSettings.model_validate({"redis_ulr": "redis://x"})


def test_key_digest_depends_on_the_pepper() -> None:
    a = key_digest("secret", pepper="p1")
    assert a.startswith("hmac-sha256:")
    assert len(a) == len("hmac-sha256:") + 64
    assert a != key_digest("secret", pepper="p2")
    assert a == key_digest("secret", pepper="p1")
