"""Optional libraries come with pip extras; a missing one is one line naming the extra, exit 2, never retried.

The libraries are present in the test venv: each test hides one (``sys.modules[name] = None`` makes its import
fail) and drops the modules that imported it, so that the import runs again.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from bridge.errors import BridgeError
from bridge.extras import EXTRA_MODULES, MissingExtra, install_command, require

ROOT = Path(__file__).resolve().parents[2]

K8S_CLUSTER = """\
apiVersion: hpcbridge.io/v1alpha1
kind: BridgeCluster
metadata: {name: k8s}
spec:
  type: kubernetes
  kubernetes: {kubeconfig: /nonexistent/kubeconfig}
"""


def hide(monkeypatch: pytest.MonkeyPatch, *libraries: str, importers: tuple[str, ...] = ()) -> None:
    """Make *libraries* unimportable and forget *importers*, so that their next import meets the gap."""
    for name in libraries:
        monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
    for name in importers:
        if name in sys.modules:
            monkeypatch.delitem(sys.modules, name)


def test_missing_extra_is_one_typed_line_naming_the_extra_and_its_pip_command() -> None:
    error = MissingExtra("kubernetes", "the Kubernetes backend")
    assert str(error) == ("the Kubernetes backend needs the kubernetes extra: "
                          "pip install 'hpc-bridge[kubernetes]'")
    assert isinstance(error, BridgeError) and error.exit_code == 2 and not error.retryable
    assert error.extra == "kubernetes"
    assert install_command("staging") == "pip install 'hpc-bridge[staging]'"
    with pytest.raises(ValueError, match="no extra 'kube'"):
        MissingExtra("kube", "x")


def test_require_returns_the_module_or_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    assert require("yaml", "staging", "a test") is yaml
    hide(monkeypatch, "boto3")
    with pytest.raises(MissingExtra, match=r"^an s3:// test needs the staging extra: pip install "):
        require("boto3", "staging", "an s3:// test")


def test_every_extra_named_here_is_declared_in_pyproject() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # the others are the project's own tools (tests, documentation), never a feature's library
    assert set(EXTRA_MODULES) <= set(declared) and set(declared) - set(EXTRA_MODULES) <= {"all", "dev", "docs"}
    assert declared["all"] == [f"hpc-bridge[{','.join(EXTRA_MODULES)}]"]
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lean = {requirement.split(">")[0].split("<")[0].lower() for requirement in base}
    assert lean == {"pydantic", "pyyaml", "paramiko"}  # what a login node needs, nothing of an extra


def test_kubernetes_cluster_without_the_client_is_the_missing_extra_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.cli import main

    (tmp_path / "clusters.yaml").write_text(K8S_CLUSTER)
    monkeypatch.setenv("HPCBRIDGE_CONFIG", str(tmp_path / "clusters.yaml"))
    hide(monkeypatch, "kubernetes", "kubernetes.client", importers=("bridge.adapters.kubernetes.client",))
    code = main(["status", "default/some-job", "--cluster", "k8s"])
    err = capsys.readouterr().err
    assert (code, err) == (2, "hpcbridge: error: the Kubernetes backend needs the kubernetes extra: "
                              "pip install 'hpc-bridge[kubernetes]'\n")


def test_rendering_for_kubernetes_needs_no_client(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.cli import main

    hide(monkeypatch, "kubernetes", "kubernetes.client", importers=("bridge.adapters.kubernetes.client",))
    assert main(["render", str(ROOT / "examples" / "mpi-allreduce.yaml"), "--to", "kubernetes"]) == 0
    assert "kind: JobSet" in capsys.readouterr().out


def test_operator_without_kopf_is_the_missing_extra_line(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from bridge.cli import main

    hide(monkeypatch, "kopf", importers=("bridge.operator.main",))
    assert main(["operator"]) == 2
    assert capsys.readouterr().err == ("hpcbridge: error: the operator needs the operator extra: "
                                       "pip install 'hpc-bridge[operator]'\n")


def test_flux_python_transport_without_bindings_is_missing_extra_not_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bridge.adapters.flux.client import FluxPython

    hide(monkeypatch, "flux", "flux.job")
    with pytest.raises(MissingExtra) as caught:
        FluxPython(None)
    assert not caught.value.retryable  # an install to make, not a broker to wait for
    assert str(caught.value) == ("Flux's python transport needs the flux extra: pip install 'hpc-bridge[flux]' "
                                 "(flux-python of the broker's release), or use transport: cli")


@pytest.mark.parametrize(("uri", "library", "source"), [("s3://bucket/data", "boto3", "an s3:// source"),
                                                       ("hf://org/model", "huggingface_hub", "an hf:// source")])
def test_stage_step_without_the_staging_extra_says_which(monkeypatch: pytest.MonkeyPatch, uri: str, library: str,
                                                         source: str) -> None:
    from bridge.api.storage import parse_storage_uri
    from bridge.staging.sources import StageError, resolve

    hide(monkeypatch, library)
    with pytest.raises(StageError) as caught:
        resolve(parse_storage_uri(uri, "model"), "model", {})
    assert str(caught.value) == (f"{source} needs the staging extra where the stage step runs: "
                                 "pip install 'hpc-bridge[staging]'")
