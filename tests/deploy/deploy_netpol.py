"""Who a set of NetworkPolicies lets reach a pod: the ingress semantics of ``networking.k8s.io/v1`` for the subset
the manifests use (pod and namespace selectors with ``matchLabels``/``matchExpressions``, named and numbered
ports; no ``ipBlock``, no egress).

A pod no policy selects accepts everything; a selected pod accepts a connection that any rule of any policy
selecting it allows (rules add up). A peer with only ``podSelector`` means pods of the policy's namespace; with
``namespaceSelector`` too, pods matching both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .deploy_kustomize import Resource


@dataclass(frozen=True)
class Peer:
    """A pod as a policy sees it: its labels, its namespace's labels, and its container ports by name."""

    labels: dict[str, str]
    namespace: str
    namespace_labels: dict[str, str]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A ``LabelSelector`` against labels (the empty selector selects everything)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _peer_matches(peer: dict[str, Any], source: Peer, policy_namespace: str) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers are not evaluated here"
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.namespace_labels):
            return False
    elif source.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), source.labels)


def _port_matches(rule: dict[str, Any], port: str | int, target_ports: dict[str | int, int]) -> bool:
    if "ports" not in rule:
        return True
    number = target_ports.get(port, port)
    for entry in rule["ports"]:
        allowed = entry.get("port")
        if allowed is None or allowed == port or target_ports.get(allowed) == number:
            return True
    return False


def admits(
    policies: list[Resource], *, source: Peer, target: Peer, target_ports: dict[str | int, int], port: str | int
) -> bool:
    """Whether ``source`` may open a connection to ``target`` on ``port`` (a name of ``target_ports`` or a number)."""
    applying = [
        p
        for p in policies
        if p["metadata"].get("namespace") == target.namespace
        and selects(p["spec"]["podSelector"], target.labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not applying:
        return True
    for policy in applying:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from")
            from_ok = not peers or any(_peer_matches(p, source, policy["metadata"]["namespace"]) for p in peers)
            if from_ok and _port_matches(rule, port, target_ports):
                return True
    return False
