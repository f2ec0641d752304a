"""A cluster's size as each backend's query prints it (sinfo, flux resource list, the API's nodes) and as the
virtual node advertises it; the Events a TrainJob's backend transitions make; the `kubectl get trainjobs`
columns. tests/integration/kubernetes/test_node_capacity_events_columns.py checks them on the real daemons."""

from __future__ import annotations

import datetime

from bridge.adapters.base import Amounts, ClusterSize
from bridge.adapters.flux import capacity as flux_capacity
from bridge.adapters.kubernetes import capacity as kube_capacity
from bridge.adapters.slurm import sinfo
from bridge.annotations import JOB_CLUSTER_ANNOTATION, JOB_ID_ANNOTATION
from bridge.api.crd import all_crds
from bridge.errors import BackendUnavailable
from bridge.operator.conditions import Event, event_for
from bridge.operator.virtual_node import Endpoint, VirtualNodes, capacity_note, render_status, resources
from tests.unit.test_placement import SINFO
from tests.unit.test_virtual_node import cluster

NOW = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


def test_slurm_counts_each_node_once_and_a_drained_one_as_not_usable() -> None:
    size = sinfo.size(sinfo.parse(SINFO), "sinfo")
    assert size.total == Amounts(4, 8, 8000, 8)  # node1 is in two partitions: counted once
    assert size.usable == Amounts(3, 6, 6000, 6)  # node4 is drained
    assert size.detail == "sinfo: 3 of 4 nodes usable"


def test_flux_counts_ranks_cores_and_gpus_and_says_no_memory() -> None:
    size = flux_capacity.size({"free": "rank0/core[0-3],gpu0 rank1/core[0-1]", "allocated": "rank1/core[2-3]",
                               "down": "rank2/core[0-3],gpu[0-1]"})
    assert size.total == Amounts(3, 12, None, 3)
    assert size.usable == Amounts(2, 8, None, 1)


def test_kubernetes_sums_capacity_and_the_allocatable_of_ready_schedulable_nodes() -> None:
    def node(ready: bool, cordoned: bool = False) -> dict:
        return {"spec": {"unschedulable": cordoned},
                "status": {"conditions": [{"type": "Ready", "status": str(ready)}],
                           "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
                           "allocatable": {"cpu": "7500m", "memory": "30Gi", "nvidia.com/gpu": "2"}}}

    size = kube_capacity.size([node(True), node(True, cordoned=True), node(False)])
    assert size.total == Amounts(3, 24, 3 * 32 * 1024, 6)
    assert size.usable == Amounts(1, 7, 30 * 1024, 2)


def test_the_virtual_node_advertises_what_the_backend_says_and_removes_what_it_does_not() -> None:
    unknown_capacity, unknown_allocatable = resources(None)
    assert unknown_capacity == {"hpcbridge.io/nodes": None, "cpu": None, "memory": None, "nvidia.com/gpu": None,
                                "pods": "10000"}  # a None removes the figure from the Node: never a guess
    flux = ClusterSize(Amounts(3, 12, None, 3), Amounts(2, 8, None, 1), "flux resource list")
    status = render_status(cluster("flux"), Endpoint("10.0.0.5", 10250), NOW, flux)["status"]
    assert status["capacity"] == {"hpcbridge.io/nodes": "3", "cpu": "12", "memory": None, "nvidia.com/gpu": "3",
                                  "pods": "10000"}
    assert status["allocatable"]["hpcbridge.io/nodes"] == "2" and status["allocatable"]["cpu"] == "8"
    slurm = ClusterSize(Amounts(4, 8, 8000, 8), Amounts(3, 6, 6000, 6), "sinfo")
    assert resources(slurm)[0]["memory"] == "8000Mi"
    assert capacity_note(None, "no route to host", NOW) == "unknown: no route to host"
    assert capacity_note(slurm, None, NOW) == "4 nodes, 8 CPUs, 8000 MiB, 8 GPUs (sinfo) at 2026-01-02T03:04:05Z"
    assert "kept while the backend is not answering: timed out" in capacity_note(slurm, "timed out", NOW)


class _Core:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []

    def patch_node(self, name: str, body: dict) -> None:
        self.patches.append(("node", body))

    def patch_node_status(self, name: str, body: dict) -> None:
        self.patches.append(("status", body))


class _Api:
    def __init__(self) -> None:
        from kubernetes import client

        self.api_client = client.ApiClient()


def test_the_size_is_asked_through_the_service_and_the_last_answer_stays_while_the_backend_is_away() -> None:
    answers: list[ClusterSize | Exception] = [ClusterSize(Amounts(4, 8, 8000, 8), Amounts(4, 8, 8000, 8), "sinfo"),
                                              BackendUnavailable("slurm", "sinfo: connection refused")]

    class Adapter:
        def size(self) -> ClusterSize:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

    nodes = VirtualNodes(_Api(), Endpoint("10.0.0.5", 10250), dict, adapter_for=lambda name: Adapter())
    nodes.core = _Core()
    hpc = cluster("slurm")
    nodes.refresh_size(hpc)
    assert nodes.sizes["hpc"].total.cpus == 8
    (_, note), (_, status) = nodes.core.patches
    assert note["metadata"]["annotations"]["operator.hpcbridge.io/capacity"].startswith("4 nodes, 8 CPUs")
    assert status["status"]["capacity"]["hpcbridge.io/nodes"] == "4"
    nodes.core.patches.clear()
    nodes.refresh_size(hpc)  # the backend is away: the figures stay, the annotation says why
    (_, note), (_, status) = nodes.core.patches
    assert "connection refused" in note["metadata"]["annotations"]["operator.hpcbridge.io/capacity"]
    assert status["status"]["capacity"]["cpu"] == "8"
    nodes.stop()


def test_the_size_is_asked_again_only_when_due() -> None:
    nodes = VirtualNodes(_Api(), Endpoint("10.0.0.5", 10250), dict, size_every=60, adapter_for=lambda name: None)
    asked: list[str] = []
    nodes._askers.submit = lambda fn, item: asked.append(item.name)  # type: ignore[method-assign]
    hpc = cluster("slurm")
    nodes._ask_size_when_due(hpc, NOW)
    nodes._asking.clear()
    nodes._ask_size_when_due(hpc, NOW + datetime.timedelta(seconds=30))
    nodes._ask_size_when_due(hpc, NOW + datetime.timedelta(seconds=61))
    assert asked == ["hpc", "hpc"]
    nodes.stop()


JOB = "slurm job 42 on cluster hpc"


def test_each_backend_transition_is_one_event_with_what_a_reader_needs() -> None:
    seen = []
    last = None
    for state, reason, code, hosts in [("Pending", None, None, ()), ("Pending", "Priority", None, ()),
                                       ("Pending", "Priority", None, ()), ("Pending", "Resources", None, ()),
                                       ("Running", None, None, ("node[1-2]",)), ("Completing", None, None, ()),
                                       ("Succeeded", None, 0, ("node[1-2]",))]:
        event = event_for(last, state, reason, code, hosts, JOB)
        if event is not None:
            seen.append(event)
        last = (state, reason)
    assert seen == [Event("Queued", f"{JOB} is queued: Priority"), Event("Queued", f"{JOB} is queued: Resources"),
                    Event("Running", f"{JOB} is running on node[1-2]"),
                    Event("Succeeded", f"{JOB} succeeded with exit code 0")]


def test_a_job_that_ends_badly_is_a_warning_with_its_exit_code_and_reason() -> None:
    assert event_for(("Running", None), "Failed", "OutOfMemory", 137, (), JOB) == \
        Event("Failed", f"{JOB} failed with exit code 137 (OutOfMemory)", warning=True)
    assert event_for(None, "Cancelled", None, None, (), JOB) == Event("Cancelled", f"{JOB} was cancelled", warning=True)
    assert event_for(("Running", None), "Timeout", None, None, (), JOB).message == f"{JOB} timed out"
    assert event_for(("Running", None), "Running", None, None, ("n1",), JOB) is None
    assert event_for(None, "Unknown", None, None, (), JOB) is None  # not seen yet: Submitted said it all


def test_kubectl_get_trainjobs_shows_the_cluster_and_job_the_operator_records() -> None:
    columns = all_crds()["trainer.kubeflow.org_trainjobs.yaml"]["spec"]["versions"][0]["additionalPrinterColumns"]
    paths = {column["name"]: column["jsonPath"] for column in columns}
    assert list(paths) == ["Cluster", "Job ID", "State", "Age"]
    assert paths["Job ID"] == ".metadata.annotations." + JOB_ID_ANNOTATION.replace(".", "\\.")
    assert paths["Cluster"] == ".metadata.annotations." + JOB_CLUSTER_ANNOTATION.replace(".", "\\.")
