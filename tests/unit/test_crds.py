"""The committed CRDs are exactly what the models generate (run scripts/gen-crds.py after a model change)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def generated() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("gen_crds", ROOT / "scripts" / "gen-crds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()


def test_committed_crds_match_the_models() -> None:
    for name, text in generated().items():
        path = ROOT / "manifests" / "crds" / name
        assert path.exists() and path.read_text() == text, f"{name} drifted: run scripts/gen-crds.py"


def test_crds_are_structural() -> None:
    def walk(node, where):
        if not isinstance(node, dict):
            return
        assert "$ref" not in node and "anyOf" not in node or node.get("x-kubernetes-int-or-string"), where
        assert node.get("additionalProperties") is not False, where
        if "properties" in node:
            assert node.get("type") == "object", where
        for key, child in node.get("properties", {}).items():
            walk(child, f"{where}.{key}")
        walk(node.get("items"), f"{where}[]")

    for name, text in generated().items():
        crd = yaml.safe_load(text)
        walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], name)


def test_integer_bounds_are_ones_the_api_server_can_read() -> None:
    # it reads schema bounds as float64: 2**63-1 becomes 2**63, no int64, and every value of the field is
    # refused ("Maximum boundary value must be of type integer"); such fields say format int64 instead
    def walk(node, where):
        if isinstance(node, dict):
            for bound in ("maximum", "minimum"):
                if bound in node:
                    assert abs(node[bound]) <= 2**53, f"{where}.{bound} = {node[bound]}"
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}[{index}]")

    for path in sorted((ROOT / "manifests" / "crds").glob("*_*.yaml")):  # not kustomization.yaml
        walk(yaml.safe_load(path.read_text()), path.name)


def test_the_crds_kustomization_lists_every_generated_crd() -> None:
    listed = yaml.safe_load((ROOT / "manifests" / "crds" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(generated())
