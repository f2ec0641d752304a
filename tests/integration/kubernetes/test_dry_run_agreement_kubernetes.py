"""``--dry-run`` is the first half of ``submit`` on Kubernetes too: on the real control plane (kwok nodes, the
JobSet controller and its webhooks), a dry run creates every object submit then really creates with
``dryRun=All``, and the two exit with the same code, notes and error line; the artifact the dry run printed is
the one submit handed the adapter. The cases are a representative subset of the corpus the local agreement
test runs (tests/integration/test_dry_run_agreement.py), plus what only the API server can refuse: a target
namespace that does not exist, a JobSet name another TrainJob holds. Each case has a namespace of its own,
deleted (with all submit created) when it ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.adapters.base import Artifact
from bridge.adapters.kubernetes import GROUP, PLURAL, VERSION, KubernetesAdapter
from bridge.annotations import UID_LABEL
from tests import builders
from tests.integration.test_dry_run_agreement import ROOT, configured, recording, run_cli, sent_text

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

#: every example; the golden cases and Training Operator v1 jobs; every third TrainJob of the fidelity corpus
FILES = sorted([*ROOT.glob("examples/*.yaml"), *ROOT.glob("examples/*.sbatch"), *ROOT.glob("tests/cases/*.yaml"),
                *ROOT.glob("tests/cases/v1/*.yaml"),
                *sorted(ROOT.glob("tests/integration/kubernetes/trainjob_corpus/*.yaml"))[::3]])
COUNTED: dict[str, int] = {"agreed": 0, "refused": 0}


@pytest.fixture
def sent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kube_cluster, namespace: str) -> list[Artifact]:
    """Clusters ``k8s`` (this test's namespace) and ``k8s-nowhere`` (a namespace that does not exist); the
    artifacts KubernetesAdapter.submit is handed."""
    from bridge.api.loader import to_yaml

    clusters = [builders.cluster("kubernetes", name, kubernetes={"kubeconfig": str(kube_cluster.kubeconfig),
                                                                 "namespace": target})
                for name, target in (("k8s", namespace), ("k8s-nowhere", f"{namespace}-nowhere"))]
    configured(monkeypatch, tmp_path, to_yaml(clusters), tmp_path)
    return recording(monkeypatch, KubernetesAdapter)[0]


def _agree(file: str, sent: list[Artifact], cluster: str = "k8s") -> tuple[int, list[str]]:
    dry = run_cli(["submit", file, "--cluster", cluster, "--dry-run"])
    real = run_cli(["submit", file, "--cluster", cluster])
    assert (real.code, real.errors) == (dry.code, dry.errors), (dry, real)
    if dry.code:
        COUNTED["refused"] += 1
        assert real.err == dry.err, (dry.err, real.err)
        return dry.code, dry.errors
    COUNTED["agreed"] += 1
    assert real.err.startswith(dry.err), (dry.err, real.err)
    assert sent, "submit exited 0 and sent nothing"
    assert sent_text(sent, dry.out, fresh_uids=False) == dry.out
    return 0, []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dry_run_and_submit_agree_on_kubernetes(path: Path, sent: list[Artifact]) -> None:
    _agree(str(path), sent)


def test_a_namespace_that_does_not_exist_refuses_both(sent: list[Artifact]) -> None:
    code, errors = _agree(str(ROOT / "examples" / "torch-ddp.yaml"), sent, cluster="k8s-nowhere")
    assert code == 1 and "HTTP 404" in errors[0] and "not found" in errors[0], errors


def test_a_jobset_name_another_trainjob_holds_refuses_both(sent: list[Artifact], kube_api, namespace: str,
                                                          tmp_path: Path) -> None:
    """A dry run of a name that is taken reads who holds it, as submit does."""
    from kubernetes import client

    path = tmp_path / "taken.yaml"
    path.write_text((ROOT / "examples" / "torch-ddp.yaml").read_text())
    dry = run_cli(["submit", str(path), "--cluster", "k8s", "--dry-run"])
    assert dry.code == 0, dry
    import yaml

    jobset = next(doc for doc in yaml.safe_load_all(dry.out) if doc and doc.get("kind") == "JobSet")
    jobset["metadata"]["labels"][UID_LABEL] = "someone-else"
    jobset["metadata"]["namespace"] = namespace
    client.CustomObjectsApi(kube_api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, jobset)
    code, errors = _agree(str(path), sent)
    assert code == 1 and "belongs to another TrainJob" in errors[0], errors


def test_the_kubernetes_cases_are_counted() -> None:
    """The count in the report (printed with -s)."""
    print(f"\nkubernetes dry-run agreement: {len(FILES)} corpus files + 2 API-server refusals; "
          f"{COUNTED['agreed']} ran, {COUNTED['refused']} refused alike")
    assert len(FILES) >= 20
