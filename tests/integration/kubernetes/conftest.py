"""One real Kubernetes control plane for the whole run (tests/harness/kube.py), and a fresh namespace per test.

The first run on a machine builds the binaries from Go modules (tens of minutes, cached under
~/.cache/hpcbridge); later runs start the cluster in well under a minute.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def namespace(request: pytest.FixtureRequest, kube_api) -> Iterator[str]:
    """A new namespace named after the test, ready for pods (its default ServiceAccount exists)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(kube_api)
    stem = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].rstrip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"hpcbridge.test/namespace": "true"}}})
    deadline = time.monotonic() + 60
    while True:  # KCM's serviceaccount controller creates it; pod admission needs it
        try:
            core.read_namespaced_service_account("default", name)
            break
        except ApiException as exc:
            if exc.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield name
    core.delete_namespace(name)
