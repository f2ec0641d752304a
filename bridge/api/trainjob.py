"""TrainJob, ``trainer.kubeflow.org/v1alpha1``, in the Kubeflow Trainer v2.3 shape.

Validation mirrors the upstream CRD's schema and its CEL rules, so a
TrainJob that loads here is one the upstream API server would admit, except that ``managedBy`` also
admits hpc-bridge's own controller value.
"""

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from bridge.api.base import WireModel
from bridge.api.k8s import (
    Condition,
    EnvVar,
    LocalObjectReference,
    ObjectMeta,
    ResourceRequirements,
    check_image,
)
from bridge.api.names import DNS1035_LABEL, check_dns1035_label, check_dns1123_subdomain

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"

#: ``spec.managedBy`` value that routes a TrainJob to hpc-bridge
MANAGED_BY_BRIDGE = "hpcbridge.io/bridge"
MANAGED_BY_UPSTREAM = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"
MANAGED_BY_VALUES = (MANAGED_BY_UPSTREAM, MANAGED_BY_MULTIKUEUE, MANAGED_BY_BRIDGE)

RFC1035_LABEL = DNS1035_LABEL
_STORAGE_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\x00-\x20\x7f]+$")
check_rfc1035_name = check_dns1035_label


def check_unique_names(items: list[Any] | None, key: str = "name") -> None:
    seen: set[str] = set()
    for item in items or []:
        value = getattr(item, key)
        if value in seen:
            raise ValueError(f"duplicate {key} {value!r}: entries are keyed by {key}")
        seen.add(value)


class RuntimeRef(WireModel):
    name: str = Field(min_length=1, max_length=253)
    api_group: str | None = Field(default=None, max_length=253)
    kind: str | None = Field(default=None, max_length=253)

    @field_validator("name")
    @classmethod
    def _object_name(cls, name: str) -> str:
        return check_dns1123_subdomain(name)

    @field_validator("kind")
    @classmethod
    def _supported_kind(cls, kind: str | None) -> str | None:
        if kind is not None and kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
            raise ValueError(f"unsupported runtime: {kind}.{API_GROUP} (use ClusterTrainingRuntime or TrainingRuntime)")
        return kind

    @field_validator("api_group")
    @classmethod
    def _supported_group(cls, group: str | None) -> str | None:
        if group is not None and group != API_GROUP:
            raise ValueError(f"unsupported runtime API group (only {API_GROUP})")
        return group

    @property
    def resolved_kind(self) -> str:
        return self.kind or "ClusterTrainingRuntime"


class _InitializerBase(WireModel):
    storage_uri: str | None = Field(default=None, max_length=2048)
    env: list[EnvVar] | None = Field(default=None, max_length=128)
    secret_ref: LocalObjectReference | None = None

    @field_validator("storage_uri")
    @classmethod
    def _uri(cls, uri: str | None) -> str | None:
        # an absolute path is hpc-bridge's (data already on the cluster's shared storage; the TrainJob CRD on
        # Kubernetes keeps upstream's URI rule)
        if uri and not (_STORAGE_URI.match(uri) or (uri.startswith("/") and "\x00" not in uri)):
            raise ValueError("must be a URI with a scheme, e.g. hf://org/model or s3://bucket/path, or an absolute "
                             "path")
        return uri

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar] | None) -> list[EnvVar] | None:
        check_unique_names(env)
        return env


class DatasetInitializer(_InitializerBase):
    pass


class ModelInitializer(_InitializerBase):
    pass


class Initializer(WireModel):
    dataset: DatasetInitializer | None = None
    model: ModelInitializer | None = None


_ARG_MAX = 1048576


class Trainer(WireModel):
    image: str | None = Field(default=None, max_length=500)
    command: list[str] | None = Field(default=None, max_length=128)
    args: list[str] | None = Field(default=None, max_length=128)
    env: list[EnvVar] | None = Field(default=None, max_length=128)
    num_nodes: int | None = Field(default=None, ge=0, le=2**31 - 1)
    resources_per_node: ResourceRequirements | None = None
    num_proc_per_node: int | None = Field(default=None, ge=1, le=2**31 - 1)

    @field_validator("image")
    @classmethod
    def _image(cls, image: str | None) -> str | None:
        return check_image(image)

    @field_validator("command", "args")
    @classmethod
    def _item_length(cls, items: list[str] | None) -> list[str] | None:
        for index, item in enumerate(items or []):
            if len(item) > _ARG_MAX:
                raise ValueError(f"item {index} is longer than {_ARG_MAX} characters")
        return items

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar] | None) -> list[EnvVar] | None:
        check_unique_names(env)
        return env


class RuntimePatch(WireModel):
    manager: str = Field(min_length=1, max_length=253)
    time: str | None = None
    # The patch is a strategic-merge fragment of the runtime's JobSet template; its shape is checked when
    # it is applied against the runtime (bridge.plan.merge), where the target jobs and containers are known.
    training_runtime_spec: dict[str, Any] | None = None

    @field_validator("manager")
    @classmethod
    def _domain_prefixed(cls, manager: str) -> str:
        if "/" not in manager or not manager.split("/", 1)[0] or "." not in manager.split("/", 1)[0]:
            raise ValueError("must be a domain-prefixed path, e.g. example.com/my-tool")
        return manager


class TrainJobSpec(WireModel):
    runtime_ref: RuntimeRef
    initializer: Initializer | None = None
    trainer: Trainer | None = None
    runtime_patches: list[RuntimePatch] | None = Field(default=None, max_length=16)
    suspend: bool | None = None
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=2**63 - 1)
    managed_by: str | None = Field(default=None, max_length=253)

    @field_validator("managed_by")
    @classmethod
    def _known_manager(cls, value: str | None) -> str | None:
        if value is not None and value not in MANAGED_BY_VALUES:
            raise ValueError(f"must be one of {', '.join(MANAGED_BY_VALUES)}")
        return value

    @field_validator("runtime_patches")
    @classmethod
    def _unique_managers(cls, patches: list[RuntimePatch] | None) -> list[RuntimePatch] | None:
        check_unique_names(patches, key="manager")
        return patches


class JobStatus(WireModel):
    name: str
    ready: int | None = Field(default=None, ge=0)
    succeeded: int | None = Field(default=None, ge=0)
    failed: int | None = Field(default=None, ge=0)
    active: int | None = Field(default=None, ge=0)
    suspended: int | None = Field(default=None, ge=0)


class TrainerStatus(WireModel):
    progress_percentage: int | None = Field(default=None, ge=0, le=100)
    estimated_remaining_seconds: int | None = Field(default=None, ge=0)
    metrics: list[dict[str, Any]] | None = None
    last_updated_time: str | None = None


class TrainJobStatus(WireModel):
    conditions: list[Condition] | None = Field(default=None, max_length=8)
    jobs_status: list[JobStatus] | None = Field(default=None, max_length=100)
    trainer_status: TrainerStatus | None = None


class TrainJobMeta(ObjectMeta):
    """A TrainJob's name is required and, by the CRD's CEL rule, an RFC 1035 label of at most 63 characters."""

    name: str

    # the same name replaces ObjectMeta's validator (pydantic), for a name that is required here
    @field_validator("name")
    @classmethod
    def _object_name(cls, name: str) -> str:  # type: ignore[override]
        return check_rfc1035_name(name)


class TrainJob(WireModel):
    api_version: Literal["trainer.kubeflow.org/v1alpha1"]
    kind: Literal["TrainJob"]
    metadata: TrainJobMeta
    spec: TrainJobSpec
    status: TrainJobStatus | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"
