"""MPI tests run on the shared emulated hosts (tests/integration/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def mpi_hosts(netns_hosts):
    return netns_hosts
