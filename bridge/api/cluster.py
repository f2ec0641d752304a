"""BridgeCluster (``hpcbridge.io/v1alpha1``): where a TrainJob can run and how hpc-bridge reaches it.

In Kubernetes it is a cluster-scoped object; for the CLI the same objects come from a config file.
"""

import re
from typing import Annotated, Literal, Self

from pydantic import AfterValidator, Field, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic_core import PydanticCustomError

from bridge.api.base import WireModel
from bridge.api.k8s import ObjectMeta
from bridge.api.names import (
    check_dns1123_label,
    check_dns1123_subdomain,
    check_host,
    check_label_value,
    check_one_line,
    check_user_name,
)
from bridge.backends import REGISTRY

API_VERSION = "hpcbridge.io/v1alpha1"

# Slurm partition/account/qos names: what slurm.conf and sacctmgr accept in practice. Kept strict because
# these values end up in #SBATCH lines, which cannot carry a newline or a quote safely.
SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+@-]{1,128}$")
#: a Slurm constraint expression (features, & | [ ] ( ) * counts); no blanks, quotes or control characters
CONSTRAINT = re.compile(r"^[A-Za-z0-9_&|\[\]()*:,.=-]{1,1024}$")
#: a value written into a '#SBATCH' line as is: one line, no quotes or backslashes sbatch's parser would eat
DIRECTIVE_SAFE = re.compile(r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029\"'\\]{1,4096}$")
#: batch-script options that change the identity or the privileges a job runs with; refused unless the
#: cluster entry names them in ``defaults.allowPrivilegedOptions``
PRIVILEGED_OPTIONS = ("uid", "gid", "get-user-env")
PrivilegedOption = Literal["uid", "gid", "get-user-env"]


def _path(value: str | None) -> str | None:
    """A file path from the config: one line, no control characters."""
    return None if value is None else check_one_line(value, "a path")


class SecretKeyRef(WireModel):
    name: str
    key: str
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_dns1123_subdomain(name)

    @field_validator("key")
    @classmethod
    def _key(cls, key: str) -> str:
        if not re.fullmatch(r"[-._A-Za-z0-9]{1,253}", key):
            raise ValueError("must be a Secret key: letters, digits, '-', '_' and '.'")
        return key

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, namespace: str | None) -> str | None:
        return None if namespace is None else check_dns1123_label(namespace)


class _Remote(WireModel):
    """Fields every connection over SSH shares: host, port, user, key files."""

    @field_validator("host", check_fields=False)
    @classmethod
    def _host(cls, host: str | None) -> str | None:
        return None if host is None else check_host(host)

    @field_validator("user", check_fields=False)
    @classmethod
    def _user(cls, user: str | None) -> str | None:
        return None if user is None else check_user_name(user)

    @field_validator("key_file", "known_hosts_file", "token_file", "slurm_conf", "flux_command", "kubeconfig",
                     check_fields=False)
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return _path(value)


class SlurmConnection(_Remote):
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
    #: the slurmrestd API to speak (e.g. v0.0.42); unset, the newest the server and hpc-bridge both speak.
    #: Pinned, rendering needs no answer from the server, and upgrading slurmrestd cannot change the job
    rest_api_version: str | None = Field(default=None, pattern=r"^v0\.0\.(38|4[0-5])$")

    @field_validator("rest_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not re.fullmatch(r"https?://[^\x00-\x20\x7f\"'\\]+", url):
            raise ValueError("must be an http:// or https:// URL without blanks, quotes or control characters")
        return url

    @model_validator(mode="after")
    def _transport_needs(self) -> Self:
        if self.transport == "ssh" and not self.host:
            raise ValueError("transport ssh needs host")
        if self.transport == "rest" and not self.rest_url:
            raise ValueError("transport rest needs restUrl")
        return self


class FluxConnection(_Remote):
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
        if uri is not None and not re.match(r"^(local|ssh)://[^\x00-\x20\x7f]*$", uri):
            raise ValueError("must start with local:// or ssh:// (one word, no control characters)")
        return uri

    @field_validator("environment")
    @classmethod
    def _environment(cls, env: dict[str, str] | None) -> dict[str, str] | None:
        for name, value in (env or {}).items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"environment name {name!r} must be a shell variable name (letters, digits, _)")
            if "\x00" in value:
                raise ValueError(f"environment value of {name} contains a NUL character")
        return env


#: volume kinds a pod policy names: "other" is every kind not named here or always allowed (nfs, csi, iscsi,
#: ephemeral, image…); emptyDir and downwardAPI are always allowed
POD_VOLUME_KINDS = ("secret", "configMap", "persistentVolumeClaim", "projected", "hostPath", "other")


class PodPolicy(WireModel):
    """What the pod templates of a JobSet may ask for (``spec.kubernetes.podPolicy``), checked on every
    replicated job's pods, init containers included, before anything is created; what it forbids is refused
    naming the field. The defaults are the policy of a cluster that declares none: nothing privileged, no host
    namespaces or ports, no added capabilities, no explicit root, no ServiceAccount but the namespace's
    ``default``, no hostPath or other node-level volume; the namespace's Secrets, ConfigMaps and PVCs (volumes,
    env ``valueFrom``/``envFrom``, imagePullSecrets, an initializer's ``secretRef`` and ``pvc://``) only where
    the JobSet runs in the TrainJob's own namespace. hpc-bridge's own objects (the MPI SSH Secret, the hostfile
    ConfigMap) are not the tenant's and always pass."""

    #: ServiceAccounts a pod may name besides ``default`` (``"*"``: any of the namespace's)
    service_account_names: list[str] = Field(default_factory=list, max_length=256)
    #: volume kinds allowed wherever the JobSet runs: hostPath and "other" only when listed; secret, configMap,
    #: persistentVolumeClaim and projected listed also in a namespace shared by tenants (env and initializer
    #: references follow secret, configMap and persistentVolumeClaim)
    volumes: list[Literal["secret", "configMap", "persistentVolumeClaim", "projected", "hostPath", "other"]] = \
        Field(default_factory=list)
    #: privileged containers (and Windows hostProcess, procMount Unmasked)
    privileged: bool = False
    allow_privilege_escalation: bool = False
    #: hostNetwork, and hostPort on a container's ports
    host_network: bool = False
    host_pid: bool = Field(default=False, alias="hostPID")
    host_ipc: bool = Field(default=False, alias="hostIPC")
    #: capabilities a container may add (``IPC_LOCK``, with or without ``CAP_``); ``"*"``: any
    capabilities: list[str] = Field(default_factory=list, max_length=64)
    #: whether a pod or container may ask for root: ``runAsUser: 0`` or ``runAsNonRoot: false``
    run_as_root: bool = False

    @field_validator("service_account_names")
    @classmethod
    def _accounts(cls, names: list[str]) -> list[str]:
        return [name if name == "*" else check_dns1123_subdomain(name) for name in names]

    @field_validator("capabilities")
    @classmethod
    def _capabilities(cls, names: list[str]) -> list[str]:
        for name in names:
            if name != "*" and not re.fullmatch(r"(CAP_)?[A-Z][A-Z0-9_]{0,63}", name):
                raise ValueError(f"capability {name!r}: an upper-case capability name such as IPC_LOCK, or '*'")
        return names


class KubernetesConnection(_Remote):
    in_cluster: bool = False
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    #: this cluster's copy of an image a runtime or TrainJob names (an air-gapped mirror, a local build):
    #: every container whose image is a key here runs the value instead
    images: dict[str, str] = Field(default_factory=dict, max_length=256)
    #: imagePullPolicy written on every container (e.g. Never where images are preloaded on the nodes)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    #: the gang scheduler this cluster runs: a runtime's podGroupPolicy of that kind gets its PodGroup, any other
    #: is refused (never dropped)
    gang_scheduler: Literal["coscheduling", "volcano"] | None = None
    #: the pods' schedulerName under the gang scheduler (default: none for coscheduling, which Kubeflow leaves
    #: to the cluster's default scheduler profile; "volcano" for Volcano)
    scheduler_name: str | None = None
    #: the Kueue LocalQueue a JobSet is queued in when neither submit --queue nor the TrainJob's
    #: kueue.x-k8s.io/queue-name label names one
    queue: str | None = None
    #: what the JobSets' pod templates may ask for; unset: PodPolicy's restrictive defaults
    pod_policy: PodPolicy | None = None

    @field_validator("images")
    @classmethod
    def _images(cls, images: dict[str, str]) -> dict[str, str]:
        for name, image in images.items():
            for value in (name, image):
                if not value or len(value) > 512 or any(c.isspace() for c in value):
                    raise ValueError(f"image names are one word without whitespace: {value!r}")
        return images

    @field_validator("scheduler_name")
    @classmethod
    def _scheduler_name(cls, value: str | None) -> str | None:
        return None if value is None else check_dns1123_subdomain(value)

    @field_validator("queue")
    @classmethod
    def _queue(cls, value: str | None) -> str | None:
        return None if value is None else check_label_value(value)

    @field_validator("context")
    @classmethod
    def _context(cls, context: str | None) -> str | None:
        return None if context is None else check_one_line(context)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, namespace: str | None) -> str | None:
        return None if namespace is None else check_dns1123_label(namespace)


class ClusterDefaults(WireModel):
    #: kubernetes: the image a job runs in when neither its TrainJob nor its runtime names one (a batch script
    #: without a ``#HPCBRIDGE --image=`` line)
    image: str | None = Field(default=None, min_length=1, max_length=512, pattern=r"^\S+$")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    #: how an image is run on an HPC backend; "none" runs the command on the host
    container_runtime: Literal["none", "apptainer", "singularity", "podman", "enroot"] = "none"
    workdir: str | None = None
    #: argv that starts the bootstrap on the compute nodes (default ["hpcbridge", "launch"])
    launch_command: list[str] | None = Field(default=None, min_length=1, max_length=64)
    #: batch-script options that change identity or privilege (``--uid``, ``--gid``, ``--get-user-env``) that
    #: TrainJobs and batch scripts may pass to this cluster; none unless listed
    allow_privileged_options: list[PrivilegedOption] = Field(default_factory=list)
    #: Kubernetes-only fields (``nodeSelector``, ``tolerations``, ``image``…, or ``"*"``) that this cluster must
    #: honour: a TrainJob that sets one is refused here instead of run with a note that it was not honoured
    must_honour: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("partition", "account", "qos")
    @classmethod
    def _slurm_name(cls, value: str | None) -> str | None:
        if value is not None and not SLURM_NAME.fullmatch(value):
            raise ValueError("must be a Slurm name: letters, digits and _ . + @ -")
        return value

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        if value is not None and not CONSTRAINT.fullmatch(value):
            raise ValueError("not a Slurm constraint expression (features joined by & or |, no blanks or quotes)")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        if value is not None and not DIRECTIVE_SAFE.fullmatch(value):
            raise ValueError("must be one line without quotes, backslashes or control characters")
        return value

    @field_validator("launch_command")
    @classmethod
    def _launch_command(cls, argv: list[str] | None) -> list[str] | None:
        for index, arg in enumerate(argv or []):
            if "\x00" in arg or (index == 0 and not arg):
                raise ValueError(f"item {index}: an argument may not be empty or contain a NUL character")
        return argv


class TenantCredentials(WireModel):
    """A tenant's own credentials, from Secrets in the operator's namespace (never the tenant's)."""

    #: ssh transport: the private key that logs in as the tenant's user
    key_secret_ref: SecretKeyRef | None = None
    #: rest transport: a JWT of the tenant's user; without it the cluster's token (the SlurmUser's) acts for
    #: the tenant's user, which slurmrestd allows only to SlurmUser and root
    token_secret_ref: SecretKeyRef | None = None


class NamespaceSelector(WireModel):
    """Namespaces by their labels (labels tenants cannot set: a Namespace is the cluster admin's)."""

    match_labels: dict[str, str] = Field(min_length=1, max_length=32)

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            prefix, _, name = key.rpartition("/")
            if prefix:
                check_dns1123_subdomain(prefix)
            if not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", name):
                raise ValueError(f"label key {key!r} is not a Kubernetes label name")
            check_label_value(value)
        return labels


SlurmName = Annotated[str, Field(pattern=SLURM_NAME.pattern)]


class Tenant(WireModel):
    """Who a set of namespaces is on this cluster: one HPC identity, and what it may ask for.

    The operator runs a namespace's TrainJobs only through the tenant that maps it; a namespace no tenant maps
    is refused. Accounts, partitions and QOS: the first is the default, a TrainJob may pick another listed one,
    nothing else; an empty list leaves the cluster's default and no choice."""

    name: str
    namespaces: list[str] = Field(default_factory=list, max_length=1024)
    namespace_selector: NamespaceSelector | None = None
    #: slurm and flux: the Unix user the tenant's jobs run as (and every command for them runs as). Unset: the
    #: cluster's own connection identity, which the admin thereby shares with the tenant on purpose
    user: str | None = None
    accounts: list[SlurmName] = Field(default_factory=list, max_length=256)
    partitions: list[SlurmName] = Field(default_factory=list, max_length=256)
    qos: list[SlurmName] = Field(default_factory=list, max_length=256)
    credentials: TenantCredentials | None = None
    #: kubernetes: the namespace the tenant's JobSets are created in (default: the TrainJob's own)
    target_namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return check_dns1123_label(name)

    @field_validator("namespaces")
    @classmethod
    def _namespaces(cls, namespaces: list[str]) -> list[str]:
        for namespace in namespaces:
            check_dns1123_label(namespace)
        return namespaces

    @field_validator("user")
    @classmethod
    def _user(cls, user: str | None) -> str | None:
        if user is not None:
            check_user_name(user)
            if user == "root":
                raise ValueError("a tenant never runs as root")
        return user

    @field_validator("target_namespace")
    @classmethod
    def _target(cls, namespace: str | None) -> str | None:
        return None if namespace is None else check_dns1123_label(namespace)

    @model_validator(mode="after")
    def _maps_something(self) -> Self:
        if not self.namespaces and self.namespace_selector is None:
            raise ValueError(f"tenant {self.name}: give namespaces or namespaceSelector")
        return self

    def maps(self, namespace: str, labels: dict[str, str] | None) -> bool:
        if namespace in self.namespaces:
            return True
        selector = self.namespace_selector
        return selector is not None and all((labels or {}).get(k) == v for k, v in selector.match_labels.items())


def _registered_backend(value: str) -> str:
    """A backend of the registry, read when the object is validated: a backend added by its registry line is a
    cluster type at once. Refused with the error (and wording) a ``Literal`` of the names would give."""
    if value not in REGISTRY:
        names = [repr(name) for name in REGISTRY]
        expected = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
    return value


#: a BridgeCluster's ``spec.type``: a name in bridge.backends.REGISTRY (the CRD's enum is the registry's names)
BackendName = Annotated[str, AfterValidator(_registered_backend),
                        WithJsonSchema({"type": "string", "enum": list(REGISTRY)})]


class BridgeClusterSpec(WireModel):
    type: BackendName
    slurm: SlurmConnection | None = None
    flux: FluxConnection | None = None
    kubernetes: KubernetesConnection | None = None
    defaults: ClusterDefaults = Field(default_factory=ClusterDefaults)
    #: namespaces whose TrainJobs this cluster accepts under its own single identity (one Unix user for all of
    #: them). The CLI checks it when set; the operator serves only namespaces listed here or mapped by ``tenants``
    #: (unset: none)
    allowed_namespaces: list[str] | None = None
    #: the operator's tenants: each maps namespaces to an HPC identity of its own (see Tenant)
    tenants: list[Tenant] | None = Field(default=None, max_length=1024)
    #: namespace → Slurm account (or Flux bank) used when the TrainJob names none
    account_mapping: dict[str, str] | None = None
    #: local: the GPUs this machine lends its emulated nodes (device ids as CUDA_VISIBLE_DEVICES takes them);
    #: unset: the inherited CUDA_VISIBLE_DEVICES, else what nvidia-smi -L (or /proc/driver/nvidia) lists
    gpus: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")]] | None = Field(default=None, max_length=1024)
    #: slurm, flux, local: a directory on storage every node of the cluster shares, where initializers stage
    #: datasets and models (its ``cache/``, shared by every job) before the trainer starts. Unset on the local
    #: cluster: ``$XDG_STATE_HOME/hpcbridge/staging``; unset elsewhere: a TrainJob with an initializer is refused
    staging_dir: str | None = None
    #: slurm, flux, local: where an initializer's ``secretRef`` is read on the node, as ``<secretsDir>/<name>``
    #: (``KEY=value`` lines, readable by its owner only); default ``~/.config/hpcbridge/secrets``
    secrets_dir: str | None = None

    @field_validator("staging_dir", "secrets_dir")
    @classmethod
    def _shared_path(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        if not DIRECTIVE_SAFE.fullmatch(value):
            raise ValueError("must be one line without quotes, backslashes or control characters")
        # the stage step expands ~ in secretsDir on the node; stagingDir also becomes the trainer's paths
        if not (value.startswith("/") or (info.field_name == "secrets_dir" and value.startswith("~/"))):
            raise ValueError("must be an absolute path: every node reads it from its own working directory")
        if info.field_name == "staging_dir" and ("," in value or ":" in value):
            raise ValueError("must not contain ',' or ':' (a container runtime's bind mount separators)")
        return value

    @field_validator("allowed_namespaces")
    @classmethod
    def _namespaces(cls, namespaces: list[str] | None) -> list[str] | None:
        for namespace in namespaces or []:
            check_dns1123_label(namespace)
        return namespaces

    @field_validator("account_mapping")
    @classmethod
    def _accounts(cls, mapping: dict[str, str] | None) -> dict[str, str] | None:
        for namespace, account in (mapping or {}).items():
            try:
                check_dns1123_label(namespace)
            except ValueError as exc:
                raise ValueError(f"namespace {namespace!r}: {exc}") from None
            if not SLURM_NAME.fullmatch(account):
                raise ValueError(f"account {account!r} for namespace {namespace}: must be a Slurm name: letters, "
                                 "digits and _ . + @ -")
        return mapping

    @model_validator(mode="after")
    def _sections_match_type(self) -> Self:
        for section in ("slurm", "flux", "kubernetes"):
            if getattr(self, section) is not None and section != self.type:
                raise ValueError(f"section {section!r} does not belong to a cluster of type {self.type!r}")
        if self.gpus is not None and self.type != "local":
            raise ValueError(f"gpus is the local cluster's own list; a {self.type} cluster's scheduler knows its GPUs")
        if self.type == "kubernetes" and (self.staging_dir or self.secrets_dir):
            raise ValueError("stagingDir and secretsDir are for Slurm, Flux and local clusters; on Kubernetes the "
                             "runtime's initializer volume holds the data and secretRef names a Secret")
        self._check_tenants()
        if self.defaults.image is not None and self.type != "kubernetes":
            raise ValueError(f"defaults.image is the image of pods that name none; a {self.type} cluster runs "
                             "commands on its nodes (a TrainJob's own image with defaults.containerRuntime)")
        return self

    def _check_tenants(self) -> None:
        if self.type == "flux" and self.allowed_namespaces and len(self.allowed_namespaces) > 1:
            raise ValueError("a Flux instance runs every job as its owner: it serves one tenant (one namespace in "
                             "allowedNamespaces, or one entry of tenants)")
        if not self.tenants:
            return
        if self.allowed_namespaces is not None:
            raise ValueError("give tenants (an identity per tenant) or allowedNamespaces (one identity for all), "
                             "not both")
        if self.type == "local":
            raise ValueError("a local cluster runs on the machine of whoever runs hpc-bridge: it has no tenants")
        if self.type == "flux" and len(self.tenants) > 1:
            raise ValueError("a Flux instance runs every job as its owner: it serves one tenant")
        names: set[str] = set()
        claimed: dict[str, str] = {}
        for tenant in self.tenants:
            where = f"tenant {tenant.name}"
            if tenant.name in names:
                raise ValueError(f"{where}: two tenants of that name")
            names.add(tenant.name)
            for namespace in tenant.namespaces:
                if namespace in claimed:
                    raise ValueError(f"{where}: namespace {namespace} is already tenant {claimed[namespace]}'s")
                claimed[namespace] = tenant.name
            credentials = tenant.credentials or TenantCredentials()
            if self.type == "kubernetes":
                if tenant.user or tenant.accounts or tenant.partitions or tenant.qos or tenant.credentials:
                    raise ValueError(f"{where}: user, accounts, partitions, qos and credentials are for Slurm and "
                                     "Flux clusters; a Kubernetes tenant has targetNamespace")
                continue
            if tenant.target_namespace:
                raise ValueError(f"{where}: targetNamespace is for Kubernetes clusters")
            transport = self.slurm.transport if self.slurm else ("local" if self.type == "slurm" else None)
            if self.type == "flux":
                if tenant.partitions or tenant.qos or credentials.token_secret_ref or credentials.key_secret_ref:
                    raise ValueError(f"{where}: a Flux tenant has user and accounts (banks) only")
                if self.flux and self.flux.user and self.flux.user != tenant.user:
                    raise ValueError(f"{where}: user {tenant.user} is not the instance's owner {self.flux.user}")
            if transport == "ssh" and tenant.user and not credentials.key_secret_ref:
                raise ValueError(f"{where}: credentials.keySecretRef is required over ssh (the key that logs in as "
                                 f"{tenant.user})")
            if credentials.key_secret_ref and transport != "ssh":
                raise ValueError(f"{where}: credentials.keySecretRef is for the ssh transport")
            if credentials.token_secret_ref and transport != "rest":
                raise ValueError(f"{where}: credentials.tokenSecretRef is for the rest transport")

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
