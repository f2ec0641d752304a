"""Wire objects: Kubeflow Trainer v2 TrainJob and runtimes, hpc-bridge's BridgeCluster; YAML load/dump."""

from bridge.api.cluster import BridgeCluster, builtin_local_cluster
from bridge.api.loader import Resource, load_documents, load_file, parse_object, to_yaml
from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
from bridge.api.trainjob import TrainJob

from bridge.api import schema_cache  # isort: skip
from bridge.api.base import WireModel  # isort: skip

# every model module is imported by now: complete them all, before anything validates
schema_cache.install(WireModel)

__all__ = [
    "BridgeCluster",
    "ClusterTrainingRuntime",
    "Resource",
    "TrainJob",
    "TrainingRuntime",
    "builtin_local_cluster",
    "load_documents",
    "load_file",
    "parse_object",
    "to_yaml",
]
