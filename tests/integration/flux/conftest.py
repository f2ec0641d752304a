"""A live Flux instance (`flux start --test-size=2`) for the run, when flux-core is on PATH.

Flux is not packaged for Debian 12; these tests skip with that reason unless a hand-built flux-core is on
PATH (e.g. PATH=/opt/flux-core/bin:$PATH).
"""

from __future__ import annotations

import shutil
import sys

import pytest

from bridge.api.cluster import BridgeCluster
from tests import builders

FLUX = shutil.which("flux")


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
    return builders.cluster("flux", "testflux", flux={"uri": flux_uri, "transport": request.param, "fluxCommand": FLUX},
                            defaults={"launchCommand": [sys.executable, "-m", "bridge", "launch"]})
