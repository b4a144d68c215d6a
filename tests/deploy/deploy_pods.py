"""Concrete pods of a built manifest set: names, labels, and each container's resolved env and args.

Kubernetes expands ``$(VAR)`` in ``args`` and in later ``env`` values from the container's env list; values
come from literals, Secrets (``secretKeyRef``) and the downward API (``fieldRef``). This module does the same
for one representative pod of each template (ordinal 0; a LeaderWorkerSet follower is worker index 1), so a
test can run the real CLI and settings classes on exactly what the pod would see.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .deploy_kustomize import Resource, pod_templates

LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
"""Labels the LeaderWorkerSet controller puts on every pod it makes (LWS v0.10 reference: labels)."""
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_LABEL_PATH = re.compile(r"^metadata\.labels\['([^']+)'\]$")


@dataclass(frozen=True)
class Pod:
    owner: Resource
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]


def pods(resource: Resource) -> Iterator[Pod]:
    """One representative pod per template of a workload."""
    name = resource["metadata"]["name"]
    templates = list(pod_templates(resource))
    for index, template in enumerate(templates):
        meta = template.get("metadata", {})
        labels = dict(meta.get("labels", {}))
        if resource["kind"] == "LeaderWorkerSet":
            follower = index == len(templates) - 1 and len(templates) == 2
            labels |= {LWS_NAME: name, LWS_GROUP: "0", LWS_WORKER: "1" if follower else "0"}
            pod_name = f"{name}-0-1" if follower else f"{name}-0"
        elif resource["kind"] == "StatefulSet":
            pod_name = f"{name}-0"
        else:
            pod_name = f"{name}-5d9c7b-x2x4q"
        yield Pod(resource, pod_name, labels, dict(meta.get("annotations", {})), template["spec"])


def secret_value(resources: list[Resource], name: str, key: str) -> str:
    for r in resources:
        if r["kind"] == "Secret" and r["metadata"]["name"] == name:
            data = {k: base64.b64decode(v).decode() for k, v in r.get("data", {}).items()}
            data |= r.get("stringData", {})
            assert key in data, f"Secret {name} has no key {key!r}"
            return str(data[key])
    raise AssertionError(f"Secret {name!r} is referenced but not defined")


def _field(pod: Pod, path: str) -> str:
    if path == "metadata.name":
        return pod.name
    match = _LABEL_PATH.match(path)
    assert match, f"fieldRef {path!r} is not supported by this check"
    assert match.group(1) in pod.labels, f"fieldRef {path!r}: the pod has no such label"
    return pod.labels[match.group(1)]


def expand(text: str, env: dict[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        assert m.group(1) in env, f"{where}: $({m.group(1)}) is not defined earlier in the container's env"
        return env[m.group(1)]

    return _REF.sub(sub, text)


def container_env(pod: Pod, container: dict[str, Any], resources: list[Resource]) -> dict[str, str]:
    """The container's environment as the kubelet resolves it."""
    env: dict[str, str] = {}
    where = f"{pod.name}/{container['name']}"
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env, where)
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = secret_value(resources, ref["name"], ref["key"])
        elif "fieldRef" in source:
            env[var["name"]] = _field(pod, source["fieldRef"]["fieldPath"])
        else:
            raise AssertionError(f"{where}: env {var['name']}: unsupported source {sorted(source)}")
    return env


def container_args(pod: Pod, container: dict[str, Any], env: dict[str, str]) -> list[str]:
    where = f"{pod.name}/{container['name']}"
    return [expand(str(a), env, where) for a in container.get("command", []) + container.get("args", [])]


def container_ports(spec: dict[str, Any]) -> dict[str | int, int]:
    """Port name → number and number → number for every container port of a pod spec."""
    ports: dict[str | int, int] = {}
    for container in spec.get("containers", []):
        for port in container.get("ports", []):
            ports[port["containerPort"]] = port["containerPort"]
            if "name" in port:
                ports[port["name"]] = port["containerPort"]
    return ports
