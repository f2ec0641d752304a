"""Wire-model validation: what loads, what is rejected, and that every rejection is one typed line."""

from __future__ import annotations

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.api import load_documents, to_yaml
from bridge.api.catalog import builtin_runtimes
from bridge.errors import InvalidSpec

BASE = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "job"},
    "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2, "command": ["python3"]}},
}

# The TrainJob from the Kubeflow docs (v2.2+ shape) must load unchanged.
KUBEFLOW_DOCS_TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: pytorch-simple
  namespace: kubeflow
spec:
  runtimeRef:
    name: torch-distributed
    apiGroup: trainer.kubeflow.org
    kind: ClusterTrainingRuntime
  trainer:
    numNodes: 2
    numProcPerNode: 1
    image: docker.io/kubeflow/pytorch-mnist:v1beta1
    command: ["bash", "-c", "torchrun /workspace/mnist.py"]
    resourcesPerNode:
      requests: {cpu: "1", memory: "2Gi"}
      limits: {nvidia.com/gpu: 1}
  runtimePatches:
    - manager: trainer.kubeflow.org/kubeflow-sdk
      trainingRuntimeSpec:
        template:
          spec:
            replicatedJobs:
              - name: node
                template:
                  spec:
                    template:
                      spec:
                        nodeSelector: {accelerator: a100}
  activeDeadlineSeconds: 3600
  suspend: false
"""


def load_one(doc: dict):
    return load_documents(yaml.safe_dump(doc), "job.yaml")[0]


def mutated(path: str, value):
    doc = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    target = doc
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value
    return doc


def test_kubeflow_docs_trainjob_loads_and_round_trips() -> None:
    [job] = load_documents(KUBEFLOW_DOCS_TRAINJOB)
    assert job.spec.trainer.num_nodes == 2
    assert yaml.safe_load(to_yaml([job])) == yaml.safe_load(KUBEFLOW_DOCS_TRAINJOB)


def test_builtin_runtimes_round_trip() -> None:
    for runtime in builtin_runtimes():
        again = load_documents(to_yaml([runtime]))[0]
        assert again == runtime


@pytest.mark.parametrize(
    ("path", "value", "field", "fragment"),
    [
        ("spec.trainer.numNodes", -1, "spec.trainer.numNodes", "greater than or equal to 0"),
        ("spec.trainer.numNode", 2, "spec.trainer.numNode", "unknown field"),
        ("metadata.name", "x" * 64, "metadata.name", "at most 63"),
        ("metadata.name", "Bad_Name", "metadata.name", "RFC 1035"),
        ("spec.trainer.numProcPerNode", 0, "spec.trainer.numProcPerNode", "greater than or equal to 1"),
        ("spec.activeDeadlineSeconds", 0, "spec.activeDeadlineSeconds", "greater than or equal to 1"),
        ("spec.managedBy", "someone/else", "spec.managedBy", "must be one of"),
        ("spec.runtimeRef.kind", "JobSet", "spec.runtimeRef.kind", "unsupported runtime"),
        ("spec.trainer.env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "spec.trainer.env",
         "duplicate name"),
        ("spec.trainer.env", [{"name": "A", "value": 1}], "spec.trainer.env[0].value", "quote it"),
        ("spec.trainer.resourcesPerNode", {"requests": {"cpu": "lots"}}, "spec.trainer.resourcesPerNode.requests",
         "not a Kubernetes quantity"),
        ("spec.runtimeRef", None, "spec.runtimeRef", "valid dictionary"),
    ],
)
def test_bad_trainjob_names_field_and_value(path, value, field, fragment) -> None:
    with pytest.raises(InvalidSpec) as info:
        load_one(mutated(path, value))
    message = str(info.value)
    assert info.value.field == field
    assert fragment in message
    assert "\n" not in message
    assert message.startswith("job.yaml: ")


def test_missing_field_is_named() -> None:
    doc = copy.deepcopy(BASE)
    del doc["spec"]["runtimeRef"]
    with pytest.raises(InvalidSpec, match=r"spec\.runtimeRef: required field is missing"):
        load_one(doc)


def test_runtime_with_two_policies_rejected() -> None:
    text = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: two}
spec:
  mlPolicy: {torch: {}, mpi: {numProcPerNode: 1}}
"""
    with pytest.raises(InvalidSpec, match=r"spec\.mlPolicy: Only one of the policy can be configured"):
        load_documents(text)


@pytest.mark.parametrize("text", ["a: [", "{{{", "key: value\n  bad indent: x\n: y", "\t- x"])
def test_non_yaml_is_one_line_error(text: str) -> None:
    with pytest.raises(InvalidSpec, match="not valid YAML") as info:
        load_documents(text, "bad.yaml")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["just a string", "- a\n- b", "42"])
def test_non_mapping_documents_rejected(text: str) -> None:
    with pytest.raises(InvalidSpec, match="must be a mapping"):
        load_documents(text)


def test_unknown_kind_rejected() -> None:
    with pytest.raises(InvalidSpec, match="unsupported object"):
        load_documents("apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\n")


def test_multi_document_errors_name_the_document() -> None:
    text = yaml.safe_dump(BASE) + "---\n" + yaml.safe_dump(mutated("spec.trainer.numNodes", -3))
    with pytest.raises(InvalidSpec, match=r"^f\.yaml\[doc 2\]: spec\.trainer\.numNodes"):
        load_documents(text, "f.yaml")


# --- fuzz: nothing but typed errors, whatever the input ---------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**12), st.floats(allow_nan=True),
                     st.text(max_size=20))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=12), inner, max_size=5)),
                       max_leaves=25)
_keys = st.sampled_from(["apiVersion", "kind", "metadata", "spec", "name", "trainer", "numNodes", "runtimeRef",
                         "env", "command", "mlPolicy", "mpi", "torch", "template", "replicatedJobs", "resourcesPerNode",
                         "requests", "value", "status", "type"])


def _documents():
    trainjob_like = st.fixed_dictionaries(
        {"apiVersion": st.sampled_from(["trainer.kubeflow.org/v1alpha1", "hpcbridge.io/v1alpha1", "v1"]),
         "kind": st.sampled_from(["TrainJob", "ClusterTrainingRuntime", "TrainingRuntime", "BridgeCluster", "Pod"])},
        optional={"metadata": st.dictionaries(_keys, _values, max_size=3),
                  "spec": st.dictionaries(_keys, _values, max_size=5)})
    return st.one_of(trainjob_like, _values)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents())
def test_loader_raises_only_typed_errors_on_random_documents(document) -> None:
    try:
        text = yaml.safe_dump(document)
    except yaml.YAMLError:
        return
    try:
        load_documents(text)
    except InvalidSpec as exc:
        assert "\n" not in str(exc)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_loader_raises_only_typed_errors_on_random_text(text: str) -> None:
    try:
        load_documents(text)
    except InvalidSpec as exc:
        assert "\n" not in str(exc)
