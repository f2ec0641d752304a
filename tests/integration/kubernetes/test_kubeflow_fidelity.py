"""Kubeflow fidelity, with the real Kubeflow Trainer v2.3 controller as the oracle (tests/harness/trainer_oracle.py).

A control plane of its own (Trainer's CRDs and webhooks apply to every TrainJob on a cluster) runs the upstream
trainer-controller-manager, built from its Go module. Every TrainJob of ``trainjob_corpus/`` is applied there, and
the JobSet the controller makes is compared, after the same API server defaulting, with the one
``hpcbridge render --to kubernetes`` makes from the same file and Trainer's own runtimes folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness.kube import KubeCluster
from tests.harness.trainer_oracle import GROUP, JOBSET, PERMISSIVE_POD_POLICY, VERSION, Oracle, compare

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

CORPUS = sorted((Path(__file__).parent / "trainjob_corpus").glob("*.yaml"))
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def trainer_cluster() -> Iterator[tuple[KubeCluster, Path]]:
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-trainer-"))
    cluster = KubeCluster(base)
    try:
        cluster.start()
        src = cluster.start_trainer()
        yield cluster, src
    finally:
        cluster.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def oracle(trainer_cluster) -> Oracle:
    cluster, src = trainer_cluster
    oracle = Oracle(cluster, src)
    oracle.apply_shipped_runtimes()
    return oracle


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 30


def test_every_trainjob_renders_to_the_jobset_kubeflow_makes(oracle: Oracle, capsys) -> None:
    outcomes = [oracle.check(path) for path in CORPUS]
    identical = sum(o.verdict == "identical" for o in outcomes)
    lines = [f"Kubeflow fidelity: {identical}/{len(outcomes)} TrainJobs render to the JobSet Kubeflow Trainer "
             "v2.3 makes (up to the listed differences)"]
    for outcome in outcomes:
        if outcome.verdict != "identical":
            lines.append(f"  {outcome.name}: {outcome.verdict}")
            lines.extend(f"    {d}" for d in outcome.differences)
    summary = "\n".join(lines)
    with capsys.disabled():
        sys.stdout.write(f"\n{summary}\n")
    assert identical == len(outcomes), summary


def test_the_comparison_can_fail() -> None:
    jobset = {"metadata": {"labels": {"team": "a"}}, "spec": {"replicatedJobs": [{"name": "node", "template": {
        "spec": {"template": {"spec": {"containers": [{"name": "node", "env": [{"name": "A", "value": "1"}]}]}}}}}]}}
    changed = json.loads(json.dumps(jobset))
    changed["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "2"
    changed["metadata"]["labels"]["hpcbridge.io/uid"] = "x"  # a listed difference: not reported
    problems = compare(jobset, changed)
    assert problems == ['spec.replicatedJobs[node].template.spec.template.spec.containers[node].env[A].value: "1" '
                        'from Kubeflow, "2" from hpc-bridge']


def _kubeflow_refusal(oracle: Oracle, example: Path) -> str | None:
    """What Trainer's webhook says when it refuses the example's TrainJob; None when it takes it."""
    from kubernetes.client.exceptions import ApiException

    try:
        oracle.kubeflow_jobset(example)
    except ApiException as exc:
        if 400 <= exc.status < 500:
            return exc.body or str(exc)
        raise
    return None


def test_trainers_own_runtimes_folder_and_examples_work_as_they_are(trainer_cluster, oracle: Oracle,
                                                                     tmp_path) -> None:
    _, src = trainer_cluster
    runtimes = src / "manifests" / "base" / "runtimes"
    assert (runtimes / "kustomization.yaml").exists() and (runtimes / "torchtune").is_dir()
    volcano = tmp_path / "volcano-cluster.yaml"
    volcano.write_text(yaml.safe_dump({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                       "metadata": {"name": "with-volcano"},
                                       "spec": {"type": "kubernetes", "kubernetes": {"gangScheduler": "volcano"}}}))
    permissive = tmp_path / "permissive-cluster.yaml"
    permissive.write_text(yaml.safe_dump({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                          "metadata": {"name": "kubeflow-like"},
                                          "spec": {"type": "kubernetes",
                                                   "kubernetes": {"podPolicy": PERMISSIVE_POD_POLICY}}}))
    for example in sorted((src / "examples" / "yaml").glob("*.yaml")):
        result = subprocess.run([sys.executable, "-m", "bridge", "render", str(example), "--to", "kubernetes",
                                 "--runtimes", str(runtimes)], capture_output=True, text=True, cwd=ROOT)
        if "initializer:" in example.read_text(encoding="utf-8"):
            # an initializer on a runtime whose initializer job lacks the `initializer` volume: refused by both
            # (Trainer v2.3's own 05-multi-step.yaml is one), the real webhook as the oracle
            refusal = _kubeflow_refusal(oracle, example)
            if refusal is not None:
                assert "must have volumeMount with name - initializer" in refusal, refusal
                assert result.returncode == 2 and "'initializer' volume" in result.stderr, result.stderr
                continue
        if "volcano" in example.name:
            # a gang policy the cluster cannot honour is refused, naming the field and the cluster
            assert result.returncode == 2 and "spec.podGroupPolicy.volcano" in result.stderr, result.stderr
            result = subprocess.run([sys.executable, "-m", "bridge", "render", str(example), "--cluster",
                                     "with-volcano", "--runtimes", str(runtimes)], capture_output=True, text=True,
                                    cwd=ROOT, env={**os.environ, "HPCBRIDGE_CONFIG": str(volcano)})
            assert "kind: PodGroup" in result.stdout and "schedulerName: volcano" in result.stdout, result.stderr
        if result.returncode == 2 and "spec.kubernetes.podPolicy" in result.stderr:
            # a pod field the default pod policy forbids (02-runtime-patches' serviceAccountName) is refused
            # naming it; a cluster whose policy allows it renders it
            assert "serviceAccountName" in result.stderr, (example.name, result.stderr)
            result = subprocess.run([sys.executable, "-m", "bridge", "render", str(example), "--cluster",
                                     "kubeflow-like", "--runtimes", str(runtimes)], capture_output=True, text=True,
                                    cwd=ROOT, env={**os.environ, "HPCBRIDGE_CONFIG": str(permissive)})
        assert result.returncode == 0, (example.name, result.stderr)
        assert not result.stderr, (example.name, result.stderr)  # nothing left unhonoured
        # elsewhere each Kubernetes-only field is one note, never silent
        slurm = subprocess.run([sys.executable, "-m", "bridge", "render", str(example), "--to", "slurm",
                                "--runtimes", str(runtimes)], capture_output=True, text=True, cwd=ROOT)
        assert slurm.returncode in (0, 2), slurm.stderr
        assert all(line.startswith(("hpcbridge: note: ", "hpcbridge: error: ")) for line in slurm.stderr.splitlines())
    patched = subprocess.run([sys.executable, "-m", "bridge", "render", str(src / "examples/yaml/02-runtime-patches.yaml"),
                              "--to", "flux", "--runtimes", str(runtimes)], capture_output=True, text=True, cwd=ROOT)
    notes = [line for line in patched.stderr.splitlines() if line.startswith("hpcbridge: note: ")]
    assert any("nodeSelector" in n for n in notes) and any("tolerations" in n for n in notes), patched.stderr
    assert any("serviceAccountName" in n for n in notes), patched.stderr


def test_trainer_reconciles_only_trainjobs_it_manages(trainer_cluster, oracle: Oracle) -> None:
    """Upstream's half of coexistence: a TrainJob whose managedBy is another controller's gets no JobSet from
    Trainer. (Its CRD admits only its own value and MultiKueue's: ``hpcbridge.io/bridge`` needs the rule widened,
    which the README's operator section says; the operator is issue #16.)"""
    from kubernetes.client.exceptions import ApiException

    job = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": "not-trainers"},
           "spec": {"runtimeRef": {"name": "torch-distributed"}, "managedBy": "kueue.x-k8s.io/multikueue",
                    "trainer": {"command": ["torchrun", "train.py"]}}}
    oracle.custom.create_namespaced_custom_object(GROUP, VERSION, oracle.kf_ns, "trainjobs", job)
    ours = {**job, "metadata": {"name": "bridges"}, "spec": {**job["spec"], "managedBy": "hpcbridge.io/bridge"}}
    with pytest.raises(ApiException) as excinfo:
        oracle.custom.create_namespaced_custom_object(GROUP, VERSION, oracle.kf_ns, "trainjobs", ours)
    assert excinfo.value.status == 422 and "ManagedBy must be" in excinfo.value.body
    # a TrainJob Trainer does manage gets its JobSet meanwhile; the other one never does
    theirs = {**job, "metadata": {"name": "trainers"}, "spec": {k: v for k, v in job["spec"].items() if k != "managedBy"}}
    oracle.custom.create_namespaced_custom_object(GROUP, VERSION, oracle.kf_ns, "trainjobs", theirs)
    deadline = time.monotonic() + 30
    while True:
        try:
            oracle.custom.get_namespaced_custom_object(*JOBSET[:2], oracle.kf_ns, JOBSET[2], "trainers")
            break
        except ApiException:
            assert time.monotonic() < deadline, "Trainer made no JobSet for its own TrainJob"
            time.sleep(0.2)
    with pytest.raises(ApiException) as missing:
        oracle.custom.get_namespaced_custom_object(*JOBSET[:2], oracle.kf_ns, JOBSET[2], "not-trainers")
    assert missing.value.status == 404
    status = oracle.custom.get_namespaced_custom_object(GROUP, VERSION, oracle.kf_ns, "trainjobs", "not-trainers")
    assert not status.get("status"), yaml.safe_dump(status)


def test_beside_upstream_trainer_a_trainjob_for_hpc_bridge_is_admitted_and_left_alone(trainer_cluster, oracle) -> None:
    """manifests/upstream-trainer: Trainer's own TrainJob CRD, widened by managed-by.json as the overlay says
    (`kubectl patch --type=json`), admits hpc-bridge's managedBy; Trainer's webhook admits the TrainJob and its
    controller makes no JobSet for it (it is hpc-bridge's to run)."""
    import uuid

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    cluster, _ = trainer_cluster
    api = cluster.api_client()
    ext, custom = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    namespace = f"beside-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "ours", "annotations": {"hpcbridge.io/cluster": "hpc"}},
           "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "torch-distributed"},
                    "trainer": {"numNodes": 1, "command": ["true"]}}}
    try:
        with pytest.raises(ApiException) as refused:  # as Trainer ships it
            custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", job)
        assert refused.value.status == 422 and "managedBy" in refused.value.body
        patch = json.loads((ROOT / "manifests" / "upstream-trainer" / "managed-by.json").read_text())
        ext.patch_custom_resource_definition("trainjobs.trainer.kubeflow.org", patch,
                                             _content_type="application/json-patch+json")
        deadline = time.monotonic() + 30
        while True:  # the API server takes the new rule a moment after the CRD changes
            try:
                custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs",
                                                       job)
                break
            except ApiException as exc:
                assert exc.status == 422 and time.monotonic() < deadline, exc.body
                time.sleep(0.2)
        time.sleep(3)  # Trainer's controller has seen it by now
        jobsets = custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")
        assert jobsets["items"] == []
        got = custom.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", "ours")
        assert not (got.get("status") or {}).get("conditions"), got.get("status")
    finally:
        core.delete_namespace(namespace)
        api.close()
