"""What the operator reads of Kueue's admission (bridge/operator/kueue.py)."""

from __future__ import annotations

import copy

from bridge.operator.kueue import admitted_placement, as_admitted


def admitted(selector: dict) -> dict:
    return {"metadata": {"name": "t", "labels": {"kueue.x-k8s.io/queue-name": "lq", "team": "a"}},
            "spec": {"runtimePatches": [
                {"manager": "someone/else", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                    {"name": "node", "template": {"spec": {"template": {"spec": {
                        "nodeSelector": {"hpcbridge.io/cluster": "not-kueues"}}}}}}]}}}},
                {"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {
                    "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                    "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                        "metadata": {"labels": {"kueue.x-k8s.io/podset": "node"}},
                        "spec": {"nodeSelector": selector}}}}}]}}}}]}}


def test_a_flavor_naming_a_cluster_and_partition_places_the_trainjob_there() -> None:
    doc = admitted({"hpcbridge.io/cluster": "slurm-a", "hpcbridge.io/partition": "gpu", "zone": "z1"})
    before = copy.deepcopy(doc)
    assert admitted_placement(doc) == {"hpcbridge.io/cluster": "slurm-a", "hpcbridge.io/partition": "gpu"}
    planned = as_admitted(doc)
    assert doc == before  # Kueue's patch is read, never edited
    assert planned["metadata"]["annotations"] == {"hpcbridge.io/cluster": "slurm-a", "hpcbridge.io/partition": "gpu"}
    assert planned["metadata"]["labels"] == {"team": "a"}  # admitted as a whole: no second queueing
    kueue = planned["spec"]["runtimePatches"][1]["trainingRuntimeSpec"]["template"]
    assert kueue["metadata"]["labels"] == {}
    pod = kueue["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"zone": "z1"}  # a real node label stays, for Kubernetes
    assert pod["metadata"]["labels"] == {"kueue.x-k8s.io/podset": "node"}
    # another manager's patch is not Kueue's admission
    assert planned["spec"]["runtimePatches"][0] == before["spec"]["runtimePatches"][0]


def test_a_flavor_without_placement_labels_leaves_the_cluster_to_the_trainjob() -> None:
    planned = as_admitted(admitted({}))
    assert "annotations" not in planned["metadata"] or not planned["metadata"]["annotations"]
    assert as_admitted({"metadata": {"name": "t"}, "spec": {}}) == {"metadata": {"name": "t"}, "spec": {}}
