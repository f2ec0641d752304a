"""Objects the suites build over and over, built one way: import these instead of writing another.

A module whose tests share other defaults (a cluster name, a runtime) keeps a one-line wrapper that names them.
"""

from __future__ import annotations

from typing import Any

import yaml

from bridge.api.cluster import API_VERSION, BridgeCluster
from bridge.api.loader import load_documents
from bridge.api.trainjob import API_VERSION as TRAINJOB_API_VERSION
from bridge.api.trainjob import TrainJob

#: a one-node ClusterTrainingRuntime ``plain`` and a TrainJob ``fake-job`` (namespace ``team``) on it, as a user
#: pipes them to ``hpcbridge submit -``: the input of the orchestration-layer tests over tests.fakes.FakeBackend
TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: plain}
spec: {mlPolicy: {numNodes: 1}}
---
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: fake-job, namespace: team}
spec: {runtimeRef: {name: plain}, trainer: {command: [train]}}
"""


def cluster(kind: str = "slurm", name: str = "hpc", **spec: Any) -> BridgeCluster:
    """A BridgeCluster of type *kind* named *name*; *spec* adds to its spec (``tenants=…``, ``defaults=…``)."""
    return BridgeCluster.model_validate({"apiVersion": API_VERSION, "kind": "BridgeCluster",
                                         "metadata": {"name": name}, "spec": {"type": kind, **spec}})


def trainjob_doc(name: str = "train", *, runtime: str = "torch-distributed", namespace: str | None = None, uid: str | None = None,
                 annotations: dict[str, str] | None = None, metadata: dict[str, Any] | None = None,
                 trainer: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A TrainJob as the decoded YAML document: *name* on the runtime named *runtime*; metadata and
    ``spec.trainer`` only where given (*metadata*: other fields, ``labels``, ``finalizers``…); *spec* adds to
    its spec (``runtimePatches=…``, ``suspend=…``)."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if uid is not None:
        meta["uid"] = uid
    meta.update(metadata or {})
    if annotations is not None:
        meta["annotations"] = annotations
    body: dict[str, Any] = {"runtimeRef": {"name": runtime}}
    if trainer is not None:
        body["trainer"] = trainer
    return {"apiVersion": TRAINJOB_API_VERSION, "kind": "TrainJob", "metadata": meta, "spec": {**body, **spec}}


def trainjob(name: str = "train", **fields: Any) -> TrainJob:
    """The TrainJob of ``trainjob_doc(name, **fields)`` read as a user's YAML file is read."""
    job = load_documents(yaml.safe_dump(trainjob_doc(name, **fields)))[0]
    assert isinstance(job, TrainJob)
    return job
