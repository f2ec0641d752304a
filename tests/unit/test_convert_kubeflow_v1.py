"""Training Operator v1 jobs (PyTorchJob, TFJob, MPIJob) → TrainJob: the converted documents and the notes for
what does not carry over, byte for byte (tests/golden/v1-*, --update-golden); refusals; TF_CONFIG per node.
Real runs of the converted jobs: tests/integration/local and tests/integration/slurm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import service
from bridge.api.loader import to_yaml
from bridge.errors import InvalidSpec
from bridge.mpi.discovery import Topology
from bridge.mpi.launchers import tf_config
from tests.builders import cluster

CASES = Path(__file__).resolve().parent.parent / "cases" / "v1"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", sorted(path.stem for path in CASES.glob("*.yaml")))
def test_conversion_matches_golden(case: str, golden) -> None:
    source = service.read_input(str(CASES / f"{case}.yaml"))
    text = to_yaml(source.converted())
    golden(f"v1-{case}.trainjob.yaml", "".join(f"# note: {line}\n" for line in source.notes) + text)
    # what it writes is what `submit` runs: it plans for every backend (on Kubernetes, a cluster whose pod policy
    # allows the v1 job's ServiceAccount)
    for backend in ("slurm", "flux"):
        service.prepare(source, to=backend)
    service.prepare(source, cluster="k8s", configured={"k8s": cluster(
        "kubernetes", "k8s", kubernetes={"podPolicy": {"serviceAccountNames": ["trainer"]}})})


def test_every_field_of_the_v1_job_is_carried_or_reported() -> None:
    """The full PyTorchJob: each of its settings is in the TrainJob or named in a note."""
    source = service.read_input(str(CASES / "pytorchjob-full.yaml"))
    text = to_yaml(source.converted()) + "\n".join(source.notes)
    for expected in ("numNodes: 3", "numProcPerNode: 2", "activeDeadlineSeconds: 3600", "queue-name: team-a",
                     "priorityClassName: high", "nodeSelector", "tolerations", "mountPath: /data",
                     "sidecar.istio.io/inject", "imagePullPolicy: Always", "LOGLEVEL", "memory: 4Gi",
                     "cleanPodPolicy None", "backoffLimit 3", "Master.restartPolicy OnFailure",
                     "Worker.restartPolicy OnFailure", "ports"):
        assert expected in text, expected


def test_mpirun_flags_become_env_or_are_reported() -> None:
    source = service.read_input(str(CASES / "mpijob-openmpi.yaml"))
    trainjob = source.single_trainjob()
    assert trainjob.spec.trainer.command == ["/home/mpiuser/pi"]
    env = {e.name: e.value for e in trainjob.spec.trainer.env}
    assert env == {"OMPI_MCA_btl_tcp_if_include": "eth0", "FOO": "bar"}
    assert trainjob.spec.runtime_ref.name == "mpi-distributed"  # its settings are the built-in's
    defaults = service.read_input(str(CASES / "mpijob-defaults.yaml"))
    job = defaults.single_trainjob()
    assert job.spec.runtime_ref.name == "mpich-root-mpi" and job.spec.runtime_ref.kind == "TrainingRuntime"
    assert job.spec.trainer.command == ["/home/pi", "--steps", "10"] and job.spec.trainer.num_nodes == 3
    assert {e.name: e.value for e in job.spec.trainer.env} == {"MPIR_CVAR_CH4_NETMOD": "ofi"}
    runtime = next(obj for obj in defaults.objects if obj.kind == "TrainingRuntime")
    assert runtime.metadata.namespace == "research"
    assert any("-ppn 1" in note or "mpirun -ppn 1" in note for note in defaults.notes), defaults.notes


@pytest.mark.parametrize("patch, field, message", [
    ({"kind": "MPIJob", "args": ["sh", "-c", "mpirun -n 2 ./a | tee log"]}, "command", "a shell script"),
    ({"kind": "MPIJob", "args": ["mpirun", "--frobnicate", "./a"]}, "mpirun", "--frobnicate"),
    ({"kind": "MPIJob", "args": ["mpirun", "-np"]}, "mpirun -np", "needs a value"),
    ({"kind": "PyTorchJob", "container": "trainer"}, "containers", "named 'pytorch'"),
    ({"kind": "PyTorchJob", "role": "Chief"}, "spec.pytorchReplicaSpecs.Chief", "Master and Worker"),
    ({"kind": "PyTorchJob", "nproc": "lots"}, "spec.nprocPerNode", "auto, cpu, gpu or a whole number"),
])
def test_what_has_no_trainjob_form_is_refused_naming_the_field(tmp_path, patch, field, message) -> None:
    if patch["kind"] == "MPIJob":
        doc = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": "m"},
               "spec": {"mpiReplicaSpecs": {"Launcher": {"template": {"spec": {"containers": [
                   {"name": "l", "image": "i", "command": patch["args"]}]}}}}}}
    else:
        role = patch.get("role", "Master")
        doc = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "p"},
               "spec": {"pytorchReplicaSpecs": {role: {"replicas": 1, "template": {"spec": {"containers": [
                   {"name": patch.get("container", "pytorch"), "image": "i"}]}}}}}}
        if "nproc" in patch:
            doc["spec"]["nprocPerNode"] = patch["nproc"]
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidSpec) as caught:
        service.read_input(str(path))
    assert field in caught.value.field and message in str(caught.value), str(caught.value)
    # the CLI: one line naming the field and the value, exit code 2, nothing written
    result = subprocess.run([sys.executable, "-m", "bridge", "convert", str(path), "--to", "trainjob"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr


def test_tf_config_names_each_nodes_role_in_rank_order() -> None:
    hosts = ("n0", "n1", "n2", "n3")
    configs = [json.loads(tf_config("chief=1,worker=2,ps=1", Topology(hosts, rank, 1), 2223)) for rank in range(4)]
    cluster = {"chief": ["n0:2223"], "worker": ["n1:2224", "n2:2225"], "ps": ["n3:2226"]}
    assert all(c["cluster"] == cluster for c in configs)
    assert [c["task"] for c in configs] == [{"type": "chief", "index": 0}, {"type": "worker", "index": 0},
                                            {"type": "worker", "index": 1}, {"type": "ps", "index": 0}]
    with pytest.raises(InvalidSpec, match="names 3 nodes; the job has 4"):
        tf_config("chief=1,worker=2", Topology(hosts, 0, 1), 2223)
    with pytest.raises(InvalidSpec, match="is not ROLE=COUNT"):
        tf_config("chief", Topology(hosts, 0, 1), 2223)
