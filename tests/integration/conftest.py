"""Engines shared by every integration test (each engine's own tests and the adapter conformance suite):
the emulated hosts, the Slurm cluster, the Kubernetes control plane and a Flux instance each start once
per run, whoever needs them first, and are stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import slurm_versions
from tests.harness.kube import KubeCluster
from tests.harness.kubelet import RealNodeCluster
from tests.harness.netns import HostCluster
from tests.harness.slurm import NetnsSlurmCluster, SlurmCluster
from tests.integration.engines import engine  # noqa: F401 (the fixture, for every module here)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that starts a Slurm cluster is marked slurm, whatever its module says: ``-m slurm`` is how
    scripts/test.sh selects what runs again on each Slurm release."""
    for item in items:
        if "slurm_install" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def netns_hosts(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[HostCluster]:
    """Three hosts node-0..node-2 (10.77.0.10-12 on bridge br-hpcb), each with its own sshd, for the session.

    Missing tools or privileges make start() raise, so the tests error out instead of being skipped. The
    finalizer is registered before start(), so a failed or interrupted start is torn down too (start() also
    cleans up leftovers of an earlier killed run).
    """
    cluster = HostCluster(count=3, base_dir=tmp_path_factory.mktemp("netns-hosts"))
    request.addfinalizer(cluster.stop)
    cluster.start()
    yield cluster


@pytest.fixture(scope="session")
def slurm_install() -> Iterator[slurm_versions.SlurmInstall | None]:
    """The Slurm release the session's clusters run: ``HPCBRIDGE_SLURM=24.11`` or ``26.05`` builds (once,
    cached) and returns that release, with its commands first on PATH for the rest of the session, so the
    adapter, the tests' own calls and the jobs (sbatch hands its environment on) use them; None, the default
    (unset or 22.05), is this machine's own packages."""
    release = slurm_versions.requested()
    if release is None:
        yield None
        return
    install = slurm_versions.install(release)
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{install.bin_dir}:{saved}"
    try:
        yield install
    finally:
        os.environ["PATH"] = saved


@pytest.fixture(scope="session")
def slurm_cluster(slurm_install):
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-slurm-"))
    cluster = SlurmCluster(base, install=slurm_install)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def netns_slurm(netns_hosts, slurm_install):
    """Slurm with slurmctld on the hosts' bridge and one slurmd per emulated host; node-0 doubles as the login
    host the SSH transport reaches."""
    cluster = NetnsSlurmCluster(Path(tempfile.mkdtemp(prefix="hpcbridge-slurm-ns-")), netns_hosts,
                                install=slurm_install)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """etcd + kube-apiserver + KCM + scheduler + 4 kwok nodes + JobSet, started once, stopped by PID."""
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-kube-"))
    cluster = KubeCluster(base)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
    shutil.rmtree(base, ignore_errors=True)  # kept when start/stop raised, for the logs


@pytest.fixture(scope="session")
def real_kube() -> Iterator[RealNodeCluster]:
    """The control plane with real kubelet nodes that run containers (tests/harness/kubelet.py), started once
    when a test asks for it; the first run on a machine builds kubelet, CoreDNS and the node image."""
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-real-kube-"))
    cluster = RealNodeCluster(base, gpus=4)  # 4 fake GPUs on each GPU node: two pods of 2 GPUs fit on one
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_api(kube_cluster: KubeCluster):
    """A kubernetes.client.ApiClient bound to the test cluster (not the global default configuration)."""
    api = kube_cluster.api_client()
    yield api
    api.close()


FLUX = shutil.which("flux")


@pytest.fixture(scope="session")
def flux_uri():
    if FLUX is None:
        pytest.skip("flux-core is not on PATH (Debian 12 has no package; build it by hand to run these)")
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-flux-"))
    uri_file = base / "uri"
    # two brokers on this machine, each with its cores and two fake GPUs (as on a GPU cluster, Flux assigns
    # them and its gpu-affinity sets CUDA_VISIBLE_DEVICES); resources from this R, not probed
    host = socket.gethostname()
    (base / "R.json").write_text(json.dumps({"version": 1, "execution": {
        "R_lite": [{"rank": "0-1", "children": {"core": f"0-{max(os.cpu_count() or 1, 2) - 1}", "gpu": "0-1"}}],
        "starttime": 0, "expiration": 0, "nodelist": [f"{host},{host}"]}}))
    (base / "flux.toml").write_text(f'[resource]\npath = "{base / "R.json"}"\nnoverify = true\n')
    proc = subprocess.Popen([FLUX, "start", "--test-size=2", f"-o,--config-path={base / 'flux.toml'}", "bash", "-c",
                             f'echo "$FLUX_URI" > {uri_file}; exec sleep infinity'],
                            stdout=open(base / "broker.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=base)  # a job given no working directory runs in the broker's: never the checkout
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
