"""The operator image the manifests name is the one the project's recipe builds (tests/harness/operator_image.py):
its repository, and the project's version as its tag."""

from __future__ import annotations

from pathlib import Path

import yaml

from bridge import __version__
from tests.harness import operator_image

ROOT = Path(__file__).resolve().parents[2]


def test_the_deployment_names_the_image_the_recipe_builds_tagged_with_the_version() -> None:
    deployment = yaml.safe_load((ROOT / "manifests" / "operator" / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == operator_image.image_ref() == f"ghcr.io/hpc-bridge/operator:{__version__}"
    assert container["imagePullPolicy"] == "IfNotPresent"


def test_the_image_runs_as_the_user_the_deployment_asks_for() -> None:
    deployment = yaml.safe_load((ROOT / "manifests" / "operator" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == operator_image.UID
    assert operator_image.RUN_CONFIG["User"] == f"{operator_image.UID}:{operator_image.UID}"


def test_a_change_to_the_package_is_a_new_image_and_the_base_stays(monkeypatch) -> None:
    base, app = operator_image.base_key(), operator_image.app_key()
    monkeypatch.setattr(operator_image, "tree_hash", lambda *roots: b"another checkout")
    assert operator_image.base_key() == base and operator_image.app_key() != app
