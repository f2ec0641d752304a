"""The Helm chart (charts/hpc-bridge) and the kustomize overlays (manifests/overlays) stay one install: the chart's
CRDs and RBAC rules are generated from manifests/ (scripts/gen-chart.py), its version is the project's, and the
metrics component patches the Deployment's args where they are. Rendering both and comparing them on a real API
server: tests/integration/kubernetes/test_operator_install.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

import bridge

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hpc-bridge"


def _gen_chart():
    spec = importlib.util.spec_from_file_location("gen_chart", ROOT / "scripts" / "gen-chart.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_charts_crds_and_rbac_are_generated_from_manifests() -> None:
    stale = _gen_chart().stale()
    assert not stale, f"{[str(p.relative_to(ROOT)) for p in stale]} drifted: run scripts/gen-chart.py"


def test_the_chart_carries_every_role_of_the_operators_kustomization() -> None:
    rbac = yaml.safe_load((CHART / "files" / "rbac.yaml").read_text())
    assert {"hpcbridge-operator", "hpcbridge-operator-jobs"} <= set(rbac["clusterRoles"])
    assert rbac["clusterRoles"]["hpcbridge-operator"]["bindings"] == [
        {"kind": "ClusterRoleBinding", "name": "hpcbridge-operator"}]
    # the jobs role is bound per namespace (values.jobNamespaces), never cluster-wide
    assert rbac["clusterRoles"]["hpcbridge-operator-jobs"]["bindings"] == []
    assert rbac["roles"]["hpcbridge-operator-credentials"]["bindings"] == [
        {"kind": "RoleBinding", "name": "hpcbridge-operator-credentials"}]


def test_the_charts_version_and_default_image_tag_are_the_projects() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == bridge.__version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == ""  # the template's default is .Chart.AppVersion
    assert "default .Chart.AppVersion" in (CHART / "templates" / "deployment.yaml").read_text()


def test_the_metrics_component_tests_the_args_it_replaces() -> None:
    """components/metrics replaces the Deployment's --metrics address by index: the index must still be it."""
    component = yaml.safe_load((ROOT / "manifests" / "components" / "metrics" / "kustomization.yaml").read_text())
    ops = yaml.safe_load(component["patches"][0]["patch"])
    tested = next(op for op in ops if op["op"] == "test")
    replaced = next(op for op in ops if op["op"] == "replace")
    deployment = yaml.safe_load((ROOT / "manifests" / "operator" / "deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    index = int(tested["path"].rsplit("/", 1)[1])
    assert args[index] == tested["value"] == "--metrics"
    assert replaced["path"].endswith(f"/args/{index + 1}") and args[index + 1].startswith("127.0.0.1:")


def test_every_overlay_and_component_names_paths_that_exist() -> None:
    for path in [*(ROOT / "manifests" / "overlays").glob("*/kustomization.yaml"),
                 *(ROOT / "manifests" / "components").glob("*/kustomization.yaml")]:
        kustomization = yaml.safe_load(path.read_text())
        for entry in [*kustomization.get("resources", []), *kustomization.get("components", [])]:
            assert (path.parent / entry).exists(), f"{path.relative_to(ROOT)} names {entry}, which is missing"
