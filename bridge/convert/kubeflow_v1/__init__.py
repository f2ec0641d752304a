"""Training Operator v1 jobs → TrainJob (Kubeflow Trainer v2.3 shape): kubeflow.org/v1 PyTorchJob and TFJob,
kubeflow.org/v2beta1 MPIJob (mpi-operator).

A v1 job describes each replica type with its own pod template; a TrainJob names a runtime and says what its
trainer runs. So the framework container's image, command, args, env and resources become ``spec.trainer``,
the node count is the sum of the replicas, pod-level settings (node selectors, tolerations, volumes, service
account, ...) go into a ``runtimePatches`` entry for the runtime's Jobs, and a TrainingRuntime is written when
no built-in runtime fits (an MPI flavour or SSH path the built-ins lack, TensorFlow's TF_CONFIG). Every field
with no equivalent is reported, one line each; nothing is dropped silently. What cannot be expressed at all
(parameter servers) is an InvalidSpec naming the field.

Pure: dicts in, dicts out; the caller validates them as the wire objects they are. One module per kind
(``pytorch``, ``mpi``, ``tensorflow``) on what they share (``conversion``).
"""

from __future__ import annotations

from typing import Any

from bridge.convert.kubeflow_v1.conversion import (
    KINDS,
    PATCH_MANAGER,
    TRAINER_API,
    Conversion,
    Converted,
    is_v1_job,
)
from bridge.convert.kubeflow_v1.mpi import mpi
from bridge.convert.kubeflow_v1.pytorch import pytorch
from bridge.convert.kubeflow_v1.tensorflow import tensorflow

__all__ = ["KINDS", "PATCH_MANAGER", "TRAINER_API", "Converted", "convert", "is_v1_job"]


def convert(document: dict[str, Any], source: str, builtin: dict[str, dict[str, Any]]) -> Converted:
    """A v1 job as a TrainJob (and the TrainingRuntime it needs, if any). *builtin* are the built-in runtimes
    by name, as documents."""
    conv = Conversion(document, source)
    kind = document["kind"]
    if kind == "PyTorchJob":
        return pytorch(conv, builtin)
    if kind == "MPIJob":
        return mpi(conv, builtin)
    return tensorflow(conv, builtin)
