"""One real Slurm cluster for the whole run (tests/harness/slurm.py), and a BridgeCluster that targets it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bridge.adapters.base import JobState, JobStatus
from bridge.adapters.slurm import SlurmAdapter
from bridge.api.cluster import BridgeCluster
from tests import builders
from tests.harness.polling import poll_until


@pytest.fixture(scope="session")
def bridge_cluster(slurm_cluster) -> BridgeCluster:
    return builders.cluster("slurm", "testslurm", slurm={"transport": "local", "slurmConf": str(slurm_cluster.conf)},
                            defaults={"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]})


@pytest.fixture
def adapter(bridge_cluster) -> SlurmAdapter:
    return SlurmAdapter(bridge_cluster)


@pytest.fixture
def config_file(tmp_path, bridge_cluster) -> Path:
    from bridge.api.loader import to_yaml

    path = tmp_path / "clusters.yaml"
    path.write_text(to_yaml([bridge_cluster]))
    return path


wait_for = poll_until


def finished(status: JobStatus) -> bool:
    return status.state.finished


def state_is(state: JobState):
    return lambda status: status.state == state
