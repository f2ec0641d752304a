"""What the operator reads of Kueue: Kueue decides *when* a TrainJob runs, hpc-bridge *where*.

Kueue admits a TrainJob by unsuspending it, after writing its ResourceFlavor's ``nodeLabels`` into a runtime
patch of its own (manager ``kueue.x-k8s.io/manager``) as the pods' nodeSelector. A flavor whose nodeLabels say
``hpcbridge.io/cluster: <BridgeCluster>`` (and optionally ``hpcbridge.io/partition: <partition>``) sends the
TrainJob to that cluster (and partition): with several such flavors in one ClusterQueue, Kueue's flavor
fungibility picks the cluster that has quota. Kueue's patch is read, never edited; the operator plans from a
copy with those two keys moved from the nodeSelector to the annotations that choose cluster and partition.
"""

from __future__ import annotations

import copy
from typing import Any

from bridge.annotations import CLUSTER_ANNOTATION, PARTITION_ANNOTATION, QUEUE_LABEL

#: the runtime patch Kueue writes (and only Kueue may change)
KUEUE_MANAGER = "kueue.x-k8s.io/manager"
#: flavor nodeLabels that place an admitted TrainJob, and the annotation each becomes
PLACEMENT_LABELS = {CLUSTER_ANNOTATION: CLUSTER_ANNOTATION, PARTITION_ANNOTATION: PARTITION_ANNOTATION}


def admitted_placement(doc: dict[str, Any]) -> dict[str, str]:
    """The placement Kueue's admission wrote (annotation → value), from its patch's nodeSelectors."""
    found: dict[str, str] = {}
    for patch in (doc.get("spec") or {}).get("runtimePatches") or []:
        if patch.get("manager") != KUEUE_MANAGER:
            continue
        for job in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
                "replicatedJobs") or []:
            selector = ((((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get(
                "nodeSelector") or {}
            for label, annotation in PLACEMENT_LABELS.items():
                if label in selector:
                    found[annotation] = selector[label]
    return found




def as_admitted(doc: dict[str, Any]) -> dict[str, Any]:
    """A copy of the TrainJob *doc* to plan from. Kueue's placement labels move from its patch's nodeSelectors
    to the annotations that choose the cluster and partition (they name no real node label). Its queue label
    goes, from the TrainJob and from what Kueue's patch puts on the JobSet (v0.17.0 does): Kueue admitted the
    TrainJob as a whole, and a JobSet made for it must not be queued, and charged, a second time."""
    placement = admitted_placement(doc)
    labels = (doc.get("metadata") or {}).get("labels") or {}
    patches = [patch for patch in (doc.get("spec") or {}).get("runtimePatches") or []
               if patch.get("manager") == KUEUE_MANAGER]
    if not placement and QUEUE_LABEL not in labels and not patches:
        return doc
    doc = copy.deepcopy(doc)
    doc["metadata"].get("labels", {}).pop(QUEUE_LABEL, None)
    doc.setdefault("metadata", {}).setdefault("annotations", {}).update(placement)
    for patch in doc["spec"]["runtimePatches"]:
        if patch.get("manager") != KUEUE_MANAGER:
            continue
        template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        _drop_label(template.get("metadata"))
        for job in (template.get("spec") or {}).get("replicatedJobs") or []:
            pod_template = job.get("template", {}).get("spec", {}).get("template", {})
            _drop_label(pod_template.get("metadata"))
            pod = pod_template.get("spec") or {}
            selector = pod.get("nodeSelector")
            if selector:
                for label in PLACEMENT_LABELS:
                    selector.pop(label, None)
                if not selector:
                    del pod["nodeSelector"]
    return doc


def _drop_label(metadata: dict[str, Any] | None) -> None:
    if metadata and metadata.get("labels"):
        metadata["labels"].pop(QUEUE_LABEL, None)
