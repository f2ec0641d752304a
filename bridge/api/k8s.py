"""The Kubernetes and JobSet types that TrainJobs and runtimes embed.

Fields hpc-bridge interprets are typed; the rest of a pod template is declared by name with ``Any`` so
unknown keys are still rejected (a typo is an error) without re-modelling the whole core API.
"""

from typing import Any, Literal

from pydantic import Field, field_validator

from bridge.api.base import WireModel
from bridge.api.names import (
    check_annotations,
    check_dns1123_label,
    check_dns1123_subdomain,
    check_labels,
    check_one_line,
    check_qualified_name,
    check_uid,
)
from bridge.api.quantity import parse_quantity


class OwnerReference(WireModel):
    api_version: str = Field(max_length=316)
    kind: str = Field(max_length=63)
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None

    @field_validator("api_version", "kind")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return check_one_line(value)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_dns1123_subdomain(value)

    @field_validator("uid")
    @classmethod
    def _uid(cls, value: str) -> str:
        return check_uid(value)


class ObjectMeta(WireModel):
    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    finalizers: list[str] | None = None
    owner_references: list[OwnerReference] | None = None
    managed_fields: list[dict[str, Any]] | None = None
    self_link: str | None = None

    # Identity fields follow Kubernetes' grammars (bridge.api.names): they end up in script lines, Slurm
    # comments, Flux attributes and Kubernetes labels, so they are checked here, where they enter.
    @field_validator("name")
    @classmethod
    def _object_name(cls, name: str | None) -> str | None:
        return None if name is None else check_dns1123_subdomain(name)

    @field_validator("generate_name")
    @classmethod
    def _generate_name(cls, prefix: str | None) -> str | None:
        if prefix is not None:
            check_dns1123_subdomain(prefix.rstrip("-.") or "x")
        return prefix

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, namespace: str | None) -> str | None:
        return None if namespace is None else check_dns1123_label(namespace)

    @field_validator("uid")
    @classmethod
    def _uid(cls, uid: str | None) -> str | None:
        return None if uid is None else check_uid(uid)

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return check_labels(labels)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, annotations: dict[str, str] | None) -> dict[str, str] | None:
        return check_annotations(annotations)

    @field_validator("finalizers")
    @classmethod
    def _finalizers(cls, finalizers: list[str] | None) -> list[str] | None:
        for finalizer in finalizers or []:
            check_qualified_name(finalizer, "finalizer")
        return finalizers


class LocalObjectReference(WireModel):
    name: str


class EnvVar(WireModel):
    # Kubernetes' (relaxed) rule: printable ASCII except '='; HPC backends also need shell names (bridge.plan.staging)
    name: str = Field(min_length=1, max_length=1024, pattern=r"^[\x21-\x3c\x3e-\x7e]+$")
    value: str | None = None
    value_from: dict[str, Any] | None = None

    @field_validator("value", mode="before")
    @classmethod
    def _scalar_to_text(cls, value: Any) -> Any:
        # YAML turns `value: 1` or `value: true` into non-strings; Kubernetes rejects them, so do we,
        # but with a message that says how to fix it.
        if value is not None and not isinstance(value, str):
            raise ValueError(f"env values are strings: quote it, e.g. value: \"{value}\"")
        return value


Quantity = str | int | float


#: Kubernetes: "no quantity may represent a number greater than 2^63-1 in magnitude"
QUANTITY_MAX = 2**63 - 1


def _check_quantities(values: dict[str, Quantity] | None) -> dict[str, Quantity] | None:
    for key, quantity in (values or {}).items():
        check_qualified_name(key, "resource name")
        if isinstance(quantity, str) and quantity != quantity.strip():
            raise ValueError(f"{key}: a quantity has no surrounding blanks")
        try:
            amount = parse_quantity(quantity)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        if amount < 0:
            raise ValueError(f"{key}: a resource quantity cannot be negative")
        if amount > QUANTITY_MAX:
            raise ValueError(f"{key}: a quantity is at most 2^63-1 (Kubernetes)")
    return values


class ResourceRequirements(WireModel):
    requests: dict[str, Quantity] | None = None
    limits: dict[str, Quantity] | None = None
    claims: list[dict[str, Any]] | None = None

    @field_validator("requests", "limits", mode="before")
    @classmethod
    def _no_booleans(cls, values: Any) -> Any:
        # before the union of str | int | float sees it: a boolean is not a quantity (never 1)
        if isinstance(values, dict):
            for key, quantity in values.items():
                if isinstance(quantity, bool):
                    raise ValueError(f"{key}: a quantity is a number or a string like '500m' or '4Gi', not a "
                                     "boolean")
        return values

    @field_validator("requests", "limits")
    @classmethod
    def _valid_quantities(cls, values: dict[str, Quantity] | None) -> dict[str, Quantity] | None:
        return _check_quantities(values)


def check_image(image: str | None) -> str | None:
    """An image reference travels as one argument (container runtimes) or one field: no blanks, no controls."""
    if image is not None and (not image or any(ch.isspace() or not ch.isprintable() for ch in image)):
        raise ValueError("an image reference is one word without blanks or control characters")
    return image


class ContainerPort(WireModel):
    """core/v1 ContainerPort, bounded as the API server bounds it (a port is a 16-bit number)."""

    container_port: int = Field(ge=1, le=65535)
    host_port: int | None = Field(default=None, ge=0, le=65535)
    host_ip: str | None = Field(default=None, max_length=45)
    name: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=15)
    protocol: Literal["TCP", "UDP", "SCTP"] | None = None


class Container(WireModel):
    name: str = Field(min_length=1)
    image: str | None = Field(default=None, max_length=4096)
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[EnvVar] | None = None
    env_from: list[dict[str, Any]] | None = None
    resources: ResourceRequirements | None = None
    working_dir: str | None = None
    ports: list[ContainerPort] | None = None
    volume_mounts: list[dict[str, Any]] | None = None
    volume_devices: list[dict[str, Any]] | None = None
    security_context: dict[str, Any] | None = None
    liveness_probe: dict[str, Any] | None = None
    readiness_probe: dict[str, Any] | None = None
    startup_probe: dict[str, Any] | None = None
    lifecycle: dict[str, Any] | None = None
    image_pull_policy: str | None = None
    stdin: bool | None = None
    stdin_once: bool | None = None
    tty: bool | None = None
    termination_message_path: str | None = None
    termination_message_policy: str | None = None
    resize_policy: list[dict[str, Any]] | None = None
    restart_policy: str | None = None
    restart_policy_rules: list[dict[str, Any]] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_dns1123_label(name)

    @field_validator("image")
    @classmethod
    def _image(cls, image: str | None) -> str | None:
        return check_image(image)


class PodSpec(WireModel):
    containers: list[Container] = Field(default_factory=list)
    init_containers: list[Container] | None = None
    ephemeral_containers: list[dict[str, Any]] | None = None
    volumes: list[dict[str, Any]] | None = None
    restart_policy: str | None = None
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=2**63 - 1)
    active_deadline_seconds: int | None = None
    dns_policy: str | None = None
    dns_config: dict[str, Any] | None = None
    node_selector: dict[str, str] | None = None
    node_name: str | None = None
    service_account_name: str | None = None
    service_account: str | None = None
    automount_service_account_token: bool | None = None
    host_network: bool | None = None
    host_pid: bool | None = Field(default=None, alias="hostPID")
    host_ipc: bool | None = Field(default=None, alias="hostIPC")
    host_users: bool | None = None
    share_process_namespace: bool | None = None
    security_context: dict[str, Any] | None = None
    image_pull_secrets: list[dict[str, Any]] | None = None
    hostname: str | None = None
    hostname_override: str | None = None
    subdomain: str | None = None
    set_hostname_as_fqdn: bool | None = Field(default=None, alias="setHostnameAsFQDN")
    affinity: dict[str, Any] | None = None
    scheduler_name: str | None = None
    tolerations: list[dict[str, Any]] | None = None
    host_aliases: list[dict[str, Any]] | None = None
    priority_class_name: str | None = None
    priority: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    preemption_policy: str | None = None
    readiness_gates: list[dict[str, Any]] | None = None
    runtime_class_name: str | None = None
    enable_service_links: bool | None = None
    overhead: dict[str, Any] | None = None
    topology_spread_constraints: list[dict[str, Any]] | None = None
    os: dict[str, Any] | None = None
    scheduling_gates: list[dict[str, Any]] | None = None
    resource_claims: list[dict[str, Any]] | None = None
    resources: ResourceRequirements | None = None

    @field_validator("node_selector")
    @classmethod
    def _node_selector(cls, selector: dict[str, str] | None) -> dict[str, str] | None:
        return check_labels(selector)


class TemplateMeta(WireModel):
    """Metadata allowed in a template (labels and annotations, plus the rest for tolerance of generated YAML)."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    name: str | None = None
    namespace: str | None = None
    finalizers: list[str] | None = None

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        return check_labels(labels)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, annotations: dict[str, str] | None) -> dict[str, str] | None:
        return check_annotations(annotations)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, namespace: str | None) -> str | None:
        return None if namespace is None else check_dns1123_label(namespace)


class PodTemplateSpec(WireModel):
    metadata: TemplateMeta | None = None
    spec: PodSpec | None = None


class JobSpec(WireModel):
    parallelism: int | None = Field(default=None, ge=0, le=2**31 - 1)
    completions: int | None = Field(default=None, ge=0, le=2**31 - 1)
    active_deadline_seconds: int | None = Field(default=None, ge=1, le=2**63 - 1)
    backoff_limit: int | None = Field(default=None, ge=0, le=2**31 - 1)
    backoff_limit_per_index: int | None = Field(default=None, ge=0, le=2**31 - 1)
    max_failed_indexes: int | None = Field(default=None, ge=0, le=2**31 - 1)
    completion_mode: str | None = None
    manual_selector: bool | None = None
    selector: dict[str, Any] | None = None
    suspend: bool | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=2**31 - 1)
    pod_failure_policy: dict[str, Any] | None = None
    pod_replacement_policy: str | None = None
    success_policy: dict[str, Any] | None = None
    managed_by: str | None = None
    template: PodTemplateSpec = Field(default_factory=PodTemplateSpec)


class JobTemplateSpec(WireModel):
    metadata: TemplateMeta | None = None
    spec: JobSpec = Field(default_factory=JobSpec)


class DependsOn(WireModel):
    name: str
    status: str


class ReplicatedJob(WireModel):
    name: str = Field(min_length=1, max_length=63)
    group_name: str | None = None
    replicas: int | None = Field(default=None, ge=0, le=2**31 - 1)
    depends_on: list[DependsOn] | None = None
    template: JobTemplateSpec = Field(default_factory=JobTemplateSpec)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_dns1123_label(name)


class JobSetSpec(WireModel):
    """``sigs.k8s.io/jobset`` v1alpha2 JobSetSpec, as a runtime's ``template.spec`` carries it."""

    replicated_jobs: list[ReplicatedJob] = Field(default_factory=list)
    network: dict[str, Any] | None = None
    success_policy: dict[str, Any] | None = None
    failure_policy: dict[str, Any] | None = None
    startup_policy: dict[str, Any] | None = None
    coordinator: dict[str, Any] | None = None
    suspend: bool | None = None
    managed_by: str | None = None
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=2**31 - 1)
    volume_claim_policies: list[dict[str, Any]] | None = None


class JobSetTemplateSpec(WireModel):
    metadata: TemplateMeta | None = None
    spec: JobSetSpec = Field(default_factory=JobSetSpec)


class Condition(WireModel):
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None
