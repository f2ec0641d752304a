"""How a JobSet's pods are scheduled: the portable scheduler knobs as node selectors, priority classes and
anti-affinity, and the gang schedulers' PodGroups (Kubeflow's coscheduling and volcano plugins)."""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING, Any

from bridge.adapters.kubernetes.pods import DNS_SUBDOMAIN
from bridge.annotations import (
    CONSTRAINT_ANNOTATION,
    COSCHEDULING_LABEL,
    FEATURE_LABEL_PREFIX,
    PARTITION_ANNOTATION,
    PREFIX,
    QOS_ANNOTATION,
    UID_LABEL,
)
from bridge.errors import InvalidSpec

if TYPE_CHECKING:
    from fractions import Fraction

    from bridge.plan import LaunchPlan

LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def placement_for(plan: LaunchPlan) -> dict[str, Any]:
    """The portable scheduler knobs in Kubernetes terms (README: "Scheduler knobs on Kubernetes")."""
    options = plan.options
    for knob, value in (("partition", options.partition), ("account", options.account)):
        if value and not LABEL_NAME.fullmatch(value):
            raise InvalidSpec(f"metadata.annotations[{PREFIX}{knob}]", value,
                              "on Kubernetes this is a label value: letters, digits, - _ . (63 at most)")
    if options.qos and not DNS_SUBDOMAIN.fullmatch(options.qos):
        raise InvalidSpec(f"metadata.annotations[{QOS_ANNOTATION}]", options.qos,
                          "on Kubernetes this is a PriorityClass name: lowercase letters, digits, - and .")
    selector: dict[str, str] = {}
    if options.partition:
        selector[PARTITION_ANNOTATION] = options.partition
    if options.constraint:
        features = options.constraint.split("&")
        for feature in features:
            if not LABEL_NAME.fullmatch(feature):
                raise InvalidSpec(f"metadata.annotations[{CONSTRAINT_ANNOTATION}]", options.constraint,
                                  "Kubernetes takes node features joined by & (each a label name; no |, brackets "
                                  "or counts)")
            selector[f"{FEATURE_LABEL_PREFIX}{feature}"] = "true"
    placement: dict[str, Any] = {}
    if selector:
        placement["nodeSelector"] = selector
    if options.qos:
        placement["priorityClassName"] = options.qos
    if options.exclusive:
        # no other hpc-bridge pod (of this job or another) shares a node with this job's pods
        placement["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchExpressions": [{"key": UID_LABEL, "operator": "Exists"}]},
            "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}
    return placement


def apply_placement(pod: dict[str, Any], placement: dict[str, Any]) -> None:
    if "nodeSelector" in placement:
        pod["nodeSelector"] = {**(pod.get("nodeSelector") or {}), **placement["nodeSelector"]}
    if "priorityClassName" in placement:
        pod["priorityClassName"] = placement["priorityClassName"]
    if "affinity" in placement:
        pod.setdefault("affinity", {})["podAntiAffinity"] = copy.deepcopy(placement["affinity"]["podAntiAffinity"])


#: the gang schedulers' PodGroups, and how a pod says it belongs to one (Kubeflow's coscheduling and volcano
#: plugins: a label for scheduler-plugins, an annotation for Volcano)
POD_GROUP_API = {"coscheduling": ("scheduling.x-k8s.io", "v1alpha1", "podgroups"),
                 "volcano": ("scheduling.volcano.sh", "v1beta1", "podgroups")}




VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"


def join_gang(plan: LaunchPlan, name: str, pod_meta: dict[str, Any], pod: dict[str, Any]) -> None:
    group = plan.pod_group
    assert group is not None  # called for a plan with a gang policy only
    if group.kind == "coscheduling":
        pod_meta.setdefault("labels", {})[COSCHEDULING_LABEL] = name
    else:
        pod_meta.setdefault("annotations", {})[VOLCANO_GROUP_ANNOTATION] = name
    if group.scheduler_name and not pod.get("schedulerName"):
        pod["schedulerName"] = group.scheduler_name


def pod_requests(pod: dict[str, Any]) -> dict[str, Fraction]:
    """What one pod asks the scheduler for, as Kubernetes counts it: its containers' requests summed (a limit
    stands in for a request not given), or an init container's when that is larger."""
    from fractions import Fraction

    from bridge.api.quantity import parse_quantity

    def asked(container: dict[str, Any]) -> dict[str, Fraction]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(value) for name, value in merged.items()}

    total: dict[str, Fraction] = {}
    for container in pod.get("containers") or []:
        for name, amount in asked(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in pod.get("initContainers") or []:
        for name, amount in asked(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    return total
