"""deploy/kubernetes: every resource validates against the Kubernetes schema, cross-references hold, and
every gearshift container runs a real sub-command with settings, ports and probe paths the code has."""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from fleet.config import FleetConfig, TenantsConfig, parse_model
from gateway.settings import GatewaySettings

from .deploy_contracts import (
    ROOT,
    bind_host,
    cli_root,
    env_names,
    listen_port,
    load_settings,
    option_values,
    resolve_command,
    served_paths,
    settings_class,
)
from .deploy_kustomize import KustomizeError, Resource, build, pod_specs
from .deploy_lws import validate_lws
from .deploy_netpol import Peer, admits, selects
from .deploy_pods import Pod, container_args, container_env, container_ports, pods, secret_value

K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("sim", "kimi-k3")
KUBERNETES_VERSION = "1.31.0"
"""The oldest Kubernetes these manifests target (validated with the strict schemas: no unknown fields)."""
WORKLOADS = ("Deployment", "StatefulSet", "LeaderWorkerSet", "CronJob")
GEARSHIFT_IMAGES = ("ghcr.io/gearshift/gearshift:", "ghcr.io/gearshift/gearshift-vllm:")


@pytest.fixture(scope="module")
def k8s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of deploy/kubernetes with base/secrets.env made from the committed example as an operator would: every
    key of the example with a fresh random value (a placeholder is refused by every process)."""
    root = tmp_path_factory.mktemp("kubernetes")
    shutil.copytree(K8S, root, dirs_exist_ok=True)
    (root / "base" / "secrets.env").write_text("".join(f"{key}={secrets.token_hex(32)}\n" for key in example_keys()))
    return root


def example_keys() -> list[str]:
    example = K8S / "base" / "secrets.env.example"
    return [line.split("=")[0] for line in example.read_text().splitlines() if line and not line.startswith("#")]


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
    """LeaderWorkerSet is a CRD outside the core schemas: the vendored LWS CRD schema, strict (``deploy_lws``),
    and each template as a core Pod of the pinned Kubernetes."""
    validate_lws(lws)
    template = lws["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        pod = {"apiVersion": "v1", "kind": "Pod", **template[key]}
        pod["metadata"] = {"name": f"{lws['metadata']['name']}-{key.lower()}", **template[key]["metadata"]}
        kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)


# --------------------------------------------------------------------------------------------------- schema
def test_secrets_come_from_an_uncommitted_env_file_with_every_key_the_manifests_use(k8s: Path) -> None:
    (secret,) = of_kind(built(k8s, "sim"), "Secret")
    example = K8S / "base" / "secrets.env.example"
    assert set(secret["data"]) == set(example_keys())
    assert all(
        v == "replace-me"
        for v in (
            line.split("=", 1)[1] for line in example.read_text().splitlines() if line and not line.startswith("#")
        )
    ), "the example holds only placeholders, which every process refuses"
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


@pytest.mark.parametrize(
    ("path", "field"),
    [(("spec",), "replica"), (("spec", "leaderWorkerTemplate"), "restartPolicyy"), (("metadata",), None)],
)
def test_the_lws_validator_rejects_a_misspelt_or_mistyped_field(
    k8s: Path, path: tuple[str, ...], field: str | None
) -> None:
    broken = yaml.safe_load(yaml.safe_dump(named(built(k8s, "kimi-k3"), "LeaderWorkerSet", "kimi-k3")))
    node = broken
    for key in path:
        node = node[key]
    if field is None:  # a wrong type deep inside a pod template
        broken["spec"]["leaderWorkerTemplate"]["size"] = "2"
        match = "'2' is not of type 'integer'"
    else:
        node[field] = 1
        match = field
    with pytest.raises(jsonschema.ValidationError, match=match):
        validate_lws(broken)


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
        if not process.serves:
            assert not container.get("ports"), where
            continue
        if options.get("--node-rank", "0") != "0":  # a headless follower of a multi-node engine serves no HTTP
            assert "http" not in container_ports(pod.spec)
            assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(container), where
            continue
        port = listen_port(process, settings, fleet, options.get("--worker-id"))
        assert container_ports(pod.spec).get("http") == port, f"{where}: listens on {port}"
        assert bind_host(process, settings) in (None, "0.0.0.0"), f"{where}: must bind every interface in a pod"
        paths = served_paths(process)
        control = supervisor_port(fleet, options)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in container and "httpGet" in container[probe]:
                get = container[probe]["httpGet"]
                if control is not None and container_ports(pod.spec)[get["port"]] == control:
                    assert get["path"] in supervisor_paths(), f"{where}: {probe} {get['path']} is not the supervisor's"
                    continue
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
    strip = lambda fleet: {**fleet, "workers": [{**w, "url": None, "restart_url": None} for w in fleet["workers"]]}  # noqa: E731
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
    expected += ('"attention_backend": "FLASHINFER_MLA"', '"draft_sample_method": "probabilistic"')
    expected += ('"rejection_sample_method": "block"',)
    for line in lines:
        assert [e for e in expected if e not in line] == []
    assert "--node-rank 0" in leader
    assert "--headless" not in leader
    assert "--node-rank 1" in follower
    assert "--headless" in follower


# ------------------------------------------------------------------- two-node TP16: rendered for 2 groups
def lws_pods(resources: tuple[Resource, ...]) -> tuple[Pod, Pod]:
    leader, follower = pods(named(resources, "LeaderWorkerSet", "kimi-k3"))
    return leader, follower


def test_two_worker_groups_each_a_supervised_leader_and_follower(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    lws = named(resources, "LeaderWorkerSet", "kimi-k3")
    fleet = parse_model(FleetConfig, config_file(resources, "fleet.yaml"), source="fleet.yaml")
    groups = lws["spec"]["replicas"]
    assert groups == 2
    assert sorted(w.id for w in fleet.workers) == [f"kimi-k3-{g}" for g in range(groups)]
    leader, follower = lws_pods(resources)
    for worker in fleet.workers:
        assert worker.restart_url is not None
        restart, serve = urlsplit(worker.restart_url), urlsplit(worker.url)
        assert restart.hostname == serve.hostname, f"{worker.id}: the restart control is on the leader"
        assert restart.port == container_ports(leader.spec)["control"]
    for pod in (leader, follower):
        (container,) = pod.spec["containers"]
        argv = container_args(pod, container, container_env(pod, container, list(resources)))
        assert "--supervise" in argv, f"{pod.name}: the drafter-free gear restarts every node of the group"
    rollout = lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert (rollout["maxUnavailable"], rollout["maxSurge"]) == (1, 0), "one group at a time, no spare 16 GPUs"
    assert lws["spec"]["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"


def test_the_leader_drains_through_the_worker_mode_before_it_stops(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    leader, _ = lws_pods(resources)
    (container,) = leader.spec["containers"]
    env = container_env(leader, container, list(resources))
    shell, flag, line = container["lifecycle"]["preStop"]["exec"]["command"]
    assert (shell, flag) == ("sh", "-c")
    with mock.patch.dict(os.environ, {"GROUP_INDEX": env["GROUP_INDEX"]}):
        words = [os.path.expandvars(w) for w in shlex.split(line)]
    assert words[:2] == ["exec", vllm_image_entrypoint()], "the hook runs the image's own gearshift"
    command = cli_root().get_command(None, "worker").get_command(None, "drain")
    assert command is not None
    assert words[2:4] == ["worker", "drain"]
    options = option_values(command, words[4:])
    argv = container_args(leader, container, env)
    assert options["--worker-id"] == argv[argv.index("--worker-id") + 1] == "kimi-k3-0"
    grace = leader.spec["terminationGracePeriodSeconds"]
    assert float(options["--timeout"]) + 30 <= grace, "the drain must end before the kubelet's SIGKILL"
    # The drain writes where every gateway reads: the same store and key prefix.
    gateway = named(resources, "Deployment", "gateway")
    (gw_pod,) = pods(gateway)
    gw_env = container_env(gw_pod, gw_pod.spec["containers"][0], list(resources))
    for key in ("GEARSHIFT_REDIS_URL", "GEARSHIFT_REDIS_SENTINELS", "GEARSHIFT_KEY_PREFIX"):
        assert env.get(key) == gw_env.get(key), key
    assert env["GEARSHIFT_REDIS_URL"]


def test_disruption_budgets_keep_a_group_the_store_quorum_and_a_gateway(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    budgets = {p["metadata"]["name"]: p["spec"] for p in of_kind(resources, "PodDisruptionBudget")}
    assert set(budgets) >= {"kimi-k3", "redis", "gateway", "controller"}
    leader, follower = lws_pods(resources)
    assert all(selects(budgets["kimi-k3"]["selector"], p.labels) for p in (leader, follower))
    assert budgets["kimi-k3"]["maxUnavailable"] == 1, "one worker pod, hence one group, at a time"
    redis = named(resources, "StatefulSet", "redis")
    quorum = int(re.search(r"sentinel monitor gearshift \S+ 6379 (\d+)", redis_scripts(resources))[1])  # type: ignore[index]
    assert redis["spec"]["replicas"] - budgets["redis"]["maxUnavailable"] >= quorum
    hpa = named(resources, "HorizontalPodAutoscaler", "gateway")
    assert budgets["gateway"]["minAvailable"] < hpa["spec"]["minReplicas"], "a node drain must be able to proceed"
    for name in budgets:
        selected = [
            p for r in of_kind(resources, *WORKLOADS) for p in pods(r) if selects(budgets[name]["selector"], p.labels)
        ]
        assert selected, f"PodDisruptionBudget {name} selects no pod"


def test_workers_accept_only_gateways_controllers_their_peers_and_prometheus(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    policies = of_kind(resources, "NetworkPolicy")
    by_name = {p.name: p for r in of_kind(resources, *WORKLOADS) for p in pods(r)}
    leader, follower = lws_pods(resources)

    def peer(pod: Pod | dict[str, str], namespace: str = "gearshift") -> Peer:
        labels = pod.labels if isinstance(pod, Pod) else pod
        return Peer(labels=labels, namespace=namespace, namespace_labels={"kubernetes.io/metadata.name": namespace})

    gateway = next(p for n, p in by_name.items() if n.startswith("gateway-"))
    controller = next(p for n, p in by_name.items() if n.startswith("controller-"))
    redis = by_name["redis-0"]
    prometheus = peer({"app.kubernetes.io/name": "prometheus"}, namespace="monitoring")
    stranger = peer({"app": "debug-shell"})
    ports = container_ports(leader.spec)

    def can(source: Peer, target: Pod, port: str | int) -> bool:
        return admits(
            policies, source=source, target=peer(target), target_ports=container_ports(target.spec), port=port
        )

    assert can(peer(gateway), leader, "http")
    assert not can(peer(gateway), leader, "control"), "restarts are the controller's"
    assert can(peer(controller), leader, "http")
    assert can(peer(controller), leader, "control")
    assert can(peer(follower), leader, ports["torch-master"])
    assert can(peer(leader), follower, 40000)
    assert can(prometheus, leader, "http")
    assert not can(prometheus, leader, "control")
    for outsider in (stranger, peer(redis), peer({"app": "debug-shell"}, namespace="other")):
        for port in ("http", "control", ports["torch-master"]):
            assert not can(outsider, leader, port), (outsider.labels, port)
    assert not can(stranger, follower, 40000)
    # The store: gearshift's processes only.
    for source in (gateway, controller, leader, redis):  # redis: replication and Sentinel gossip
        assert can(peer(source), redis, "redis"), source.name
    assert not can(stranger, redis, "redis")
    assert not can(stranger, redis, "sentinel")


def test_probes_allow_a_drafter_free_restart_and_the_recipe_start(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    leader, follower = lws_pods(resources)
    (container,) = leader.spec["containers"]
    env = container_env(leader, container, list(resources))
    ports = container_ports(leader.spec)
    live, ready, start = (container[p] for p in ("livenessProbe", "readinessProbe", "startupProbe"))
    assert ports[live["httpGet"]["port"]] == ports["control"], "liveness asks the supervisor, which outlives vLLM"
    assert live["httpGet"]["path"] in supervisor_paths()
    assert ports[ready["httpGet"]["port"]] == ports["http"]
    assert ready["httpGet"]["path"] == "/health"
    assert start["periodSeconds"] * start["failureThreshold"] >= int(env["VLLM_ENGINE_READY_TIMEOUT_S"])
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(follower.spec["containers"][0])


RECIPE_ENV = {
    "VLLM_ENABLE_K3_LATENT_MOE_TAIL_FUSION": "1",
    "VLLM_ALLREDUCE_USE_FLASHINFER": "1",
    "VLLM_USE_RUST_FRONTEND": "1",
    "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
}
"""vllm-project/recipes models/moonshotai/Kimi-K3.yaml (commit 02c27aa), hardware_overrides.blackwell.extra_env,
less VLLM_USE_V2_MODEL_RUNNER, which the launcher sets."""


def test_each_pod_gets_the_recipe_env_rdma_and_the_placement_parameters(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    lws = named(resources, "LeaderWorkerSet", "kimi-k3")
    placement = yaml.safe_load((K8S / "kimi-k3" / "placement.yaml").read_text())
    topology = "leaderworkerset.sigs.k8s.io/exclusive-topology"
    assert lws["metadata"]["annotations"][topology] == placement["metadata"]["annotations"][topology]
    wanted = placement["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    for pod in lws_pods(resources):
        (container,) = pod.spec["containers"]
        env = container_env(pod, container, list(resources))
        assert RECIPE_ENV.items() <= env.items(), pod.name
        assert {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= set(env)
        assert env["NCCL_IB_DISABLE"] == "0"
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"], "bootstrap and Gloo on the pod network"
        assert not pod.spec.get("hostNetwork"), "NetworkPolicies do not apply to host-network pods"
        limits = container["resources"]["limits"]
        assert int(limits["rdma/ib"]) == int(limits["nvidia.com/gpu"]), "one HCA per GPU"
        assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
        assert pod.spec["nodeSelector"] == wanted["nodeSelector"]
        assert pod.spec["tolerations"] == wanted["tolerations"]
        assert env["VLLM_API_KEY"] == secret_value(list(resources), "gearshift-secrets", "worker-api-key")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_reaches_a_command_line(k8s: Path, overlay: str) -> None:
    """Secrets go through env (or files written from it), never args: those show in ``ps`` and the pod spec."""
    resources = built(k8s, overlay)
    for workload in of_kind(resources, *WORKLOADS):
        for pod in pods(workload):
            for container in pod.spec["containers"]:
                secret_vars = {v["name"] for v in container.get("env", []) if "secretKeyRef" in v.get("valueFrom", {})}
                words = " ".join(container.get("command", []) + container.get("args", []))
                leaked = {name for name in secret_vars if f"$({name})" in words}
                assert not leaked, f"{pod.name}/{container['name']}: {sorted(leaked)} in its command line"


def test_the_redis_scripts_are_valid_shell_and_keep_the_password_out_of_argv(k8s: Path) -> None:
    scripts = named(built(k8s, "kimi-k3"), "ConfigMap", "redis-scripts")["data"]
    for name, text in scripts.items():
        result = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True, check=False)
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert "-a " not in text, name
        assert "--requirepass" not in text, name
    assert "maxmemory-policy noeviction" in scripts["redis.sh"]


def test_the_gateways_send_the_workers_key_and_stay_ready_through_a_cold_start(k8s: Path) -> None:
    resources = built(k8s, "kimi-k3")
    (gw_pod,) = pods(named(resources, "Deployment", "gateway"))
    (gateway,) = gw_pod.spec["containers"]
    env = container_env(gw_pod, gateway, list(resources))
    leader, _ = lws_pods(resources)
    worker_env = container_env(leader, leader.spec["containers"][0], list(resources))
    assert env["GEARSHIFT_UPSTREAM_API_KEY"] == worker_env["VLLM_API_KEY"]
    settings = load_settings(resolve_command(container_args(gw_pod, gateway, env))[0], env)
    assert isinstance(settings, GatewaySettings)
    assert settings.ready_without_workers
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_gateways_know_their_replica_count(k8s: Path) -> None:
    resources = built(k8s, "sim")
    (pod,) = pods(named(resources, "Deployment", "gateway"))
    env = container_env(pod, pod.spec["containers"][0], list(resources))
    hpa = named(resources, "HorizontalPodAutoscaler", "gateway")
    assert int(env["GEARSHIFT_GATEWAY_REPLICAS"]) == hpa["spec"]["minReplicas"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed: kustomize not compared")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_test_builder_renders_what_kubectl_kustomize_renders(k8s: Path, overlay: str) -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(k8s / overlay)], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    key = lambda r: (r["kind"], r["metadata"]["name"])  # noqa: E731
    real = sorted((unwrapped(d) for d in yaml.safe_load_all(result.stdout) if d), key=key)
    ours = sorted(built(k8s, overlay), key=key)
    assert [key(r) for r in ours] == [key(r) for r in real]
    for mine, theirs in zip(ours, real, strict=True):
        assert mine == theirs, key(mine)


def unwrapped(resource: Resource) -> Resource:
    """kustomize wraps long base64 values of a Secret's ``data`` over lines; the API server ignores the breaks."""
    if resource["kind"] == "Secret":
        resource["data"] = {k: v.replace("\n", "") for k, v in resource.get("data", {}).items()}
    return resource


def redis_scripts(resources: tuple[Resource, ...]) -> str:
    return "\n".join(named(resources, "ConfigMap", "redis-scripts")["data"].values())


def vllm_image_entrypoint() -> str:
    text = (ROOT / "deploy" / "docker" / "vllm.Dockerfile").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ENTRYPOINT")]
    return str(json.loads(line.removeprefix("ENTRYPOINT").strip())[0])


def supervisor_port(fleet: FleetConfig, options: dict[str, str]) -> int | None:
    """The port of the vLLM supervisor's restart control, for a container that runs one (``--supervise``)."""
    if "--supervise" not in options:
        return None
    worker = fleet.worker(options["--worker-id"])
    assert worker is not None
    assert worker.restart_url is not None, f"{worker.id}: --supervise needs a restart_url"
    port = urlsplit(worker.restart_url).port
    assert port is not None
    return port


def supervisor_paths() -> frozenset[str]:
    """The paths the supervisor's app serves (from its route table)."""
    from workers.vllm.launcher import LaunchPlan
    from workers.vllm.supervisor import Supervisor, supervisor_app

    def never(drafter: bool) -> LaunchPlan:
        raise AssertionError("the route table is read, nothing is started")

    app = supervisor_app(Supervisor(never, url="http://127.0.0.1:1", log_dir=Path()), control_token="t")
    return frozenset(r.canonical for r in app.router.resources())


def _app() -> Any:
    from gearshift.cli.app import app

    return app
