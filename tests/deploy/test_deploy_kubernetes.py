"""deploy/kubernetes: every resource validates against the Kubernetes schema, cross-references hold, and
every gearshift container runs a real sub-command with settings, ports and probe paths the code has."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from fleet.config import FleetConfig, TenantsConfig, parse_model

from .deploy_contracts import (
    ROOT,
    bind_host,
    env_names,
    listen_port,
    load_settings,
    option_values,
    resolve_command,
    served_paths,
    settings_class,
)
from .deploy_kustomize import KustomizeError, Resource, build, pod_specs
from .deploy_pods import Pod, container_args, container_env, container_ports, pods

K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("sim", "kimi-k3")
KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes these manifests target (validated with the strict schemas: no unknown fields)."""
WORKLOADS = ("Deployment", "StatefulSet", "LeaderWorkerSet")
GEARSHIFT_IMAGES = ("ghcr.io/gearshift/gearshift:", "ghcr.io/gearshift/gearshift-vllm:")

LWS_SPEC_KEYS = {"replicas", "leaderWorkerTemplate", "startupPolicy", "rolloutStrategy", "networkConfig"}
LWS_TEMPLATE_KEYS = {"size", "leaderTemplate", "workerTemplate", "restartPolicy", "subGroupPolicy"}


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes with base/secrets.env made from the committed example (as an operator would)."""
    root = tmp_path_factory.mktemp("kubernetes")
    shutil.copytree(K8S, root, dirs_exist_ok=True)
    shutil.copy(root / "base" / "secrets.env.example", root / "base" / "secrets.env")
    return root


@functools.cache
def built(root: Path, overlay: str) -> tuple[Resource, ...]:
    return tuple(build(root / overlay))


def of_kind(resources: tuple[Resource, ...], *kinds: str) -> list[Resource]:
    return [r for r in resources if r["kind"] in kinds]


def named(resources: tuple[Resource, ...], kind: str, name: str) -> Resource:
    found = [r for r in of_kind(resources, kind) if r["metadata"]["name"] == name]
    assert found, f"{kind} {name!r} is referenced but not defined"
    return found[0]


def config_file(resources: tuple[Resource, ...], key: str) -> Any:
    return yaml.safe_load(named(resources, "ConfigMap", "gearshift-config")["data"][key])


def gearshift_containers(resources: tuple[Resource, ...]) -> list[tuple[Pod, dict[str, Any]]]:
    return [
        (pod, c)
        for r in of_kind(resources, *WORKLOADS)
        for pod in pods(r)
        for c in pod.spec["containers"]
        if c["image"].startswith(GEARSHIFT_IMAGES)
    ]


def validate_leaderworkerset(lws: Resource) -> None:
    """LeaderWorkerSet is a CRD outside the core schemas: check its shape, and each template as a core Pod."""
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert set(lws["spec"]) <= LWS_SPEC_KEYS, sorted(set(lws["spec"]) - LWS_SPEC_KEYS)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert set(template) <= LWS_TEMPLATE_KEYS, sorted(set(template) - LWS_TEMPLATE_KEYS)
    assert isinstance(template["size"], int)
    assert template["size"] >= 2
    assert template.get("restartPolicy", "RecreateGroupOnPodRestart") in ("RecreateGroupOnPodRestart", "None")
    for key in ("leaderTemplate", "workerTemplate"):
        pod = {"apiVersion": "v1", "kind": "Pod", **template[key]}
        pod["metadata"] = {"name": f"{lws['metadata']['name']}-{key.lower()}", **template[key]["metadata"]}
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


# --------------------------------------------------------------------------------------------------- schema
def test_secrets_come_from_an_uncommitted_env_file_with_every_key_the_manifests_use(k8s: Path) -> None:
    (secret,) = of_kind(built(k8s, "sim"), "Secret")
    example = K8S / "base" / "secrets.env.example"
    keys = {line.split("=")[0] for line in example.read_text().splitlines() if line and not line.startswith("#")}
    assert set(secret["data"]) == keys
    assert (K8S / "base" / ".gitignore").read_text().split() == ["secrets.env"]
    bare = k8s.parent / "without-secrets"
    shutil.copytree(K8S, bare)
    (bare / "base" / "secrets.env").unlink(missing_ok=True)
    with pytest.raises(KustomizeError, match=r"secrets\.env"):
        build(bare / "sim")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_validates_against_the_strict_kubernetes_schema(k8s: Path, overlay: str) -> None:
    resources = built(k8s, overlay)
    kinds = {r["kind"] for r in resources}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Secret"} <= kinds
    for resource in resources:
        if resource["kind"] == "LeaderWorkerSet":
            validate_leaderworkerset(resource)
        else:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_misspelt_field(k8s: Path) -> None:
    deployment = named(built(k8s, "sim"), "Deployment", "gateway")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz"}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


# ------------------------------------------------------------------------------------------ cross-references
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_match_pod_labels_and_service_ports_exist(k8s: Path, overlay: str) -> None:
    resources = built(k8s, overlay)
    all_pods = [pod for r in of_kind(resources, *WORKLOADS) for pod in pods(r)]
    for workload in of_kind(resources, "Deployment", "StatefulSet"):
        selector = workload["spec"]["selector"]["matchLabels"]
        template_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= template_labels.items(), workload["metadata"]["name"]
    for service in of_kind(resources, "Service"):
        selected = [p for p in all_pods if service["spec"]["selector"].items() <= p.labels.items()]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in selected:
                assert target in container_ports(pod.spec), f"Service {service['metadata']['name']}: {target}"
    for pdb in of_kind(resources, "PodDisruptionBudget"):
        match = pdb["spec"]["selector"]["matchLabels"]
        assert any(match.items() <= p.labels.items() for p in all_pods), pdb["metadata"]["name"]
    for hpa in of_kind(resources, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        target = named(resources, ref["kind"], ref["name"])
        assert "replicas" not in target["spec"], f"{ref['name']}: the HPA owns the replica count"
        requests = [c["resources"]["requests"] for c in target["spec"]["template"]["spec"]["containers"]]
        assert all("cpu" in r for r in requests), "a CPU-utilisation HPA needs CPU requests"
    for sts in of_kind(resources, "StatefulSet"):
        service = named(resources, "Service", sts["spec"]["serviceName"])
        assert service["spec"].get("clusterIP") == "None" or sts["metadata"]["name"] == "redis"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_pinned_and_every_gearshift_process_is_checked(k8s: Path, overlay: str) -> None:
    images = [
        c["image"] for r in of_kind(built(k8s, overlay), *WORKLOADS) for s in pod_specs(r) for c in s["containers"]
    ]
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name, f"{image}: no tag (an overlay lacks its `images` entry?)"
        assert tag != "latest", image
    assert {i for i in images if "gearshift" in i} == {i for i in images if i.startswith(GEARSHIFT_IMAGES)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_configmaps_and_claims_referenced_exist(k8s: Path, overlay: str) -> None:
    resources = built(k8s, overlay)
    for workload in of_kind(resources, *WORKLOADS):
        for spec in pod_specs(workload):
            for volume in spec.get("volumes", []):
                if "configMap" in volume:
                    named(resources, "ConfigMap", volume["configMap"]["name"])
                if "persistentVolumeClaim" in volume:
                    named(resources, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
            for container in spec["containers"]:
                assert "requests" in container.get("resources", {}), f"{container['name']}: no resource requests"
                for pod in pods(workload):
                    container_env(pod, container, list(resources))  # resolves every secretKeyRef and $(VAR)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_files_in_the_configmap_are_valid(k8s: Path, overlay: str) -> None:
    resources = built(k8s, overlay)
    fleet = parse_model(FleetConfig, config_file(resources, "fleet.yaml"), source="fleet.yaml")
    parse_model(TenantsConfig, config_file(resources, "tenants.yaml"), source="tenants.yaml")
    assert fleet.workers


# ------------------------------------------------------------------------------------ containers vs the code
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_real_subcommands_with_settings_the_code_reads(k8s: Path, overlay: str) -> None:
    resources = built(k8s, overlay)
    containers = gearshift_containers(resources)
    assert {c["name"] for _, c in containers} >= {"gateway", "controller"}
    fleet = parse_model(FleetConfig, config_file(resources, "fleet.yaml"), source="fleet.yaml")
    for pod, container in containers:
        where = f"{overlay}: {pod.name}/{container['name']}"
        env = container_env(pod, container, list(resources))
        process, command, args = resolve_command(container_args(pod, container, env))
        options = option_values(command, args)
        unknown = {k for k in env if k.startswith("GEARSHIFT_")} - env_names(settings_class(process))
        assert not unknown, f"{where}: the code reads no {sorted(unknown)}"
        settings = load_settings(process, env)
        for key in ("GEARSHIFT_FLEET_FILE", "GEARSHIFT_TENANTS_FILE"):
            if key in env:
                assert any(m["mountPath"].rstrip("/") + "/" in env[key] for m in container.get("volumeMounts", [])), (
                    f"{where}: {key}={env[key]} is not on a mounted volume"
                )
        if options.get("--node-rank", "0") != "0":  # a headless follower of a multi-node engine serves no HTTP
            assert "http" not in container_ports(pod.spec)
            assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(container), where
            continue
        port = listen_port(process, settings, fleet, options.get("--worker-id"))
        assert container_ports(pod.spec).get("http") == port, f"{where}: listens on {port}"
        assert bind_host(process, settings) in (None, "0.0.0.0"), f"{where}: must bind every interface in a pod"
        paths = served_paths(process)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container and "httpGet" in container[probe]:
                get = container[probe]["httpGet"]
                assert get["path"] in paths, f"{where}: {probe} {get['path']} is not served; served: {sorted(paths)}"
                assert container_ports(pod.spec)[get["port"]] == port
        if pod.annotations.get("prometheus.io/scrape") == "true":
            assert int(pod.annotations["prometheus.io/port"]) == port, where
            assert pod.annotations["prometheus.io/path"] in paths, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_fleet_urls_name_worker_pods_through_headless_services(k8s: Path, overlay: str) -> None:
    """Each worker's id is its pod's name (Prometheus's `worker` label) and its URL reaches that pod."""
    resources = built(k8s, overlay)
    fleet = parse_model(FleetConfig, config_file(resources, "fleet.yaml"), source="fleet.yaml")
    for worker in fleet.workers:
        host, port = worker.url.removeprefix("http://").split(":")
        pod_name, service_name = host.split(".")[:2]
        assert pod_name == worker.id
        service = named(resources, "Service", service_name) if overlay == "sim" else None
        owners = [
            r
            for r in of_kind(resources, "StatefulSet", "LeaderWorkerSet")
            if pod_name.startswith(r["metadata"]["name"] + "-")
        ]
        assert len(owners) == 1, f"{worker.id}: no StatefulSet or LeaderWorkerSet makes this pod"
        owner = owners[0]
        ordinal = int(pod_name.removeprefix(owner["metadata"]["name"] + "-"))
        assert ordinal < owner["spec"]["replicas"], f"{worker.id}: only {owner['spec']['replicas']} replicas"
        serving = next(pods(owner))
        assert int(port) in container_ports(serving.spec).values()
        if owner["kind"] == "StatefulSet":
            assert service is not None
            assert owner["spec"]["serviceName"] == service_name
            assert service["spec"]["clusterIP"] == "None"
        else:  # a LeaderWorkerSet's headless Service is named after it and made by its controller
            assert service_name == owner["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_podmonitor_scrapes_exactly_the_pods_that_serve_metrics(k8s: Path, overlay: str) -> None:
    (monitor,) = [r for r in build(k8s / "monitoring") if r["kind"] == "PodMonitor"]
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for workload in of_kind(built(k8s, overlay), *WORKLOADS):
        for pod in pods(workload):
            selected = pod.labels.get(expression["key"]) in expression["values"]
            annotated = pod.annotations.get("prometheus.io/scrape") == "true"
            assert selected == annotated, f"{pod.name}: PodMonitor and scrape annotations disagree"
            if selected:
                assert endpoint["port"] in container_ports(pod.spec)
                assert endpoint["path"] == pod.annotations["prometheus.io/path"]


# -------------------------------------------------------------------------------------------- Kimi K3 + vLLM
def test_kimi_overlay_runs_the_recipe_of_deploy_fleets(k8s: Path) -> None:
    recipe = yaml.safe_load((ROOT / "deploy" / "fleets" / "kimi-k3-dspark.yaml").read_text())
    overlay = config_file(built(k8s, "kimi-k3"), "fleet.yaml")
    strip = lambda fleet: {**fleet, "workers": [{**w, "url": None} for w in fleet["workers"]]}  # noqa: E731
    assert strip(overlay) == strip(recipe)


def test_each_worker_group_is_one_tp16_engine_over_two_eight_gpu_pods(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    lws = named(resources, "LeaderWorkerSet", "kimi-k3")
    fleet = parse_model(FleetConfig, config_file(resources, "fleet.yaml"), source="fleet.yaml")
    size = lws["spec"]["leaderWorkerTemplate"]["size"]
    lines = []
    for pod in pods(lws):
        (container,) = pod.spec["containers"]
        gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
        env = container_env(pod, container, list(resources))
        argv = container_args(pod, container, env)
        _, _, args = resolve_command(argv)
        worker = fleet.worker(option_values(resolve_command(argv)[1], args)["--worker-id"])
        assert worker is not None
        assert gpus * size == worker.tensor_parallel_size == worker.gpus
        config = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert "/etc/gearshift" in config
        fleet_path = k8s / "kimi-k3" / "fleet.yaml"
        args = [a if a != "/etc/gearshift/fleet.yaml" else str(fleet_path) for a in args]
        result = CliRunner().invoke(_app(), [*argv[:2], *args, "--dry-run"], env=env)
        assert result.exit_code == 0, result.output
        lines.append(result.output)
    leader, follower = lines
    expected: tuple[str, ...] = (
        "VLLM_PLUGINS=gearshift",
        "num_speculative_tokens_per_batch_size",
        '"method": "dspark"',
    )
    expected += ("--tensor-parallel-size 16", "--nnodes 2", "--master-addr kimi-k3-0.kimi-k3")
    for line in lines:
        assert [e for e in expected if e not in line] == []
    assert "--node-rank 0" in leader
    assert "--headless" not in leader
    assert "--node-rank 1" in follower
    assert "--headless" in follower


def _app() -> Any:
    from gearshift.cli.app import app

    return app
