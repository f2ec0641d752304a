"""The slurmrestd transport (JWT; the newest API the server speaks) against the real cluster's slurmrestd."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid

import pytest
import yaml

from bridge.adapters.base import JobState
from bridge.adapters.slurm import SlurmAdapter
from bridge.api import load_documents
from bridge.api.cluster import BridgeCluster, ClusterDefaults
from bridge.errors import BackendUnavailable, InvalidSpec
from bridge.plan import resolve
from tests import builders
from tests.harness import layer

from .conftest import finished, state_is, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

RUNTIME = load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
                         "metadata: {name: plain}\nspec: {mlPolicy: {numNodes: 1}}\n")[0]


@pytest.fixture(scope="module")
def rest_cluster(slurm_cluster, tmp_path_factory) -> BridgeCluster:
    url = slurm_cluster.rest_url or slurm_cluster.start_rest()
    token = tmp_path_factory.mktemp("jwt") / "token"
    token.write_text(f"SLURM_JWT={slurm_cluster.token()}\n")
    token.chmod(0o600)
    return builders.cluster("slurm", "viarest", slurm={"transport": "rest", "restUrl": url, "user": "root",
                                                      "tokenFile": str(token), "slurmConf": str(slurm_cluster.conf)},
                            defaults={"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]})


def job(name: str, command: list[str], workdir, nodes: int = 2, **spec):
    return load_documents(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "annotations": {"hpcbridge.io/workdir": str(workdir)}},
        "spec": {"runtimeRef": {"name": "plain"}, "trainer": {"command": command, "numNodes": nodes,
                                                              "resourcesPerNode": {"requests": {"memory": "100Mi"}}},
                 **spec}}))[0]


def test_rest_submit_follow_logs(rest_cluster, slurm_cluster, tmp_path) -> None:
    adapter = SlurmAdapter(rest_cluster)
    # one node: with several, srun's exit code is the highest of all tasks, which a killed peer can raise
    plan = resolve(job("via-rest", ["sh", "-c", "echo rest on $SLURM_JOB_NODELIST; exit 3"], tmp_path, nodes=1,
                       activeDeadlineSeconds=300), RUNTIME, rest_cluster)
    artifact = adapter.render(plan)
    body = json.loads(artifact.main)
    if adapter.rest.api.version == "v0.0.38":
        assert (body["job"]["nodes"], body["job"]["memory_per_node"], body["job"]["time_limit"]) == ("1", 100, 5)
    else:  # the data_parser's typed numbers
        assert (body["job"]["minimum_nodes"], body["job"]["memory_per_node"]["number"],
                body["job"]["time_limit"]["number"]) == (1, 100, 5)
    assert body["script"] == artifact.files[1].content
    ref = layer.submit_many(adapter, [artifact])[0]
    assert layer.submit_many(adapter, [artifact])[0] == ref  # idempotent over REST too
    status = wait_for(adapter, ref, finished)
    assert (status.state, status.exit_code) == (JobState.FAILED, 3)
    assert "rest on node" in "".join(adapter.logs(ref))
    info = slurm_cluster.run("scontrol", "--oneliner", "show", "job", ref.job_id).stdout
    assert f"Comment=hpcbridge.io/uid={plan.uid}" in info


def test_rest_cancel_and_check(rest_cluster, slurm_cluster, tmp_path) -> None:
    adapter = SlurmAdapter(rest_cluster)
    ref = adapter.submit(adapter.render(resolve(job("rest-sleeps", ["sleep", "300"], tmp_path), RUNTIME,
                                                rest_cluster)))
    wait_for(adapter, ref, state_is(JobState.RUNNING))
    adapter.cancel(ref)
    assert wait_for(adapter, ref, finished).state == JobState.CANCELLED
    # TERM, as suspend sends it, is Slurm's own cancel over REST too (a signal request would reach only the
    # job's steps, and a batch script running none would go on)
    ref = adapter.submit(adapter.render(resolve(job("rest-sleeps-2", ["sleep", "300"], tmp_path), RUNTIME,
                                                rest_cluster)))
    wait_for(adapter, ref, state_is(JobState.RUNNING))
    adapter.cancel(ref, signal="TERM", grace_seconds=30)
    assert wait_for(adapter, ref, finished).state == JobState.CANCELLED
    release = slurm_cluster.run("sinfo", "--version").stdout.split()[-1]
    assert f"on Slurm {release}: " in adapter.check()


def test_rest_bad_token_is_a_typed_error(rest_cluster, tmp_path) -> None:
    bad = tmp_path / "token"
    bad.write_text("not-a-jwt")
    cluster = rest_cluster.model_copy(deep=True)
    cluster.spec.slurm.token_file = str(bad)
    # slurmrestd answers a forged token with HTTP 500 "Unspecified error" (22.05), a ping of a controller that
    # does not answer (24.11) or HTTP 511 (26.05): typed and retryable for us
    with pytest.raises(BackendUnavailable, match=r"slurmrestd unavailable: (HTTP (401|403|500|511)|slurmctld does "
                                                 r"not answer slurmrestd)"):
        SlurmAdapter(cluster).check()


def test_rest_needs_an_absolute_workdir(rest_cluster) -> None:
    plan = resolve(job("rel", ["true"], "relative/dir"), RUNTIME, rest_cluster)
    with pytest.raises(InvalidSpec, match="absolute working directory"):
        SlurmAdapter(rest_cluster).render(plan)


def test_rest_capacity_is_what_sinfo_says(rest_cluster, bridge_cluster, tmp_path) -> None:
    """--cluster auto through slurmrestd: its nodes and partitions count as sinfo's lines do (the default
    partition, long = node[1-2], one that does not exist)."""
    found = []
    for partition in (None, "long", "nosuch"):
        trainjob = job("capacity", ["true"], tmp_path, nodes=1)
        if partition:
            trainjob = trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(
                update={"annotations": {**(trainjob.metadata.annotations or {}), "hpcbridge.io/partition": partition}})})
        for _ in range(3):  # two reads of a live cluster: a job of another test may end in between
            via_rest = SlurmAdapter(rest_cluster).capacity(resolve(trainjob, RUNTIME, rest_cluster))
            via_sinfo = SlurmAdapter(bridge_cluster).capacity(resolve(trainjob, RUNTIME, bridge_cluster))
            if via_rest == via_sinfo:
                break
        assert via_rest == via_sinfo, (via_rest, via_sinfo)
        found.append(via_rest)
    assert [c.fitting for c in found] == [4, 2, 0] and found[2].limit == "no partition 'nosuch'"


#: what slurmctld records of a job that both ways of sending it must agree on (ids, times, the script and
#: the command differ by nature: REST jobs have no submitting command line)
ASKED = ("NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "TRES", "TresPerNode", "TresPerJob", "TresPerTask",
         "OverSubscribe", "TimeLimit", "MinMemoryNode", "Partition", "Priority", "JobState", "Reason", "WorkDir",
         "StdOut", "Comment", "Features", "NtasksPerN:B:S:C", "CoreSpec", "ReqB:S:C:T", "Socks/Node", "JobName")


def _fields(slurm_cluster, job_id: str) -> dict[str, str]:
    from bridge.adapters.slurm.rest import OPTION_ENVIRONMENT
    from tests.harness.sbatch_oracle import read_job

    (stored,) = read_job(slurm_cluster.run, slurm_cluster.base / "state", job_id)
    environment = dict(entry.partition("=")[::2] for entry in stored.environment or ())
    # what sbatch puts in the environment for the options it was given, present alike or absent alike
    implied = {f"env {name}": environment.get(name, "-") for names in OPTION_ENVIRONMENT.values() for name in names}
    out = slurm_cluster.run("scontrol", "--oneliner", "show", "job", job_id).stdout
    fields = dict(word.split("=", 1) for word in out.split() if "=" in word)
    # the uid hpc-bridge appends differs per submission by design
    fields["Comment"] = fields.get("Comment", "").split("hpcbridge.io/uid=")[0]
    fields["StdOut"] = re.sub(rf"-{job_id}\.out$", "-%j.out", fields.get("StdOut", ""))
    return {**{name: fields.get(name, "-") for name in ASKED}, **implied}


def test_rest_job_is_the_job_sbatch_submits(rest_cluster, bridge_cluster, slurm_cluster, tmp_path) -> None:
    """Exclusive nodes, GPUs, memory, a time limit and a partition reach slurmctld over REST exactly as through
    sbatch: an API that ignored one (slurmrestd warns and submits anyway) would show here."""
    trainjob = load_documents(yaml.safe_dump({
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "asks-much", "annotations": {"hpcbridge.io/workdir": str(tmp_path),
                                                          "hpcbridge.io/exclusive": "true",
                                                          "hpcbridge.io/partition": "long"}},
        "spec": {"runtimeRef": {"name": "plain"}, "suspend": True, "activeDeadlineSeconds": 600,
                 "trainer": {"command": ["sleep", "300"], "numNodes": 2,
                             "resourcesPerNode": {"requests": {"memory": "100Mi"},
                                                  "limits": {"nvidia.com/gpu": "1"}}}}}))[0]
    seen = {}
    for cluster in (rest_cluster, bridge_cluster):
        adapter = SlurmAdapter(cluster)
        ref = adapter.submit(adapter.render(resolve(trainjob, RUNTIME, cluster)))
        try:
            seen[cluster.name] = _fields(slurm_cluster, ref.job_id)
        finally:
            adapter.cancel(ref)
    assert seen["viarest"] == seen["testslurm"]
    assert seen["viarest"]["OverSubscribe"] == "NO" and "gpu" in seen["viarest"]["TresPerNode"]
    assert seen["viarest"]["TimeLimit"] == "00:10:00" and seen["viarest"]["NumNodes"] in ("2", "2-2")


def test_rest_speaks_the_newest_api_the_server_serves(rest_cluster, slurm_cluster, capsys) -> None:
    import urllib.request

    from bridge.adapters.slurm.rest import VERSIONS, served_versions

    adapter = SlurmAdapter(rest_cluster)
    line = adapter.check()
    version = adapter.rest.api.version
    release = slurm_cluster.run("sinfo", "--version").stdout.split()[-1]
    assert line.startswith(f"slurmrestd {version} on Slurm {release}: "), line
    # what the server serves, read here from its own OpenAPI document: the newest hpc-bridge also speaks
    request = urllib.request.Request(f"{rest_cluster.spec.slurm.rest_url}/openapi/v3", headers={
        "X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": slurm_cluster.token()})
    with urllib.request.urlopen(request, timeout=30) as answer:
        served = served_versions(json.loads(answer.read()))
    assert version == [v for v in VERSIONS if v in served][-1], (version, served)
    with capsys.disabled():
        print(f"\nslurmrestd on Slurm {release} serves {sorted(served)}; hpc-bridge speaks {version}")


@pytest.mark.parametrize("script", ["ntasks-alone.sbatch", "gpus-total-slurm-picks.sbatch", "threads-per-core.sbatch",
                                    "nodes-range.sbatch", "mem-per-gpu.sbatch"])
def test_a_converted_script_over_rest_is_the_job_sbatch_submits(script, rest_cluster, bridge_cluster, slurm_cluster,
                                                                 tmp_path) -> None:
    """A batch script converted to a TrainJob (hpcbridge convert --to trainjob) runs over slurmrestd as the
    same Slurm job as through sbatch: the node count Slurm picks, totals kept as totals, the same SLURM_*
    environment; an option slurmrestd has no field for is refused naming it."""
    from pathlib import Path

    from bridge import service
    from bridge.errors import InvalidSpec

    corpus = Path(__file__).parent / "sbatch_corpus"
    converted = subprocess.run([sys.executable, "-m", "bridge", "convert", str(corpus / script), "--to", "trainjob"],
                               capture_output=True, text=True, check=True).stdout
    document = yaml.safe_load(converted)
    document["metadata"].setdefault("annotations", {})["hpcbridge.io/workdir"] = str(tmp_path)
    document["spec"]["suspend"] = True
    seen = {}
    for cluster in (rest_cluster, bridge_cluster):
        document["metadata"]["uid"] = str(uuid.uuid4())  # two jobs of one TrainJob on one Slurm: two uids
        text = yaml.safe_dump(document)
        clusters = {cluster.name: cluster.model_copy(update={"spec": cluster.spec.model_copy(
            update={"defaults": ClusterDefaults()})})}  # the script's own partition: no cluster default
        try:
            prepared = service.prepare(service.read_input("-", stdin=text), cluster=cluster.name,
                                       configured=clusters)
        except InvalidSpec as refused:
            assert cluster is rest_cluster and "slurmrestd has no field for" in str(refused), refused
            return
        ref = service.submit(prepared).ref
        try:
            seen[cluster.name] = _fields(slurm_cluster, ref.job_id)
        finally:
            prepared.adapter.cancel(ref)
    assert seen["viarest"] == seen["testslurm"]
