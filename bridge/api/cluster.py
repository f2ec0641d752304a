"""BridgeCluster (``hpcbridge.io/v1alpha1``): where a TrainJob can run and how hpc-bridge reaches it.

In Kubernetes it is a cluster-scoped object; for the CLI the same objects come from a config file.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from bridge.api.base import WireModel
from bridge.api.k8s import ObjectMeta

API_VERSION = "hpcbridge.io/v1alpha1"
CLUSTER_TYPES = ("local", "slurm", "flux", "kubernetes")

# Slurm partition/account/qos names: what slurm.conf and sacctmgr accept in practice. Kept strict because
# these values end up in #SBATCH lines, which cannot carry a newline or a quote safely.
SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+@-]{1,128}$")


class SecretKeyRef(WireModel):
    name: str
    key: str
    namespace: str | None = None


class SlurmConnection(WireModel):
    transport: Literal["local", "ssh", "rest"] = "local"
    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    key_file: str | None = None
    known_hosts_file: str | None = None
    key_secret_ref: SecretKeyRef | None = None
    known_hosts_secret_ref: SecretKeyRef | None = None
    rest_url: str | None = None
    token_file: str | None = None
    token_secret_ref: SecretKeyRef | None = None
    #: SLURM_CONF for the local transport (a cluster whose config is not in /etc/slurm)
    slurm_conf: str | None = None

    @model_validator(mode="after")
    def _transport_needs(self) -> SlurmConnection:
        if self.transport == "ssh" and not self.host:
            raise ValueError("transport ssh needs host")
        if self.transport == "rest" and not self.rest_url:
            raise ValueError("transport rest needs restUrl")
        return self


class FluxConnection(WireModel):
    #: ``local://…`` or ``ssh://…``; unset means the FLUX_URI of the environment
    uri: str | None = None
    #: python: flux-python in this process; cli: the ``flux`` command, here or on ``host`` over SSH
    transport: Literal["python", "cli"] = "cli"
    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    key_file: str | None = None
    known_hosts_file: str | None = None
    #: the flux command on the target (e.g. /opt/flux-core/bin/flux); its directory goes first on jobs' PATH
    flux_command: str = "flux"
    #: environment every job starts with (a jobspec's environment is all a job gets), under the TrainJob's
    environment: dict[str, str] | None = None

    @field_validator("uri")
    @classmethod
    def _scheme(cls, uri: str | None) -> str | None:
        if uri is not None and not re.match(r"^(local|ssh)://", uri):
            raise ValueError("must start with local:// or ssh://")
        return uri


class KubernetesConnection(WireModel):
    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None


class ClusterDefaults(WireModel):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    #: how an image is run on an HPC backend; "none" runs the command on the host
    container_runtime: Literal["none", "apptainer", "singularity", "podman", "enroot"] = "none"
    workdir: str | None = None
    #: argv that starts the bootstrap on the compute nodes (default ["hpcbridge", "launch"])
    launch_command: list[str] | None = Field(default=None, min_length=1)

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_NAME.fullmatch(value):
            raise ValueError("must be a Slurm name: letters, digits and _ . + @ -")
        return value


class BridgeClusterSpec(WireModel):
    type: Literal["local", "slurm", "flux", "kubernetes"]
    slurm: SlurmConnection | None = None
    flux: FluxConnection | None = None
    kubernetes: KubernetesConnection | None = None
    defaults: ClusterDefaults = Field(default_factory=ClusterDefaults)
    #: namespaces whose TrainJobs this cluster accepts; unset means every namespace
    allowed_namespaces: list[str] | None = None
    #: namespace → Slurm account (or Flux bank) used when the TrainJob names none
    account_mapping: dict[str, str] | None = None

    @model_validator(mode="after")
    def _sections_match_type(self) -> BridgeClusterSpec:
        for section in ("slurm", "flux", "kubernetes"):
            if getattr(self, section) is not None and section != self.type:
                raise ValueError(f"section {section!r} does not belong to a cluster of type {self.type!r}")
        return self

    def allows_namespace(self, namespace: str) -> bool:
        return self.allowed_namespaces is None or namespace in self.allowed_namespaces


class BridgeCluster(WireModel):
    api_version: Literal["hpcbridge.io/v1alpha1"]
    kind: Literal["BridgeCluster"]
    metadata: ObjectMeta
    spec: BridgeClusterSpec

    @field_validator("metadata")
    @classmethod
    def _named(cls, metadata: ObjectMeta) -> ObjectMeta:
        if not metadata.name:
            raise ValueError("name is required")
        return metadata

    @property
    def name(self) -> str:
        assert self.metadata.name
        return self.metadata.name


def builtin_local_cluster() -> BridgeCluster:
    """The embedded default: runs TrainJobs on this machine, no configuration needed."""
    return BridgeCluster.model_validate(
        {"apiVersion": API_VERSION, "kind": "BridgeCluster", "metadata": {"name": "local"}, "spec": {"type": "local"}}
    )
