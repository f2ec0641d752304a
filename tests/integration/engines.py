"""The real engines every backend-neutral integration test runs on: the ``engine`` fixture (registered in
conftest.py) gives one BridgeCluster per backend, each on its real daemon, and a fresh namespace or
state directory per test."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from bridge import service
from bridge.api.cluster import BridgeCluster
from tests.harness.polling import poll_until

RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "conformance"},
    "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
        "name": "node", "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 2,
                                           "containers": [{"name": "node", "image": "busybox:1.36"}]}}}}}]}}},
}
@dataclass
class Engine:
    name: str
    cluster: BridgeCluster
    namespace: str = "default"
    #: a backend job id that names no job
    unknown_id: str = "999999"
    workdir: str | None = None
    #: Kubernetes with real kubelets: pods run the command
    real: bool = False

    @property
    def kwok(self) -> bool:
        return self.cluster.spec.type == "kubernetes" and not self.real

    def prepare(self, name: str, command: list[str], kwok_job: dict | None = None,
                annotations: dict | None = None) -> service.Prepared:
        """A one-node TrainJob running *command* (on kwok, *kwok_job* patches the Job to fail or run on), with
        *annotations* besides the engine's own."""
        spec: dict = {"runtimeRef": {"name": "conformance"}, "trainer": {"command": command}}
        if kwok_job and self.kwok:
            spec["runtimePatches"] = [{"manager": "hpcbridge.io/tests", "trainingRuntimeSpec": {"template": {
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": kwok_job}}]}}}}]
        metadata: dict = {"name": name, "namespace": self.namespace, "uid": str(uuid.uuid4())}
        if self.workdir and not self.kwok:
            metadata["annotations"] = {"hpcbridge.io/workdir": self.workdir}
        if annotations:
            metadata["annotations"] = {**metadata.get("annotations", {}), **annotations}
        text = yaml.safe_dump_all([RUNTIME, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                             "metadata": metadata, "spec": spec}])
        source = service.read_input("-", stdin=text)
        return service.prepare(source, cluster=self.cluster.name, configured={self.cluster.name: self.cluster})


def pod_namespace(core, prefix: str) -> str:
    """A fresh namespace where pods can be created: once its default ServiceAccount exists, they are admitted."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": namespace}})
    for _ in range(600):
        if core.list_namespaced_service_account(namespace).items:
            break
        time.sleep(0.1)
    return namespace


def movable_runtime(shared, image: str, kind: str = "ClusterTrainingRuntime") -> dict:
    """A one-node runtime whose pods mount *shared* (a host directory) at the same path: a checkpoint directory
    that Slurm's and Flux's jobs on this machine and the pods see alike (hpcbridge migrate's tests)."""
    mount = {"name": "shared", "mountPath": str(shared)}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind, "metadata": {"name": "movable"},
            "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
                "name": "node", "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"backoffLimit": 0, "template": {"spec": {
                        "restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                        "containers": [{"name": "node", "image": image, "volumeMounts": [mount]}],
                        "volumes": [{"name": "shared", "hostPath": {"path": str(shared), "type": "Directory"}}]}}}}}]}}}}


def cluster_entry(name: str, spec: dict) -> BridgeCluster:
    return BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                         "metadata": {"name": name}, "spec": spec})


LAUNCH = [sys.executable, "-m", "bridge", "launch"]


@pytest.fixture(params=[
    pytest.param("local", marks=pytest.mark.local),
    pytest.param("slurm", marks=pytest.mark.slurm),
    pytest.param("slurm-rest", marks=pytest.mark.slurm),
    pytest.param("slurm-ssh", marks=pytest.mark.slurm),
    pytest.param("kubernetes", marks=pytest.mark.kubernetes),
    pytest.param("kubernetes-real", marks=pytest.mark.kubernetes),
    pytest.param("flux-cli", marks=pytest.mark.flux),
    pytest.param("flux-python", marks=pytest.mark.flux),
])
def engine(request, tmp_path, monkeypatch) -> Iterator[Engine]:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the layer's record, per test
    kind = request.param
    if kind == "local":
        yield Engine("local", cluster_entry("local", {"type": "local"}), unknown_id=str(uuid.uuid4()),
                     workdir=str(tmp_path))
    elif kind == "slurm":
        slurm = request.getfixturevalue("slurm_cluster")
        yield Engine("slurm", cluster_entry("conformance-slurm", {
            "type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm.conf)},
            "defaults": {"partition": "debug", "launchCommand": LAUNCH}}), workdir=str(tmp_path))
    elif kind == "slurm-rest":
        # slurmrestd with a JWT, in the newest API it and hpc-bridge both speak (printed by test_slurm_rest)
        slurm = request.getfixturevalue("slurm_cluster")
        url = slurm.rest_url or slurm.start_rest()
        token = tmp_path / "jwt"
        token.write_text(slurm.token())
        token.chmod(0o600)
        yield Engine("slurm-rest", cluster_entry("conformance-slurm-rest", {
            "type": "slurm", "slurm": {"transport": "rest", "restUrl": url, "user": "root", "tokenFile": str(token),
                                       "slurmConf": str(slurm.conf)},
            "defaults": {"partition": "debug", "launchCommand": LAUNCH}}), workdir=str(tmp_path))
    elif kind == "slurm-ssh":
        # the Slurm cluster across network-namespace hosts, its commands run over SSH on node-0 (host key checked)
        netns_slurm = request.getfixturevalue("netns_slurm")
        hosts = netns_slurm.hosts
        yield Engine("slurm-ssh", cluster_entry("conformance-slurm-ssh", {
            "type": "slurm", "slurm": {"transport": "ssh", "host": hosts.hosts[0].ip, "user": "root",
                                       "keyFile": str(hosts.client_key), "knownHostsFile": str(hosts.known_hosts),
                                       "slurmConf": str(netns_slurm.conf)},
            "defaults": {"partition": "debug", "launchCommand": LAUNCH}}), workdir=str(tmp_path))
    elif kind == "kubernetes":
        kube = request.getfixturevalue("kube_cluster")
        api = request.getfixturevalue("kube_api")
        from kubernetes import client

        namespace = f"conformance-{uuid.uuid4().hex[:8]}"
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        try:
            yield Engine("kubernetes", cluster_entry("conformance-k8s", {
                "type": "kubernetes", "kubernetes": {"kubeconfig": str(kube.kubeconfig), "namespace": namespace}}),
                namespace=namespace, unknown_id=f"{namespace}/no-such-jobset")
        finally:
            core.delete_namespace(namespace)
    elif kind == "kubernetes-real":
        real = request.getfixturevalue("real_kube")
        from kubernetes import client

        api = real.api_client()
        core = client.CoreV1Api(api)
        namespace = pod_namespace(core, "conformance")
        try:
            yield Engine("kubernetes-real", cluster_entry("conformance-k8s-real", {
                "type": "kubernetes", "kubernetes": {
                    "kubeconfig": str(real.kube.kubeconfig), "namespace": namespace, "imagePullPolicy": "Never",
                    "images": {"busybox:1.36": real.images["node"].ref}}}),
                namespace=namespace, unknown_id=f"{namespace}/no-such-jobset", real=True)
        finally:
            core.delete_namespace(namespace)
            api.close()
    else:
        uri = request.getfixturevalue("flux_uri")
        transport = kind.split("-", 1)[1]
        if transport == "python":
            pytest.importorskip("flux.job", reason="flux-python is not importable (add the built bindings to "
                                                   "PYTHONPATH)")
        import shutil

        yield Engine(kind, cluster_entry(f"conformance-{kind}", {
            "type": "flux", "flux": {"uri": uri, "transport": transport, "fluxCommand": shutil.which("flux")},
            "defaults": {"launchCommand": LAUNCH}}), unknown_id="ƒ2RyHVBf1", workdir=str(tmp_path))


def finished(adapter, ref, timeout: float = 180.0):
    return poll_until(adapter, ref, lambda s: s.state.finished, timeout=timeout, interval=0.2)


