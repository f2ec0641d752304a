"""TrainingRuntime and ClusterTrainingRuntime (``trainer.kubeflow.org/v1alpha1``), v2.3 shape."""

from typing import Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from bridge.api.base import WireModel
from bridge.api.k8s import JobSetTemplateSpec, ObjectMeta
from bridge.api.names import check_dns1123_label, check_dns1123_subdomain

#: MPI implementations. Upstream's CRD admits only OpenMPI (and ""); its Go constants already name MPICH
#: and Intel (kubeflow/trainer#3712). hpc-bridge runs all three, so it admits them.
MPI_IMPLEMENTATIONS = ("OpenMPI", "MPICH", "Intel", "")


class EnvInjectionTarget(WireModel):
    job_name: str = Field(min_length=1, max_length=253)
    container_names: list[str] = Field(min_length=1, max_length=8)

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, name: str) -> str:
        return check_dns1123_label(name)

    @field_validator("container_names")
    @classmethod
    def _not_node(cls, names: list[str]) -> list[str]:
        for name in names:
            if len(name) > 63:
                raise ValueError(f"container name {name!r} is longer than 63 characters")
            check_dns1123_label(name)
            if "node" in name:
                raise ValueError(f"container name {name!r} must not contain 'node' (it always gets the env)")
        if len(set(names)) != len(names):
            raise ValueError("container names must be unique")
        return names


class EnvInjection(WireModel):
    targets: list[EnvInjectionTarget] | None = Field(default=None, max_length=16)


class TorchMLPolicySource(WireModel):
    env_injection: EnvInjection | None = None


class MPIMLPolicySource(WireModel):
    num_proc_per_node: int | None = Field(default=None, ge=1, le=2**31 - 1)
    mpi_implementation: str | None = None
    ssh_auth_mount_path: str | None = Field(default=None, max_length=4096, pattern=r"^/[^\x00-\x1f\x7f]*$")
    run_launcher_as_node: bool | None = None

    @field_validator("mpi_implementation")
    @classmethod
    def _known_implementation(cls, value: str | None) -> str | None:
        if value is not None and value not in MPI_IMPLEMENTATIONS:
            raise ValueError(f"must be one of {', '.join(repr(v) for v in MPI_IMPLEMENTATIONS)}")
        return value


class FluxMLPolicySource(WireModel):
    num_proc_per_node: int | None = Field(default=None, ge=1, le=2**31 - 1)


class EmptyPolicy(WireModel):
    """``jax: {}`` and ``xgboost: {}``: presence selects the plugin; no fields."""


class MLPolicy(WireModel):
    num_nodes: int | None = Field(default=None, ge=0, le=2**31 - 1)
    torch: TorchMLPolicySource | None = None
    mpi: MPIMLPolicySource | None = None
    jax: EmptyPolicy | None = None
    xgboost: EmptyPolicy | None = None
    flux: FluxMLPolicySource | None = None

    @model_validator(mode="after")
    def _one_policy(self) -> Self:
        chosen = [name for name in ("torch", "mpi", "jax", "xgboost", "flux") if getattr(self, name) is not None]
        if len(chosen) > 1:
            raise ValueError(f"Only one of the policy can be configured (got {', '.join(chosen)})")
        return self

    @property
    def framework(self) -> str:
        for name in ("torch", "mpi", "jax", "xgboost", "flux"):
            if getattr(self, name) is not None:
                return name
        return "plain"


class CoschedulingPodGroupPolicySource(WireModel):
    schedule_timeout_seconds: int | None = None


class VolcanoPodGroupPolicySource(WireModel):
    network_topology: dict[str, Any] | None = None


class PodGroupPolicy(WireModel):
    coscheduling: CoschedulingPodGroupPolicySource | None = None
    volcano: VolcanoPodGroupPolicySource | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.coscheduling is None) == (self.volcano is None):
            raise ValueError("exactly one of coscheduling or volcano must be set")
        return self


class TrainingRuntimeSpec(WireModel):
    ml_policy: MLPolicy | None = None
    pod_group_policy: PodGroupPolicy | None = None
    template: JobSetTemplateSpec = Field(default_factory=JobSetTemplateSpec)


class RuntimeMeta(ObjectMeta):
    name: str = Field(min_length=1, max_length=253)

    # the same name replaces ObjectMeta's validator (pydantic), for a name that is required here
    @field_validator("name")
    @classmethod
    def _object_name(cls, name: str) -> str:  # type: ignore[override]
        return check_dns1123_subdomain(name)


class _RuntimeBase(WireModel):
    api_version: Literal["trainer.kubeflow.org/v1alpha1"]
    kind: str  # each kind narrows it; declared here so that it is written second, as kubectl does
    metadata: RuntimeMeta
    spec: TrainingRuntimeSpec

    @property
    def name(self) -> str:
        return self.metadata.name


class ClusterTrainingRuntime(_RuntimeBase):
    kind: Literal["ClusterTrainingRuntime"]


class TrainingRuntime(_RuntimeBase):
    kind: Literal["TrainingRuntime"]


Runtime = ClusterTrainingRuntime | TrainingRuntime
