"""``--cluster auto``: each backend's capacity read from what its scheduler prints (sinfo, flux resource list,
the API's nodes and pods) and the choice among clusters. The real schedulers answer the same queries in
tests/integration/test_placement.py and the conformance suite."""

from __future__ import annotations

from fractions import Fraction

import pytest

from bridge import service
from bridge.adapters.base import NodeNeed
from bridge.adapters.flux import capacity as flux_capacity
from bridge.adapters.kubernetes import capacity as kube_capacity
from bridge.adapters.slurm import sinfo
from bridge.api.cluster import BridgeCluster
from bridge.errors import BackendUnavailable, InvalidSpec
from tests.builders import TRAINJOB, cluster
from tests.fakes import FakeBackend

# sinfo -O as Slurm 22.05 prints it for the test cluster, with node3 busy, node4 drained, node2 half used
SINFO = """\
node1|long|idle|0/2/0/2|2000|0|gpu:a100:2|gpu:a100:0(IDX:N/A)|1-00:00:00|up|1-2|
node1|debug*|idle|0/2/0/2|2000|0|gpu:a100:2|gpu:a100:0(IDX:N/A)|infinite|up|1-infinite|
node2|debug*|mix|1/1/0/2|2000|1000|gpu:a100:2|gpu:a100:1(IDX:0)|infinite|up|1-infinite|
node3|debug*|alloc|2/0/0/2|2000|2000|gpu:a100:2|gpu:a100:2(IDX:0-1)|infinite|up|1-infinite|
node4|debug*|drain|0/0/2/2|2000|0|gpu:a100:2|gpu:a100:0(IDX:N/A)|infinite|up|1-infinite|
"""


def test_sinfo_rows_and_what_fits_now_and_at_all() -> None:
    rows = sinfo.parse(SINFO)
    assert rows[2] == sinfo.NodeRow("node2", "debug", True, "mix", 1, 2, 2000, 1000, 2, 1, None, None, True)
    one_cpu = sinfo.count(rows, NodeNeed(1, None, 0), 2, None, None)
    assert (one_cpu.free, one_cpu.fitting, one_cpu.limit) == (2, 3, None)  # node1 + half-used node2; node4 drained
    assert one_cpu.detail == "partition debug: 2 of 4 nodes free for 1 CPU, 0 GPU"
    two_gpus = sinfo.count(rows, NodeNeed(1, 500, 2), 2, None, None)
    assert (two_gpus.free, two_gpus.fitting) == (1, 3)  # node2 has one GPU left
    assert sinfo.count(rows, NodeNeed(4, None, 0), 1, None, None).fitting == 0


def test_partition_limits_are_limits_not_waits() -> None:
    rows = sinfo.parse(SINFO)
    assert sinfo.count(rows, NodeNeed(1, None, 0), 1, "long", 2 * 86400).limit == \
        "partition long allows 86400s, the job asks 172800s"
    assert sinfo.count(rows, NodeNeed(1, None, 0), 3, "long", None).limit == \
        "partition long allows 2 nodes per job, the job asks 3"
    assert sinfo.count(rows, NodeNeed(1, None, 0), 1, "gpu", None).limit == "no partition 'gpu'"


def test_sinfo_output_we_cannot_read_is_a_backend_error_not_a_guess() -> None:
    with pytest.raises(BackendUnavailable, match="sinfo printed a line"):
        sinfo.parse("node1|debug*|idle|garbage|")


def test_flux_resource_sets_per_rank() -> None:
    assert flux_capacity.per_rank("rank[0-1]/core[0-1],gpu0 rank3/core[0-3,5]") == {
        0: {"core": 2, "gpu": 1}, 1: {"core": 2, "gpu": 1}, 3: {"core": 5}}
    states = {"free": "rank0/core[0-1] rank1/core1", "allocated": "rank1/core0", "down": "rank2/core[0-1]"}
    whole = flux_capacity.count(states, NodeNeed(1, None, 0), whole_nodes=True)
    assert (whole.free, whole.fitting) == (1, 2)  # a batch takes whole nodes: rank 1 is half used
    cores = flux_capacity.count(states, NodeNeed(1, None, 0), whole_nodes=False)
    assert (cores.free, cores.fitting) == (2, 2) and "1 down" in cores.detail


def _node(name: str, cpu: str, gpus: str = "0", labels: dict | None = None, ready: bool = True, taints=None) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or []},
            "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _pod(node: str, cpu: str) -> dict:
    return {"spec": {"nodeName": node, "containers": [{"resources": {"requests": {"cpu": cpu}}}]}}


def test_kubernetes_nodes_less_running_pods_against_one_trainer_pod() -> None:
    nodes = [_node("a", "4"), _node("b", "4"), _node("c", "16", ready=False),
             _node("d", "4", taints=[{"key": "gpu", "effect": "NoSchedule"}]), _node("e", "4", labels={"x": "y"})]
    pods = [_pod("a", "3500m"), _pod("b", "1")]
    trainer = {"containers": [{"resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "0"}}}]}
    counted = kube_capacity.count(nodes, pods, trainer)
    assert (counted.free, counted.fitting) == (2, 3)  # b and e free; a is busy; c not ready; d tainted
    tolerant = {**trainer, "tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"x": "y"}}
    assert (kube_capacity.count(nodes, pods, tolerant).free, kube_capacity.count(nodes, pods, tolerant).fitting) == (1, 1)
    assert kube_capacity.pod_requests({"containers": [{"resources": {"limits": {"cpu": "500m"}}},
                                                      {"resources": {"requests": {"cpu": "1"}}}]}) == {"cpu": Fraction(3, 2)}


def _clusters(*names: str) -> dict[str, BridgeCluster]:
    return {name: cluster(name=name) for name in names}


def place(free: dict[str, int | Exception], nodes: int = 2) -> service.Prepared:
    def adapter_for(cluster):
        adapter = FakeBackend(cluster)
        value = free[cluster.name]
        if isinstance(value, Exception):
            def fail(plan):
                raise value
            adapter.capacity = fail  # type: ignore[method-assign]
        else:
            adapter.free_nodes = value
        return adapter

    text = TRAINJOB.replace("trainer: {command: [train]}", f"trainer: {{command: [train], numNodes: {nodes}}}")
    return service.prepare(service.read_input("-", stdin=text), cluster="auto", configured=_clusters(*free),
                           adapter_for=adapter_for)


def test_auto_takes_the_cluster_that_starts_the_job_now_and_says_why() -> None:
    chosen = place({"busy": 1, "roomy": 6, "full": 0})
    assert chosen.plan.cluster == "roomy" and chosen.adapter.cluster.name == "roomy"
    assert chosen.notes[:4] == (
        "placement: chose roomy (starts now)",
        "placement: candidate roomy (slurm): starts now — needs 2; fake: 6 of 8 nodes free",
        "placement: candidate busy (slurm): waits — needs 2; fake: 1 of 8 nodes free",
        "placement: candidate full (slurm): waits — needs 2; fake: 0 of 8 nodes free")


def test_when_every_cluster_is_busy_the_job_waits_where_fewest_nodes_are_missing() -> None:
    assert place({"a": 0, "b": 1}, nodes=3).plan.cluster == "b"
    assert place({"a": 2, "b": 2}).plan.cluster == "a"  # a tie: the order of the configuration


def test_clusters_that_cannot_run_or_answer_are_passed_over_and_none_left_is_exit_2() -> None:
    chosen = place({"down": BackendUnavailable("slurm", "sinfo: connection refused"), "ok": 2})
    assert chosen.plan.cluster == "ok"
    assert "placement: candidate down (slurm): unreachable — slurm unavailable: sinfo: connection refused" in chosen.notes
    with pytest.raises(InvalidSpec) as info:
        place({"small": 3}, nodes=9)
    assert info.value.exit_code == 2
    assert "no configured cluster can run this job: small (slurm): cannot run — needs 9 nodes, 8 could" in str(info.value)


def test_local_is_a_candidate_only_when_nothing_else_is_configured() -> None:
    local = cluster("local", "local")
    source = service.read_input("-", stdin=TRAINJOB)
    only_local = service.prepare(source, cluster="auto", configured={"local": local})
    assert only_local.plan.cluster == "local" and only_local.notes[0] == "placement: chose local (starts now)"


def test_the_local_machines_gpus_come_from_the_cluster_the_allocation_or_the_driver(tmp_path) -> None:
    from bridge.adapters.local import machine_gpus

    listing = "GPU 0: NVIDIA H200 (UUID: GPU-a)\nGPU 1: NVIDIA H200 (UUID: GPU-b)\n"
    assert machine_gpus(["3", "5"], {"CUDA_VISIBLE_DEVICES": "0"}, run=lambda _: listing) == (["3", "5"],
                                                                                              "the cluster's gpus")
    assert machine_gpus(None, {"CUDA_VISIBLE_DEVICES": "6, 7"}, run=lambda _: listing) == (["6", "7"],
                                                                                           "CUDA_VISIBLE_DEVICES")
    assert machine_gpus(None, {"CUDA_VISIBLE_DEVICES": ""}, run=lambda _: listing)[0] == []
    assert machine_gpus(None, {}, run=lambda _: listing) == (["0", "1"], "nvidia-smi -L")
    (tmp_path / "0000:01:00.0").mkdir()
    assert machine_gpus(None, {}, run=lambda _: None, proc_dir=str(tmp_path)) == (["0"], str(tmp_path))
    assert machine_gpus(None, {}, run=lambda _: None, proc_dir=str(tmp_path / "none"))[0] == []
    with pytest.raises(ValueError, match="gpus is the local cluster's own list"):
        cluster("slurm", "s", gpus=["0"])
    with pytest.raises(ValueError, match="defaults.image is the image of pods that name none"):
        cluster("slurm", "s", defaults={"image": "x:1"})
