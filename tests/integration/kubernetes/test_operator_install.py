"""Installing the operator as users install it, on a real API server: `kubectl apply --server-side -k` of
manifests/overlays and `helm install` of charts/hpc-bridge (kubectl and helm built from Go modules), the two
renderings compared object by object, and uninstall (`kubectl delete -k`, `helm uninstall`) removing what install
made (helm keeping the CRDs, and so every TrainJob, as docs/operator-install.md says).

Installing and deleting cluster-scoped CRDs would pull them from under the other modules' tests, so this module
has a control plane of its own (no nodes: the operator's pods are only scheduled, nothing here runs them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.harness import install_tools
from tests.harness.kube import KubeCluster, component, module_dir

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

ROOT = Path(__file__).resolve().parents[3]
STANDALONE = ROOT / "manifests" / "overlays" / "standalone"
BESIDE_TRAINER = ROOT / "manifests" / "overlays" / "beside-trainer"
CHART = ROOT / "charts" / "hpc-bridge"
TRAINER_CRDS = ("trainjobs.trainer.kubeflow.org", "trainingruntimes.trainer.kubeflow.org",
                "clustertrainingruntimes.trainer.kubeflow.org")


class Tools:
    """kubectl and helm against the module's cluster, each call's output returned when it exits 0."""

    def __init__(self, cluster: KubeCluster, home: Path) -> None:
        self.cluster, self.home, self.paths = cluster, home, install_tools.binaries()

    def _run(self, tool: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = install_tools.run([str(self.paths[tool]), *args], self.cluster.kubeconfig, self.home)
        if ok:
            assert done.returncode == 0, f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        return done

    def kubectl(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run("kubectl", *args, ok=ok)

    def helm(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run("helm", *args, ok=ok)

    def built(self, overlay: Path) -> list[dict]:
        """What `kubectl apply -k OVERLAY` applies (kubectl's own kustomize)."""
        return [doc for doc in yaml.safe_load_all(self.kubectl("kustomize", str(overlay)).stdout) if doc]

    def live(self, overlay: Path) -> set[tuple[str, str]]:
        """(kind, name) of each object of OVERLAY that the API server has (`kubectl get -k`)."""
        listed = json.loads(self.kubectl("get", "-k", str(overlay), "--ignore-not-found", "-o", "json").stdout
                            or '{"items": []}')
        return {(item["kind"], item["metadata"]["name"]) for item in listed["items"]}

    def established(self, *names: str) -> None:
        """Wait until each CRD is served (`kubectl wait` fails on a CRD the API server has not given a status yet)."""
        deadline = time.monotonic() + 60
        for name in names:
            while not any(c["type"] == "Established" and c["status"] == "True"
                          for c in ((self.crd(name) or {}).get("status") or {}).get("conditions") or []):
                assert time.monotonic() < deadline, f"CRD {name} not Established within 60s"
                time.sleep(0.2)

    def crd(self, name: str) -> dict | None:
        got = self.kubectl("get", "crd", name, "--ignore-not-found", "--show-managed-fields", "-o", "json")
        return json.loads(got.stdout) if got.stdout.strip() else None


@pytest.fixture(scope="module")
def tools() -> Iterator[Tools]:
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-install-"))
    cluster = KubeCluster(base / "cluster", nodes=0)
    try:
        cluster.start()
        yield Tools(cluster, base)
    finally:
        cluster.stop()
    shutil.rmtree(base, ignore_errors=True)


def _kinds_and_names(docs: list[dict]) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in docs}


def _by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def _managers(obj: dict) -> set[tuple[str, str]]:
    return {(entry["manager"], entry["operation"]) for entry in obj["metadata"].get("managedFields", [])}


def test_kubectl_apply_server_side_installs_the_standalone_overlay_and_delete_removes_it(tools: Tools) -> None:
    built = tools.built(STANDALONE)
    wanted = _kinds_and_names(built)
    assert {("Namespace", "hpcbridge-system"), ("Deployment", "hpcbridge-operator"),
            ("Service", "hpcbridge-operator-metrics"), ("ServiceAccount", "hpcbridge-operator"),
            ("ClusterRole", "hpcbridge-operator"), ("ClusterRole", "hpcbridge-operator-jobs"),
            ("ClusterRoleBinding", "hpcbridge-operator"), ("Role", "hpcbridge-operator-credentials"),
            ("RoleBinding", "hpcbridge-operator-credentials"), ("CustomResourceDefinition", TRAINER_CRDS[0]),
            ("CustomResourceDefinition", "bridgeclusters.hpcbridge.io")} <= wanted
    assert ("ClusterRoleBinding", "hpcbridge-operator-jobs") not in wanted  # bound per namespace only

    applied = tools.kubectl("apply", "--server-side", "-k", str(STANDALONE)).stdout
    assert "serverside-applied" in applied
    tools.established(*(name for kind, name in wanted if kind == "CustomResourceDefinition"))
    assert tools.live(STANDALONE) == wanted
    deployment = json.loads(tools.kubectl("-n", "hpcbridge-system", "get", "deployment", "hpcbridge-operator",
                                          "--show-managed-fields", "-o", "json").stdout)
    assert ("kubectl", "Apply") in _managers(deployment)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--metrics") + 1] == "0.0.0.0:9090"
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
    service = json.loads(tools.kubectl("-n", "hpcbridge-system", "get", "service", "hpcbridge-operator-metrics",
                                       "-o", "json").stdout)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # the Deployment controller made its ReplicaSet and pods (Pending: this cluster has no nodes)
    tools.kubectl("-n", "hpcbridge-system", "wait", "--for=create", "--timeout=60s", "pod",
                  "--selector=app.kubernetes.io/name=hpcbridge-operator")

    again = tools.kubectl("apply", "--server-side", "-k", str(STANDALONE)).stdout  # an upgrade re-applies
    assert "serverside-applied" in again

    tools.kubectl("delete", "-k", str(STANDALONE), "--timeout=120s")
    assert tools.live(STANDALONE) == set()


def test_helm_renders_what_the_standalone_overlay_applies(tools: Tools) -> None:
    """One install, two spellings: the chart's default rendering is the overlay's objects with the same RBAC
    rules, bindings, Deployment spec (the image tag aside) and metrics Service."""
    lint = tools.helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in lint.stdout, lint.stdout
    rendered = [doc for doc in yaml.safe_load_all(tools.helm(
        "template", "hpcbridge", str(CHART), "--namespace", "hpcbridge-system", "--include-crds").stdout) if doc]
    built = tools.built(STANDALONE)
    # the namespace is the release's: `helm install --create-namespace`
    assert _kinds_and_names(rendered) == _kinds_and_names(built) - {("Namespace", "hpcbridge-system")}
    for kind in ("ClusterRole", "Role"):
        ours, theirs = _by_kind(rendered, kind), _by_kind(built, kind)
        assert {name: role["rules"] for name, role in ours.items()} == \
            {name: role["rules"] for name, role in theirs.items()}
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        ours, theirs = _by_kind(rendered, kind), _by_kind(built, kind)
        assert {name: (b["roleRef"], b["subjects"]) for name, b in ours.items()} == \
            {name: (b["roleRef"], b["subjects"]) for name, b in theirs.items()}
    for name, crd in _by_kind(built, "CustomResourceDefinition").items():
        assert _by_kind(rendered, "CustomResourceDefinition")[name]["spec"] == crd["spec"]
    assert _by_kind(rendered, "Service")["hpcbridge-operator-metrics"]["spec"] == \
        _by_kind(built, "Service")["hpcbridge-operator-metrics"]["spec"]

    # the image too: the manifests name the project's version, the chart its appVersion (tests/unit/test_chart.py)
    ours, theirs = (_by_kind(docs, "Deployment")["hpcbridge-operator"]["spec"] for docs in (rendered, built))
    assert ours == theirs


def test_helm_install_and_uninstall_keep_the_crds_and_trainjobs(tools: Tools) -> None:
    release, namespace = "hpcbridge", "hpcbridge-helm"
    tools.kubectl("create", "namespace", "ml-team")  # TrainJobs' namespace, where jobNamespaces binds the jobs role
    tools.helm("install", release, str(CHART), "--namespace", namespace, "--create-namespace",
               "--set", "jobNamespaces={ml-team}")
    try:
        made = [doc for doc in yaml.safe_load_all(tools.helm("get", "manifest", release, "-n", namespace).stdout)
                if doc]
        for doc in made:
            where = ["-n", doc["metadata"]["namespace"]] if doc["metadata"].get("namespace") else []
            got = json.loads(tools.kubectl("get", doc["kind"], doc["metadata"]["name"], *where, "-o", "json").stdout)
            assert got["metadata"]["labels"]["app.kubernetes.io/instance"] == release
        assert ("RoleBinding", "hpcbridge-operator-jobs") in _kinds_and_names(made)  # in ml-team, from the values
        subjects = {json.dumps(doc["subjects"]) for doc in made if "subjects" in doc}
        assert subjects == {json.dumps([{"kind": "ServiceAccount", "name": "hpcbridge-operator",
                                         "namespace": namespace}])}
        tools.established(*TRAINER_CRDS, "bridgeclusters.hpcbridge.io")
        job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
               "metadata": {"name": "kept", "namespace": "ml-team", "annotations": {"hpcbridge.io/cluster": "hpc"}},
               "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "torch-distributed"},
                        "trainer": {"numNodes": 1, "command": ["true"]}}}
        job_file = tools.home / "trainjob.yaml"
        job_file.write_text(yaml.safe_dump(job))
        tools.kubectl("apply", "--server-side", "-f", str(job_file))
    finally:
        tools.helm("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "120s")
    for doc in made:
        where = ["-n", doc["metadata"]["namespace"]] if doc["metadata"].get("namespace") else []
        gone = tools.kubectl("get", doc["kind"], doc["metadata"]["name"], *where, "--ignore-not-found", "-o", "name")
        assert gone.stdout.strip() == "", f"{doc['kind']}/{doc['metadata']['name']} outlived helm uninstall"
    for name in (*TRAINER_CRDS, "bridgeclusters.hpcbridge.io"):  # helm never deletes crds/
        assert tools.crd(name) is not None, name
    assert tools.kubectl("-n", "ml-team", "get", "trainjob", "kept", "-o", "name").stdout.strip() == \
        "trainjob.trainer.kubeflow.org/kept"
    # a full removal deletes the CRDs by hand, and every TrainJob with them
    tools.kubectl("delete", "-f", str(CHART / "crds"), "--timeout=120s")
    assert tools.kubectl("get", "namespace", "ml-team", "-o", "name").stdout.strip()
    assert all(tools.crd(name) is None for name in TRAINER_CRDS)
    tools.kubectl("delete", "namespace", "ml-team", namespace, "--timeout=120s", "--ignore-not-found")


def test_beside_upstream_trainer_neither_install_touches_trainers_crds(tools: Tools) -> None:
    """Trainer v2.3's own CRDs, applied as its install applies them: the beside-trainer overlay, and the chart
    with --skip-crds, install around them, and uninstalling either leaves them as Trainer made them."""
    trainer_crds = module_dir(component("trainer")) / "manifests" / "base" / "crds"
    for path in sorted(trainer_crds.glob("trainer.kubeflow.org_*.yaml")):
        tools.kubectl("apply", "--server-side", "--field-manager=kubeflow-trainer", "-f", str(path))
    tools.established(*TRAINER_CRDS)
    before = {name: tools.crd(name) for name in TRAINER_CRDS}

    def untouched() -> None:
        for name, crd in before.items():
            now = tools.crd(name)
            assert now is not None, f"{name} was deleted"
            # any write (an apply, a patch, a co-owned field) would move the resourceVersion
            assert now["metadata"]["resourceVersion"] == crd["metadata"]["resourceVersion"], name
            assert _managers(now) == _managers(crd), name

    assert not {("CustomResourceDefinition", name) for name in TRAINER_CRDS} & _kinds_and_names(
        tools.built(BESIDE_TRAINER))
    tools.kubectl("apply", "--server-side", "-k", str(BESIDE_TRAINER))
    tools.established("bridgeclusters.hpcbridge.io")
    untouched()
    tools.kubectl("delete", "-k", str(BESIDE_TRAINER), "--timeout=120s")
    assert tools.live(BESIDE_TRAINER) == set()
    untouched()

    # helm 4 applies crds/ server-side: Trainer's own CRDs conflict, so the install is refused and changes nothing
    refused = tools.helm("install", "refused", str(CHART), "--namespace", "hpcbridge-system", "--create-namespace",
                         ok=False)
    assert refused.returncode != 0 and 'conflict with "kubeflow-trainer"' in refused.stderr, refused.stderr
    untouched()
    tools.helm("uninstall", "refused", "--namespace", "hpcbridge-system", ok=False)  # if it left a record
    # what docs/operator-install.md says to do beside Trainer: BridgeCluster's CRD by kubectl, then --skip-crds
    tools.kubectl("apply", "--server-side", "-f", str(CHART / "crds" / "hpcbridge.io_bridgeclusters.yaml"))
    tools.helm("install", "hpcbridge", str(CHART), "--namespace", "hpcbridge-system", "--create-namespace",
               "--skip-crds")
    assert tools.crd("bridgeclusters.hpcbridge.io") is not None
    untouched()
    tools.helm("uninstall", "hpcbridge", "--namespace", "hpcbridge-system", "--wait", "--timeout", "120s")
    untouched()


def test_the_servicemonitor_component_and_value_scrape_the_metrics_service(tools: Tools) -> None:
    """A kustomization of the user's own adding components/servicemonitor, and the chart's serviceMonitor.enabled,
    make the same ServiceMonitor, and it selects the metrics Service's port with the metrics token."""
    own = tools.home / "site" / "hpc-bridge"
    own.mkdir(parents=True)
    manifests = Path(os.path.relpath(ROOT / "manifests", own))  # kustomize takes relative paths only
    (own / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(manifests / "overlays" / "standalone")],
        "components": [str(manifests / "components" / "servicemonitor")]}))
    built = tools.built(own)
    monitor = _by_kind(built, "ServiceMonitor")["hpcbridge-operator"]
    service = _by_kind(built, "Service")["hpcbridge-operator-metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == \
        {"name": "hpcbridge-metrics-token", "key": "token"}
    assert ("ServiceMonitor", "hpcbridge-operator") not in _kinds_and_names(tools.built(STANDALONE))
    rendered = [doc for doc in yaml.safe_load_all(tools.helm(
        "template", "hpcbridge", str(CHART), "--namespace", "hpcbridge-system",
        "--set", "serviceMonitor.enabled=true").stdout) if doc]
    assert _by_kind(rendered, "ServiceMonitor")["hpcbridge-operator"]["spec"] == monitor["spec"]
    refused = tools.helm("template", "hpcbridge", str(CHART), "--set", "serviceMonitor.enabled=true",
                         "--set", "metrics.enabled=false", ok=False)
    assert refused.returncode != 0 and "serviceMonitor.enabled needs metrics.enabled" in refused.stderr
