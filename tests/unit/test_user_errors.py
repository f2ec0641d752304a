"""Errors name what the user typed and say what to do next (issue 40): the flag or the ``#SBATCH`` line an
annotation came from, the closest known field or name to a mistyped one, and a missing known_hosts file as a
configuration error at once rather than an unreachable host retried."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bridge import service
from bridge.adapters.transport import SSHTransport
from bridge.api.loader import load_documents
from bridge.errors import InvalidSpec, closest, did_you_mean
from tests.builders import cluster, trainjob_doc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mpi-allreduce.yaml"
LOCAL = {"local": cluster("local", "local"), "hpc": cluster("slurm", "hpc")}


def refused(call, *args, **kwargs) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as caught:
        call(*args, **kwargs)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2
    return caught.value


def prepare_file(path: Path | str, flags: tuple[str, ...] = (), **kwargs) -> service.Prepared:
    return service.prepare(service.read_input(str(path), flags), configured=LOCAL, **kwargs)


# --- the flag or the line, not the annotation it became ------------------------------------------------------


def test_a_mistyped_cluster_flag_is_blamed_on_the_flag_with_the_closest_name() -> None:
    error = refused(prepare_file, EXAMPLE, cluster="hcp")
    assert error.field == "--cluster" and error.value == "hcp"
    assert "did you mean 'hpc'?" in error.problem and "configured: hpc, local" in error.problem


def test_a_cluster_the_trainjob_names_stays_the_annotation(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(trainjob_doc(annotations={"hpcbridge.io/cluster": "hpcc"},
                                                trainer={"command": ["true"]})))
    error = refused(prepare_file, path)
    assert error.field == "metadata.annotations[hpcbridge.io/cluster]" and "did you mean 'hpc'?" in error.problem


def test_migrate_names_its_own_flag_for_an_unknown_target() -> None:
    error = refused(prepare_file, EXAMPLE, cluster="nowhere", cluster_field="--to")
    assert error.field == "--to" and "did you mean" not in error.problem


def test_sbatch_flags_over_a_trainjob_are_named_as_typed_in_errors_and_notes() -> None:
    error = refused(prepare_file, EXAMPLE, ("--ntasks=3",), cluster="local")
    assert error.field == "command line: --ntasks" and error.source == str(EXAMPLE)
    prepared = prepare_file(EXAMPLE, ("--mail-type=END",), cluster="local")
    dropped = [note for note in prepared.notes if "--mail-type" in note]
    assert len(dropped) == 1 and dropped[0].startswith("command line: --mail-type=END dropped on cluster 'local'")


def test_an_annotation_the_trainjob_carries_stays_the_field(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(trainjob_doc(runtime="mpi-distributed", annotations={
        "hpcbridge.io/sbatch.ntasks": "3"}, trainer={"command": ["true"], "numNodes": 2})))
    error = refused(prepare_file, path, cluster="local")
    assert error.field == "metadata.annotations[hpcbridge.io/sbatch.ntasks]"
    # a flag over it is what the user typed last: the flag is blamed
    error = refused(prepare_file, path, ("--ntasks=5",), cluster="local")
    assert error.field == "command line: --ntasks"


def test_a_script_line_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks=3\n#SBATCH --mail-type=END\nhostname\n")
    error = refused(prepare_file, path, cluster="local")
    assert error.field == "#SBATCH line 3: --ntasks"


# --- did you mean --------------------------------------------------------------------------------------------


def test_closest_suggests_only_what_is_near() -> None:
    assert closest("numNode", ["numNodes", "numProcPerNode"]) == "numNodes"
    assert closest("zzz", ["numNodes"]) is None and did_you_mean("zzz", ["numNodes"]) == ""
    assert did_you_mean("lcoal", ["local", "hpc"]) == "did you mean 'local'?"


@pytest.mark.parametrize(("document", "path", "suggestion"), [
    (trainjob_doc(trainer={"numNode": 2}), "spec.trainer.numNode", "numNodes"),
    (trainjob_doc(metadata={"anotations": {}}), "metadata.anotations", "annotations"),
    (trainjob_doc(trainer={"env": [{"name": "A", "valu": "1"}]}), "spec.trainer.env[0].valu", "value"),
    ({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "hpc"},
      "spec": {"type": "slurm", "slurm": {"knownHostFile": "/k"}}}, "spec.slurm.knownHostFile", "knownHostsFile"),
    ({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime", "metadata": {"name": "r"},
      "spec": {"mlPolicy": {"numNodes": 1, "mpi": {"numProcPerNod": 2}}}}, "spec.mlPolicy.mpi.numProcPerNod",
     "numProcPerNode"),
])
def test_an_unknown_field_gets_the_closest_field_of_its_model(document, path, suggestion) -> None:
    error = refused(load_documents, yaml.safe_dump(document))
    assert error.field == path and error.problem.startswith(f"unknown field; did you mean {suggestion!r}?")


def test_an_unknown_field_far_from_every_field_is_only_unknown() -> None:
    error = refused(load_documents, yaml.safe_dump(trainjob_doc(trainer={"zzzzzz": 1})))
    assert error.problem == "unknown field"


def test_an_unknown_runtime_gets_the_closest_known_runtime(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(trainjob_doc(runtime="torch-distributd", trainer={"command": ["true"]})))
    error = refused(prepare_file, path)
    assert error.field == "spec.runtimeRef.name" and "did you mean 'torch-distributed'?" in error.problem


def test_an_unknown_hpcbridge_annotation_gets_the_closest_knob(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(trainjob_doc(annotations={"hpcbridge.io/partiton": "gpu"},
                                                trainer={"command": ["true"]})))
    error = refused(prepare_file, path, cluster="hpc")
    assert error.field == "metadata.annotations[hpcbridge.io/partiton]"
    assert "did you mean 'hpcbridge.io/partition'?" in error.problem


def test_a_job_command_with_an_unknown_cluster_gets_the_closest_configured(monkeypatch) -> None:
    monkeypatch.setattr(service.targets, "clusters", lambda: dict(LOCAL))
    error = refused(service.targets.cluster_adapter, "hpcc")
    assert error.field == "--cluster" and "did you mean 'hpc'?" in error.problem


# --- known_hosts ---------------------------------------------------------------------------------------------


def test_a_missing_known_hosts_file_fails_at_once_with_how_to_make_it(tmp_path: Path) -> None:
    slept: list[float] = []
    missing = tmp_path / "known_hosts"
    ssh = SSHTransport("login.example", 2222, known_hosts_file=str(missing), retries=3, sleep=slept.append)
    error = refused(ssh.run, ["squeue"])
    assert not slept and ssh.connects == 0  # no retry, no connection: nothing brings the file
    assert error.field == "spec.slurm.knownHostsFile" and error.value == str(missing)
    assert "ssh-keygen -lf -" in error.problem  # check the key first
    assert f"ssh-keyscan -H -p 2222 login.example >> {missing}" in error.problem
    flux = SSHTransport("login", known_hosts_file=str(missing), known_hosts_field="spec.flux.knownHostsFile")
    error = refused(lambda: list(flux.stream(["flux", "jobs"])))
    assert error.field == "spec.flux.knownHostsFile" and "ssh-keyscan -H login >> " in error.problem
