"""deploy/compose: the file parses, and each service's command, env, ports and mounts match what the code reads."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from typer.testing import CliRunner

from controller.settings import ControllerSettings
from fleet.config import DEV_SECRETS, FleetConfig, WorkerKind, load_fleet
from gateway.settings import GatewaySettings
from workers.sim.settings import SimWorkerSettings
from workers.vllm.settings import VllmPluginSettings

from .deploy_compose import COMPOSE_DIR, COMPOSE_FILE, SERVICE_KEYS, TOP_LEVEL, MissingVariable, Service, services
from .deploy_compose import load as load_compose
from .deploy_contracts import (
    bind_host,
    env_names,
    listen_port,
    load_settings,
    option_values,
    resolve_command,
    served_paths,
)
from .deploy_contracts import settings_class as settings_of

FLEETS = {"fleet-sim": {}, "fleet-vllm": {"GEARSHIFT_FLEET": "fleet-vllm"}}
"""Fleet file → the environment that selects it (README: GEARSHIFT_FLEET=fleet-vllm with --profile vllm)."""
SECRET_NAMES = {"GEARSHIFT_KEY_PEPPER", "GEARSHIFT_ADMIN_KEY", "GEARSHIFT_CONTROL_TOKEN"}
COMPOSE_ENV = Path(__file__).parents[2] / "scripts" / "compose-env.sh"


def compose_env(path: Path) -> dict[str, str]:
    """Run the first-run script into ``path`` and read the variables it wrote."""
    subprocess.run(["bash", str(COMPOSE_ENV), str(path)], check=True, capture_output=True, timeout=30)
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return dict(line.split("=", 1) for line in lines)


@pytest.fixture(scope="module")
def dotenv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The ``.env`` a first run of ``scripts/compose-env.sh`` writes."""
    return compose_env(tmp_path_factory.mktemp("compose") / ".env")


def load(dotenv: dict[str, str], extra: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose file as Compose reads it with the generated ``.env`` (and ``extra`` variables)."""
    return load_compose({**dotenv, **(extra or {})})


def fleet_of(svcs: dict[str, Service]) -> FleetConfig:
    """The fleet file the gateways load, read through their bind mount."""
    gateway = svcs["gateway-1"]
    return load_fleet(gateway.host_file(gateway.env["GEARSHIFT_FLEET_FILE"]))


def own_fleet(svc: Service, options: dict[str, str], default: FleetConfig) -> FleetConfig:
    """The fleet file a service reads: its ``--fleet-file`` option, else the gateways' one."""
    return load_fleet(svc.host_file(options["--fleet-file"])) if "--fleet-file" in options else default


def running(svcs: dict[str, Service], profile: str | None) -> dict[str, Service]:
    return {n: s for n, s in svcs.items() if not s.profiles or (profile is not None and profile in s.profiles)}


def test_compose_file_shape_and_references(dotenv: dict[str, str]) -> None:
    compose = load(dotenv)
    assert set(compose) <= TOP_LEVEL
    svcs = services(compose)
    roles = [n.rsplit("-", 1)[0] for n in running(svcs, None)]
    for role, count in {"gateway": 2, "controller": 2, "sim": 2, "redis": 1, "prometheus": 1}.items():
        assert roles.count(role) == count, f"{role}: {roles.count(role)} services"
    for name in ("grafana", "otel-collector"):  # images that cannot be built here: the README names them not run
        assert svcs[name].profiles == ["observability"], name
    assert "vllm" in svcs["vllm-0"].profiles
    for svc in svcs.values():
        assert set(svc.spec) <= SERVICE_KEYS, f"{svc.name}: unknown keys {set(svc.spec) - SERVICE_KEYS}"
        assert "image" in svc.spec
        if "build" in svc.spec:
            build = svc.spec["build"]
            assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).is_file(), svc.name
        for dep, cond in svc.spec.get("depends_on", {}).items():
            assert dep in svcs, f"{svc.name} depends on unknown {dep}"
            if cond.get("condition") == "service_healthy":
                assert "healthcheck" in svcs[dep].spec, f"{svc.name} waits for {dep}'s health, which has no check"
        for target, source in svc.bind_mounts().items():
            assert source.exists(), f"{svc.name}: {source} (mounted at {target}) does not exist"
        for volume in svc.spec.get("volumes", []):
            volume_name = str(volume).split(":")[0]
            if not volume_name.startswith((".", "/")):
                assert volume_name in compose["volumes"], f"{svc.name}: undeclared volume {volume_name}"
    host_ports = [p for s in svcs.values() for p in s.published().values()]
    assert len(host_ports) == len(set(host_ports)), "two services publish the same host port"


@pytest.mark.parametrize("fleet_name", FLEETS)
def test_gearshift_services_run_real_subcommands_with_settings_the_code_reads(
    fleet_name: str, dotenv: dict[str, str]
) -> None:
    svcs = services(load(dotenv, FLEETS[fleet_name]))
    fleet = fleet_of(svcs)
    runner = CliRunner()
    from gearshift.cli.app import app

    for svc in (s for s in svcs.values() if s.is_gearshift):
        process, command, args = resolve_command(svc.argv)
        options = option_values(command, args)
        assert runner.invoke(app, [*process.command, "--help"]).exit_code == 0, svc.name
        unknown = {k for k in svc.env if k.startswith("GEARSHIFT_")} - env_names(settings_of(process))
        assert not unknown, f"{svc.name}: the code reads no {sorted(unknown)}"
        settings = load_settings(process, svc.env)
        for key in ("GEARSHIFT_FLEET_FILE", "GEARSHIFT_TENANTS_FILE"):
            if key in svc.env:
                assert svc.host_file(svc.env[key]).is_file(), f"{svc.name}: {key} names no mounted file"
        if "--fleet-file" in options:
            assert svc.host_file(options["--fleet-file"]).is_file()
        port = listen_port(process, settings, own_fleet(svc, options, fleet), options.get("--worker-id"))
        assert bind_host(process, settings) in (None, "0.0.0.0"), f"{svc.name} must bind every interface"
        url = svc.healthcheck_url()
        assert url is not None, f"{svc.name}: no HTTP healthcheck"
        assert urlsplit(url).port == port, f"{svc.name}: {url}"
        assert urlsplit(url).path in served_paths(process), f"{svc.name}: {url}"
        for container_port in svc.published():
            assert container_port == port, f"{svc.name} publishes {container_port} but listens on {port}"


@pytest.mark.parametrize("fleet_name", FLEETS)
def test_fleet_workers_are_services_configured_like_their_fleet_entry(fleet_name: str, dotenv: dict[str, str]) -> None:
    svcs = services(load(dotenv, FLEETS[fleet_name]))
    fleet = fleet_of(svcs)
    profile = "vllm" if fleet_name == "fleet-vllm" else None
    up = running(svcs, profile)
    for worker in fleet.workers:
        host, port = urlsplit(worker.url).hostname, urlsplit(worker.url).port
        assert host in up, f"{worker.id}: no running service {host!r} (profile {profile})"
        svc = up[host]
        process, command, args = resolve_command(svc.argv)
        settings = load_settings(process, svc.env)
        options = option_values(command, args)
        assert listen_port(process, settings, own_fleet(svc, options, fleet), options.get("--worker-id")) == port
        if worker.kind is WorkerKind.SIM:
            assert process.command == ("sim", "serve")
            assert isinstance(settings, SimWorkerSettings)
            assert (settings.worker_id, settings.model, settings.max_num_seqs) == (
                worker.id,
                worker.model,
                worker.max_num_seqs,
            )
        else:
            assert process.command == ("worker", "vllm")
            assert option_values(command, args)["--worker-id"] == worker.id


def test_prometheus_scrapes_every_gearshift_process_with_its_worker_label(dotenv: dict[str, str]) -> None:
    svcs = services(load(dotenv, FLEETS["fleet-vllm"]))
    prometheus = svcs["prometheus"]
    config = yaml.safe_load(prometheus.host_file("/etc/prometheus/prometheus.yml").read_text())
    assert prometheus.host_file("/etc/prometheus/rules").is_dir()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    fleet = fleet_of(svcs)
    ports: dict[str, int] = {}
    for svc in (s for s in svcs.values() if s.is_gearshift):
        process, command, args = resolve_command(svc.argv)
        options = option_values(command, args)
        settings = load_settings(process, svc.env)
        ports[svc.name] = listen_port(process, settings, own_fleet(svc, options, fleet), options.get("--worker-id"))
    expected = {
        "gearshift-gateway": {f"{n}:{p}" for n, p in ports.items() if n.startswith("gateway-")},
        "gearshift-controller": {f"{n}:{p}" for n, p in ports.items() if n.startswith("controller-")},
    }
    for job, targets in expected.items():
        assert {t for sc in jobs[job]["static_configs"] for t in sc["targets"]} == targets, job
    worker_targets = {
        t: sc.get("labels", {}).get("worker")
        for sc in jobs["gearshift-worker"]["static_configs"]
        for t in sc["targets"]
    }
    for worker in fleet.workers:
        target = f"{urlsplit(worker.url).hostname}:{urlsplit(worker.url).port}"
        assert worker_targets.get(target) == worker.id, f"{worker.id}: scraped as {worker_targets.get(target)}"


OBSERVABILITY = {"GEARSHIFT_OTLP_ENDPOINT": "http://otel-collector:4318/v1/traces"}
"""The environment of the ``observability`` profile, as the compose file's header documents it."""


def test_gateways_send_traces_to_the_collector_and_grafana_gets_the_dashboards(dotenv: dict[str, str]) -> None:
    header = COMPOSE_FILE.read_text()
    assert f"GEARSHIFT_OTLP_ENDPOINT={OBSERVABILITY['GEARSHIFT_OTLP_ENDPOINT']}" in header
    assert "--profile observability" in header
    assert all(not s.env["GEARSHIFT_OTLP_ENDPOINT"] for s in services(load(dotenv)).values() if "gateway" in s.name)
    svcs = services(load(dotenv, OBSERVABILITY))
    collector = yaml.safe_load(svcs["otel-collector"].host_file("/etc/otelcol/config.yaml").read_text())
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert "otlp" in collector["service"]["pipelines"]["traces"]["receivers"]
    for name in ("gateway-1", "gateway-2"):
        endpoint = urlsplit(svcs[name].env["GEARSHIFT_OTLP_ENDPOINT"])
        assert (endpoint.hostname, endpoint.port) == ("otel-collector", int(http.rsplit(":", 1)[1]))
    grafana = svcs["grafana"]
    provisioning = grafana.host_file("/etc/grafana/provisioning")
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "gearshift.yaml").read_text())["providers"]
    dashboards = grafana.host_file(provider["options"]["path"])
    assert sorted(p.name for p in dashboards.glob("*.json")), "no dashboards provisioned"
    home = grafana.spec["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert grafana.host_file(home).is_file()
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert urlsplit(source["url"]).hostname == "prometheus"


# ------------------------------------------------------------------------------------------------ secrets
def test_the_first_run_script_writes_fresh_secrets_once(tmp_path: Path, dotenv: dict[str, str]) -> None:
    path = tmp_path / ".env"
    first = compose_env(path)
    assert set(first) == SECRET_NAMES
    assert set(first.values()).isdisjoint(DEV_SECRETS.values())
    assert all(len(value) >= 32 for value in first.values())
    assert set(first.values()).isdisjoint(dotenv.values()), "each run draws new secrets"
    assert path.stat().st_mode & 0o077 == 0, "the .env is readable by its owner only"
    assert compose_env(path) == first, "a second run keeps the deployment's secrets"
    assert (COMPOSE_DIR / ".gitignore").read_text().split() == [".env"]


def test_compose_takes_every_secret_from_the_env_file_and_has_no_fallback(dotenv: dict[str, str]) -> None:
    assert not any(value in COMPOSE_FILE.read_text() for value in DEV_SECRETS.values())
    for name in SECRET_NAMES:
        with pytest.raises(MissingVariable, match=f"{name}: run scripts/compose-env.sh first"):
            load({k: v for k, v in dotenv.items() if k != name})
    svcs = services(load(dotenv, FLEETS["fleet-vllm"]))
    for svc in (s for s in svcs.values() if s.is_gearshift):
        for name in SECRET_NAMES & set(svc.env):
            assert svc.env[name] == dotenv[name], f"{svc.name}: {name}"


def test_compose_services_refuse_the_development_secrets(dotenv: dict[str, str]) -> None:
    """The guard rail: shared mode (Redis) or a public listen address with a development secret fails at start."""
    dev = {f"GEARSHIFT_{name.upper()}": value for name, value in DEV_SECRETS.items()}
    svcs = services(load(dev))
    for name in ("gateway-1", "controller-1", "sim-0"):
        process, _, _ = resolve_command(svcs[name].argv)
        with pytest.raises(
            ValidationError, match=r"GEARSHIFT_(KEY_PEPPER|CONTROL_TOKEN)\b.*GEARSHIFT_ALLOW_DEV_SECRETS"
        ):
            load_settings(process, svcs[name].env)
        load_settings(process, {**svcs[name].env, "GEARSHIFT_ALLOW_DEV_SECRETS": "1"})


@pytest.mark.parametrize(
    ("cls", "exposed", "variables"),
    [
        (GatewaySettings, {"redis_url": "redis://r:6379/0"}, "GEARSHIFT_KEY_PEPPER, GEARSHIFT_ADMIN_KEY"),
        (GatewaySettings, {"host": "0.0.0.0"}, "GEARSHIFT_KEY_PEPPER, GEARSHIFT_ADMIN_KEY"),
        (ControllerSettings, {"redis_url": "redis://r:6379/0"}, "GEARSHIFT_CONTROL_TOKEN"),
        (SimWorkerSettings, {"host": "0.0.0.0"}, "GEARSHIFT_CONTROL_TOKEN"),
        (VllmPluginSettings, {"host": ""}, "GEARSHIFT_CONTROL_TOKEN"),
        (VllmPluginSettings, {"redis_url": "redis://r:6379/0"}, "GEARSHIFT_CONTROL_TOKEN"),
    ],
)
def test_every_process_refuses_development_secrets_outside_the_embedded_default(
    cls: Callable[..., BaseSettings], exposed: dict[str, str], variables: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GEARSHIFT_KEY_PEPPER", "GEARSHIFT_ADMIN_KEY", "GEARSHIFT_CONTROL_TOKEN", "GEARSHIFT_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    cls()  # the embedded default: in-process store, loopback
    with pytest.raises(ValidationError, match=f"{variables}: the development value is refused"):
        cls(**exposed)
    cls(**exposed, allow_dev_secrets=True)
    names = [name.removeprefix("GEARSHIFT_").lower() for name in variables.split(", ")]
    cls(**exposed, **{name: name[0] * 32 for name in names})  # real secrets pass
