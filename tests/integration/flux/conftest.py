"""A live Flux instance (`flux start --test-size=2`) for the run, when flux-core is on PATH.

Flux is not packaged for Debian 12; these tests skip with that reason unless a hand-built flux-core is on
PATH (e.g. PATH=/opt/flux-core/bin:$PATH).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bridge.api.cluster import BridgeCluster

FLUX = shutil.which("flux")


@pytest.fixture(scope="session")
def flux_uri():
    if FLUX is None:
        pytest.skip("flux-core is not on PATH (Debian 12 has no package; build it by hand to run these)")
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-flux-"))
    uri_file = base / "uri"
    proc = subprocess.Popen([FLUX, "start", "--test-size=2", "bash", "-c",
                             f'echo "$FLUX_URI" > {uri_file}; exec sleep infinity'],
                            stdout=open(base / "broker.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (uri_file.exists() and uri_file.read_text().strip()):
            if proc.poll() is not None:
                pytest.fail(f"flux start exited: {(base / 'broker.log').read_text()}")
            time.sleep(0.1)
        yield uri_file.read_text().strip()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def _python_bindings_importable() -> bool:
    try:
        import flux.job  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="session", params=["cli", "python"])
def flux_cluster(request, flux_uri) -> BridgeCluster:
    """The same tests over both transports; flux-python ones skip when the bindings are not importable
    (set PYTHONPATH to the built flux-core's site-packages and install ply)."""
    if request.param == "python" and not _python_bindings_importable():
        pytest.skip("flux-python is not importable (build flux-core with its bindings, add them to PYTHONPATH)")
    return BridgeCluster.model_validate({
        "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "testflux"},
        "spec": {"type": "flux", "flux": {"uri": flux_uri, "transport": request.param, "fluxCommand": FLUX},
                 "defaults": {"launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
