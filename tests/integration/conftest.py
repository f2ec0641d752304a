"""Fixtures shared by engines: the emulated hosts (netns + sshd) exist once per run, whoever needs them first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.netns import HostCluster


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
