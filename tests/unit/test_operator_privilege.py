"""Least privilege of the operator: its RBAC (manifests/operator) touches Secrets only by name, its metrics and
health listeners stay on loopback unless told otherwise and then ask for a bearer token, and no tenant-written
name becomes a metric label of its own."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from bridge.errors import InvalidSpec

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "manifests" / "operator"


# --- RBAC -------------------------------------------------------------------------------------------------------

def _rbac_documents() -> list[dict]:
    """Every RBAC object the operator's manifests hold: what kustomization.yaml installs, and the per-namespace
    binding an admin copies."""
    listed = yaml.safe_load((OPERATOR / "kustomization.yaml").read_text())["resources"]
    files = [OPERATOR / name for name in listed if not name.startswith("..")] + [OPERATOR / "namespace-binding.yaml"]
    docs = [doc for path in files for doc in yaml.safe_load_all(path.read_text()) if doc]
    return [doc for doc in docs if doc.get("apiVersion", "").startswith("rbac.authorization.k8s.io/")]


def _covers_secrets(rule: dict) -> bool:
    return bool({"", "*"} & set(rule.get("apiGroups") or [])) and bool({"secrets", "*"} & set(rule.get("resources")
                                                                                             or []))


def test_rbac_reads_and_writes_secrets_only_by_name_never_lists_or_watches_them_nor_anything_cluster_wide() -> None:
    docs = _rbac_documents()
    roles = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs if doc["kind"] in ("Role", "ClusterRole")}
    assert roles, "no RBAC found in manifests/operator"
    secret_rules = {key: [rule for rule in role.get("rules") or [] if _covers_secrets(rule)]
                    for key, role in roles.items()}
    for key, rules in secret_rules.items():
        for rule in rules:
            verbs = set(rule.get("verbs") or [])
            assert not verbs & {"list", "watch", "*", "deletecollection", "update"}, (key, rule)
            assert verbs <= {"get", "create", "patch", "delete"}, (key, rule)
            assert "*" not in rule["apiGroups"] and "*" not in rule["resources"], (key, rule)
    # nothing that covers Secrets is bound cluster-wide
    for doc in docs:
        if doc["kind"] == "ClusterRoleBinding":
            ref = doc["roleRef"]
            assert not secret_rules.get((ref["kind"], ref["name"])), f"{doc['metadata']['name']} binds Secrets " \
                                                                     f"cluster-wide through {ref['name']}"
    # the credentials in the operator's own namespace: get, by name, nothing else
    credentials = roles[("Role", "hpcbridge-operator-credentials")]
    assert credentials["metadata"]["namespace"] == "hpcbridge-system"
    assert [(r["verbs"], bool(r.get("resourceNames"))) for r in credentials["rules"]] == [(["get"], True)]
    # the JobSets' SSH Secrets in a served namespace: what the Kubernetes adapter does with them, no more
    jobs = secret_rules[("ClusterRole", "hpcbridge-operator-jobs")]
    assert [sorted(rule["verbs"]) for rule in jobs] == [["create", "delete", "get", "patch"]]
    assert not secret_rules[("ClusterRole", "hpcbridge-operator")]


def test_the_kubernetes_adapter_never_lists_secrets() -> None:
    """The RBAC above grants no list: the adapter's code must not need one."""
    calls = [path.relative_to(ROOT) for path in (ROOT / "bridge").rglob("*.py")
             if "list_namespaced_secret" in path.read_text() or "list_secret_for_all_namespaces" in path.read_text()]
    assert not calls, calls


class _Forbidden(Exception):
    pass


class FakeCore:
    """The Secret and ConfigMap calls ``KubernetesAdapter.remove`` may make, RBAC-checked like the served
    namespace's Role: listing Secrets is refused."""

    def __init__(self, secrets: dict[str, dict]) -> None:
        self.secrets = secrets
        self.deleted: list[tuple[str, str | None]] = []

    def list_namespaced_secret(self, *args, **kwargs):
        raise _Forbidden("secrets is forbidden: cannot list resource")

    def read_namespaced_secret(self, name, namespace):
        from kubernetes.client.exceptions import ApiException

        if name not in self.secrets:
            raise ApiException(status=404, reason="Not Found")
        found = self.secrets[name]
        return SimpleNamespace(metadata=SimpleNamespace(name=name, uid=found["uid"], labels=found["labels"]))

    def delete_namespaced_secret(self, name, namespace, body=None):
        self.deleted.append((name, body.preconditions.uid if body and body.preconditions else None))
        del self.secrets[name]

    def list_namespaced_config_map(self, namespace, label_selector=None):
        return SimpleNamespace(items=[])


class FakeCustom:
    def delete_namespaced_custom_object(self, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=404, reason="Not Found")

    get_namespaced_custom_object = delete_namespaced_custom_object


def _adapter(core: FakeCore):
    from bridge.adapters.kubernetes import KubernetesAdapter
    from tests.builders import cluster

    adapter = KubernetesAdapter(cluster("kubernetes", "pods"))
    adapter._core = lambda: core  # type: ignore[method-assign]
    adapter._custom = lambda: FakeCustom()  # type: ignore[method-assign]
    return adapter


def test_remove_deletes_the_jobsets_ssh_secret_by_name_and_only_its_own() -> None:
    from bridge.adapters.base import JobRef
    from bridge.adapters.kubernetes.render import ssh_secret_name
    from bridge.annotations import UID_LABEL

    name = ssh_secret_name("train", "u-1")
    core = FakeCore({name: {"uid": "s-1", "labels": {UID_LABEL: "u-1"}}})
    _adapter(core).remove(JobRef("pods", "kubernetes", "ml/train", "u-1", "train"))
    assert core.deleted == [(name, "s-1")]  # conditional on the Secret it read
    # a Secret of that name made for another TrainJob stays
    core = FakeCore({name: {"uid": "s-2", "labels": {UID_LABEL: "u-2"}}})
    _adapter(core).remove(JobRef("pods", "kubernetes", "ml/train", "u-1", "train"))
    assert core.deleted == [] and name in core.secrets
    # none left (the JobSet owned it and took it along): nothing to do
    core = FakeCore({})
    _adapter(core).remove(JobRef("pods", "kubernetes", "ml/train", "u-1", "train"))
    assert core.deleted == []


# --- listeners --------------------------------------------------------------------------------------------------

def test_listeners_default_to_loopback() -> None:
    from bridge.operator.main import listen_address, liveness_endpoint

    assert listen_address("9090", "--metrics") == ("127.0.0.1", 9090)
    assert listen_address(":9090", "--metrics") == ("127.0.0.1", 9090)
    assert listen_address("[::1]:9090", "--metrics") == ("::1", 9090)
    assert listen_address("0.0.0.0:9090", "--metrics") == ("0.0.0.0", 9090)
    assert liveness_endpoint("8080") == "http://127.0.0.1:8080/healthz"
    assert liveness_endpoint("http://0.0.0.0:8080/healthz") == "http://0.0.0.0:8080/healthz"  # explicit: as given
    for bad in ("0.0.0.0:http", "1.2.3.4:0", "host:70000", ""):
        with pytest.raises(InvalidSpec, match="--metrics"):
            listen_address(bad, "--metrics")


def test_metrics_beyond_loopback_without_a_token_are_refused_before_anything_listens(tmp_path) -> None:
    from bridge.operator.main import serve_metrics
    from bridge.operator.metrics import Metrics

    for address in ("0.0.0.0:9", "[::]:9", "10.1.2.3:9", "metrics.example:9"):
        with pytest.raises(InvalidSpec, match="beyond loopback") as refused:
            serve_metrics(Metrics(), address)
        assert refused.value.field == "--metrics" and address in str(refused.value)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(InvalidSpec, match="--metrics-token-file.*empty"):
        serve_metrics(Metrics(), "0.0.0.0:9", str(empty))
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    with pytest.raises(InvalidSpec, match="--metrics-token-file.*cannot be read"):
        serve_metrics(Metrics(), "0.0.0.0:9", str(unreadable))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_with_a_token_file_answer_only_the_bearer_of_the_current_token(tmp_path) -> None:
    from bridge.operator.main import serve_metrics
    from bridge.operator.metrics import Metrics

    token = tmp_path / "token"
    token.write_text("first-token\n")
    metrics = Metrics(clusters=lambda: {"hpc"})
    metrics.submission("hpc", "submitted")
    port = _free_port()
    server = serve_metrics(metrics, f"127.0.0.1:{port}", str(token))
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert _get(url) == (401, "")
        assert _get(url, "first-toke") == (401, "")
        assert _get(url, "first-token-and-more") == (401, "")
        status, body = _get(url, "first-token")
        assert status == 200 and 'hpcbridge_submissions_total{cluster="hpc",result="submitted"} 1' in body
        token.write_text("second-token")  # a rotated Secret: the next scrape needs the new token
        assert _get(url, "first-token")[0] == 401 and _get(url, "second-token")[0] == 200
        token.unlink()  # unreadable: closed, not open
        assert _get(url, "second-token")[0] == 401
        assert _get(f"http://127.0.0.1:{port}/healthz", "second-token")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_whose_token_file_does_not_exist_yet_refuse_every_scrape_until_it_does(tmp_path) -> None:
    """The Deployments mount the token's Secret as optional: the operator starts before it is created, closed."""
    from bridge.operator.main import serve_metrics
    from bridge.operator.metrics import Metrics

    token = tmp_path / "token"
    port = _free_port()
    server = serve_metrics(Metrics(), f"127.0.0.1:{port}", str(token))
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert _get(url)[0] == 401 and _get(url, "anything")[0] == 401
        token.write_text("created-later")
        assert _get(url, "created-later")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_on_loopback_without_a_token_are_served(tmp_path) -> None:
    from bridge.operator.main import serve_metrics
    from bridge.operator.metrics import Metrics

    port = _free_port()
    server = serve_metrics(Metrics(), str(port))
    try:
        assert server.server_address[0] == "127.0.0.1"
        status, body = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and "# TYPE hpcbridge_submissions_total counter" in body
    finally:
        server.shutdown()
        server.server_close()


def test_the_operator_deployment_serves_metrics_on_loopback_only() -> None:
    deployment = yaml.safe_load((OPERATOR / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--metrics") + 1].startswith("127.0.0.1:")
    assert all(port["name"] != "metrics" for port in container.get("ports", []))


# --- metric labels ----------------------------------------------------------------------------------------------

def test_a_thousand_made_up_cluster_names_make_a_bounded_number_of_series() -> None:
    from bridge.operator.metrics import Metrics

    metrics = Metrics(clusters=lambda: {"hpc", "pods"})
    for number in range(1000):
        garbage = f"tenant-made-{number}\n\"}}x"
        metrics.submission(garbage, "refused")
        metrics.submission(garbage, "unavailable")
        metrics.backend_error(garbage)
    metrics.submission("hpc", "refused")  # a configured cluster keeps its name
    metrics.submission("none", "refused")
    text = metrics.render()
    series = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(series) <= 8, series
    assert 'hpcbridge_submissions_total{cluster="other",result="refused"} 1000' in text
    assert 'hpcbridge_submissions_total{cluster="hpc",result="refused"} 1' in text
    assert 'hpcbridge_backend_errors_total{cluster="other"} 1000' in text
    assert "tenant-made" not in text
    assert len(metrics.submissions) + len(metrics.backend_errors) <= 5  # nothing kept per made-up name either


def test_the_reconciler_counts_a_trainjob_naming_no_configured_cluster_as_other() -> None:
    """The operator as it runs: a refused TrainJob's own annotation is not a label; no caller passes a set."""
    from bridge.operator.reconciler import Permanent, Reconciler

    class Api:
        def clusters(self):
            return {}

        def runtime(self, namespace, kind, name):
            return None

        def namespace_labels(self, namespace):
            return {}

        def write_conditions(self, *args) -> None:
            pass

        def event(self, *args, **kwargs) -> None:
            pass

    reconciler = Reconciler(Api())
    for number in range(50):
        body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": f"j{number}", "namespace": "tenant", "uid": f"u{number}",
                             "annotations": {"hpcbridge.io/cluster": f"made-up-{number}"}},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "managedBy": "hpcbridge.io/bridge"}}
        with pytest.raises(Permanent):
            reconciler.run(body)
    text = reconciler.metrics.render()
    assert "made-up" not in text
    assert 'hpcbridge_submissions_total{cluster="other",result="refused"} 50' in text
