"""The tools a user installs hpc-bridge's operator with, built from Go modules like the control plane
(tests/harness/kube.py) and cached by version under ``~/.cache/hpcbridge/``: kubectl (``apply --server-side -k``,
``delete -k``) and helm (``template``, ``lint``, ``install``, ``uninstall``). Both wrappers resolve the same
k8s.io modules, so the second build reuses most of the first's compiled packages."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.harness.kube import BUILD_ROOT, Component, ensure_built

KUBECTL = Component("kubectl", BUILD_ROOT / "kubectl", "k8s.io/kubectl", ("hpcbridge.test/kube-build/kubectl",),
                    ("kubectl",))
HELM = Component("helm", BUILD_ROOT / "helm", "helm.sh/helm/v4", ("helm.sh/helm/v4/cmd/helm",), ("helm",),
                 lambda version: [f"-X helm.sh/helm/v4/internal/version.version={version}"])


def binaries() -> dict[str, Path]:
    """kubectl and helm, built on first use."""
    return ensure_built((KUBECTL, HELM))


def run(argv: list[str], kubeconfig: Path, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """One kubectl or helm command against *kubeconfig*, with helm's config, cache and data under *home* (never
    the user's), returning its output; the caller asserts on the exit status."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(kubeconfig),
           "HELM_CONFIG_HOME": str(home / "helm-config"), "HELM_CACHE_HOME": str(home / "helm-cache"),
           "HELM_DATA_HOME": str(home / "helm-data")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
