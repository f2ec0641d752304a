"""What a Kubernetes cluster could give a plan now: its nodes' allocatable resources less what running pods
request, counted against one trainer pod of the rendered JobSet (its requests, node selector, tolerations)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from bridge.adapters.base import Amounts, Capacity, ClusterSize
from bridge.api.quantity import parse_quantity

#: the pods still holding their node's resources (the field selector of the pod listing)
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, Fraction]:
    """A pod's requests as the scheduler sums them: its containers' (a limit stands for a missing request)."""
    total: dict[str, Fraction] = {}
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, value in merged.items():
            total[name] = total.get(name, Fraction(0)) + parse_quantity(value)
    return total


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        if toleration.get("effect") not in (None, "", taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists" and toleration.get("key") in (None, "", taint.get("key")):
            return True
        if toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def count(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], pod_spec: Mapping[str, Any]) -> Capacity:
    """*nodes* and *pods* as the API serves them (dicts); *pod_spec* one trainer pod of the plan's JobSet."""
    need = pod_requests(pod_spec)
    selector = pod_spec.get("nodeSelector") or {}
    tolerations = pod_spec.get("tolerations") or []
    used: dict[str, dict[str, Fraction]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            for name, value in pod_requests(pod.get("spec") or {}).items():
                used.setdefault(node, {})[name] = used.setdefault(node, {}).get(name, Fraction(0)) + value
    total = fitting = free = 0
    for node in nodes:
        total += 1
        metadata, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
        labels = metadata.get("labels") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        taints = [t for t in spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
        if (not ready or spec.get("unschedulable") or any(labels.get(k) != v for k, v in selector.items())
                or not all(_tolerated(taint, tolerations) for taint in taints)):
            continue
        allocatable = {name: parse_quantity(value) for name, value in (status.get("allocatable") or {}).items()}
        if any(allocatable.get(name, Fraction(0)) < amount for name, amount in need.items()):
            continue
        fitting += 1
        taken = used.get(metadata.get("name", ""), {})
        if all(allocatable.get(name, Fraction(0)) - taken.get(name, Fraction(0)) >= amount
               for name, amount in need.items()):
            free += 1
    asked = ", ".join(f"{name} {_shown(amount)}" for name, amount in sorted(need.items())) or "no requests"
    where = f" with labels {dict(selector)}" if selector else ""
    return Capacity(free, fitting, f"{free} of {total} nodes{where} free for a pod asking {asked}")


def size(nodes: Iterable[Mapping[str, Any]]) -> ClusterSize:
    """The nodes' capacity summed (cpu, memory, nvidia.com/gpu); usable: the allocatable of those Ready and
    schedulable."""
    def amounts(chosen: list[Mapping[str, Any]], field: str) -> Amounts:
        def total(name: str) -> Fraction:
            return sum((parse_quantity(((n.get("status") or {}).get(field) or {}).get(name, "0")) for n in chosen),
                       Fraction(0))
        return Amounts(len(chosen), int(total("cpu")), int(total("memory") / 2**20), int(total("nvidia.com/gpu")))

    listed = list(nodes)
    usable = [n for n in listed if not (n.get("spec") or {}).get("unschedulable") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (n.get("status") or {}).get("conditions") or [])]
    return ClusterSize(amounts(listed, "capacity"), amounts(usable, "allocatable"),
                       f"{len(usable)} of {len(listed)} nodes Ready and schedulable")


def _shown(amount: Fraction) -> str:
    return str(amount.numerator) if amount.denominator == 1 else f"{float(amount):g}"
