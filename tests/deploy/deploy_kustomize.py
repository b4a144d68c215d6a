"""A pure-Python build of the kustomize subset deploy/kubernetes uses, so tests need no kubectl.

Supported: ``resources`` (files and directories with a kustomization), ``namespace``, ``labels`` (metadata
only), ``configMapGenerator`` with ``files`` and ``behavior: merge``, ``secretGenerator`` with ``envs``
(base64 ``data``, type Opaque, as kustomize writes it), ``generatorOptions:
{disableNameSuffixHash: true}``, ``images`` and ``patches`` of custom resources by ``path`` (kustomize applies a
patch of a kind it has no schema for as a JSON merge patch, RFC 7386: maps merge, lists and scalars replace,
null deletes). Any other key fails the build, so the manifests cannot start
relying on a feature this builder would silently ignore (and so diverge from what ``kubectl apply -k`` does).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
SUPPORTED = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}
SUPPORTED |= {"configMapGenerator", "secretGenerator", "generatorOptions", "patches"}
CLUSTER_SCOPED = {"Namespace"}
MERGE_PATCHED = {"LeaderWorkerSet"}
"""Kinds patched as kustomize patches them without a schema (built-in kinds get a strategic merge: not here)."""


class KustomizeError(ValueError):
    pass


def load_documents(path: Path) -> list[Resource]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _generate_configmaps(root: Path, spec: dict[str, Any], resources: list[Resource]) -> None:
    for gen in spec.get("configMapGenerator", []):
        data = {Path(f).name: (root / f).read_text() for f in gen.get("files", [])}
        behavior = gen.get("behavior", "create")
        existing = next(
            (r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == gen["name"]), None
        )
        if behavior == "merge":
            if existing is None:
                raise KustomizeError(
                    f"{root}: configMapGenerator {gen['name']}: merge into a ConfigMap that does not exist"
                )
            existing["data"].update(data)
        elif behavior == "create":
            if existing is not None:
                raise KustomizeError(f"{root}: configMapGenerator {gen['name']}: already exists")
            resources.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
        else:
            raise KustomizeError(f"{root}: configMapGenerator behavior {behavior!r} is not supported here")


def _env_file(path: Path) -> dict[str, str]:
    """A kustomize ``envs`` file: ``KEY=VALUE`` lines, ``#`` comments and blank lines skipped."""
    if not path.is_file():
        raise KustomizeError(f"{path}: no such file (secretGenerator envs)")
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {key.strip(): value for key, value in pairs}


def _generate_secrets(root: Path, spec: dict[str, Any], resources: list[Resource]) -> None:
    for gen in spec.get("secretGenerator", []):
        if set(gen) - {"name", "envs"}:
            raise KustomizeError(f"{root}: secretGenerator {gen['name']}: only `envs` is supported here")
        data = {k: v for env in gen["envs"] for k, v in _env_file(root / env).items()}
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        resources.append(
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]}, "type": "Opaque", "data": encoded}
        )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of ``target`` by ``patch``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _apply_patches(root: Path, spec: dict[str, Any], resources: list[Resource]) -> None:
    for entry in spec.get("patches", []):
        if set(entry) != {"path"}:
            raise KustomizeError(f"{root}: patches: only `path` entries are supported here")
        for patch in load_documents(root / entry["path"]):
            kind, name = patch["kind"], patch["metadata"]["name"]
            if kind not in MERGE_PATCHED:
                raise KustomizeError(f"{root}: patch of {kind} {name}: only {sorted(MERGE_PATCHED)} are patched here")
            index = next(
                (i for i, r in enumerate(resources) if r["kind"] == kind and r["metadata"]["name"] == name), None
            )
            if index is None:
                raise KustomizeError(f"{root}: patch {entry['path']}: no {kind} {name} to patch")
            resources[index] = merge_patch(resources[index], patch)


def _containers(resource: Resource) -> Iterator[dict[str, Any]]:
    for spec in pod_specs(resource):
        yield from spec.get("containers", [])
        yield from spec.get("initContainers", [])


def _set_images(spec: dict[str, Any], resources: list[Resource]) -> None:
    for image in spec.get("images", []):
        for resource in resources:
            for container in _containers(resource):
                if container["image"].split(":")[0] == image["name"]:
                    container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"


def build(root: Path) -> list[Resource]:
    """The resources ``kubectl kustomize root`` would produce (for the supported subset), in file order."""
    spec = yaml.safe_load((root / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{root}/kustomization.yaml: unsupported keys {sorted(unknown)}")
    generates = spec.get("configMapGenerator") or spec.get("secretGenerator")
    if generates and not spec.get("generatorOptions", {}).get("disableNameSuffixHash"):
        raise KustomizeError(f"{root}: generated names must not carry a hash suffix (references are not rewritten)")
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        path = root / entry
        resources += build(path) if path.is_dir() else [copy.deepcopy(d) for d in load_documents(path)]
    _apply_patches(root, spec, resources)
    _generate_configmaps(root, spec, resources)
    _generate_secrets(root, spec, resources)
    _set_images(spec, resources)
    for resource in resources:
        meta = resource.setdefault("metadata", {})
        if "namespace" in spec and resource["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = spec["namespace"]
        for group in spec.get("labels", []):
            if group.get("includeSelectors") or group.get("includeTemplates"):
                raise KustomizeError(f"{root}: labels with includeSelectors/includeTemplates are not supported here")
            meta.setdefault("labels", {}).update(group["pairs"])
    return resources


# ------------------------------------------------------------------------------------------- pod templates
def pod_templates(resource: Resource) -> Iterator[dict[str, Any]]:
    """Every pod template (metadata + spec) of a workload, including a LeaderWorkerSet's two templates."""
    spec = resource.get("spec", {})
    if resource["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        yield spec["template"]
    elif resource["kind"] == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]
    elif resource["kind"] == "LeaderWorkerSet":
        lwt = spec["leaderWorkerTemplate"]
        if "leaderTemplate" in lwt:
            yield lwt["leaderTemplate"]
        yield lwt["workerTemplate"]


def pod_specs(resource: Resource) -> Iterator[dict[str, Any]]:
    for template in pod_templates(resource):
        yield template["spec"]
