"""deploy/compose: the file parses, and each service's command, env, ports and mounts match what the code reads."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import yaml
from typer.testing import CliRunner

from fleet.config import FleetConfig, WorkerKind, load_fleet
from workers.sim.settings import SimWorkerSettings

from .deploy_compose import COMPOSE_DIR, SERVICE_KEYS, TOP_LEVEL, Service, load, services
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


def fleet_of(svcs: dict[str, Service]) -> FleetConfig:
    """The fleet file the gateways load, read through their bind mount."""
    gateway = svcs["gateway-1"]
    return load_fleet(gateway.host_file(gateway.env["GEARSHIFT_FLEET_FILE"]))


def own_fleet(svc: Service, options: dict[str, str], default: FleetConfig) -> FleetConfig:
    """The fleet file a service reads: its ``--fleet-file`` option, else the gateways' one."""
    return load_fleet(svc.host_file(options["--fleet-file"])) if "--fleet-file" in options else default


def running(svcs: dict[str, Service], profile: str | None) -> dict[str, Service]:
    return {n: s for n, s in svcs.items() if not s.profiles or (profile is not None and profile in s.profiles)}


def test_compose_file_shape_and_references() -> None:
    compose = load()
    assert set(compose) <= TOP_LEVEL
    svcs = services(compose)
    roles = [n.rsplit("-", 1)[0] for n in running(svcs, None)]
    for role, count in {"gateway": 2, "controller": 2, "sim": 2, "redis": 1, "prometheus": 1, "grafana": 1}.items():
        assert roles.count(role) == count, f"{role}: {roles.count(role)} services"
    assert "otel-collector" in svcs
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
def test_gearshift_services_run_real_subcommands_with_settings_the_code_reads(fleet_name: str) -> None:
    svcs = services(load(FLEETS[fleet_name]))
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
def test_fleet_workers_are_services_configured_like_their_fleet_entry(fleet_name: str) -> None:
    svcs = services(load(FLEETS[fleet_name]))
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


def test_prometheus_scrapes_every_gearshift_process_with_its_worker_label() -> None:
    svcs = services(load(FLEETS["fleet-vllm"]))
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


def test_gateways_send_traces_to_the_collector_and_grafana_gets_the_dashboards() -> None:
    svcs = services(load())
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
