"""What a plan may ask for and carry, checked before any renderer runs: bounds, privileged options, the
identity every artifact writes, and free text."""

from __future__ import annotations

from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX
from bridge.api.cluster import DIRECTIVE_SAFE, PRIVILEGED_OPTIONS, BridgeCluster
from bridge.api.names import check_dns1035_label, check_dns1123_label, check_dns1123_subdomain, check_uid
from bridge.errors import InvalidSpec
from bridge.plan.model import BackendOptions, EnvEntry, LaunchPlan
from bridge.plan.traits import traits_of

#: ranks (MPI slots, torchrun workers) per node
MAX_PROCS_PER_NODE = 1_024


def check_identity(plan: LaunchPlan) -> None:
    """The values every artifact writes into comments, directives, attributes and labels, checked once more
    on the finished plan, whatever path built the objects (bridge.api.names): Kubernetes' grammars."""
    for where, value, check in (("metadata.name", plan.name, check_dns1035_label),
                                ("metadata.namespace", plan.namespace, check_dns1123_label),
                                ("metadata.uid", plan.uid, check_uid),
                                ("cluster", plan.cluster, check_dns1123_subdomain),
                                ("spec.runtimeRef.name", plan.runtime_name, check_dns1123_subdomain)):
        try:
            check(value)
        except (ValueError, TypeError) as exc:
            raise InvalidSpec(where, value, str(exc)) from None


def check_free_text(argv: tuple[str, ...], env: tuple[EnvEntry, ...]) -> None:
    """Command, arguments and env values are carried byte for byte (quoted, never interpreted), except NUL,
    which no exec argument or environment value can hold: refused rather than cut short."""
    for index, arg in enumerate(argv):
        if "\x00" in arg:
            raise InvalidSpec(f"spec.trainer.command/args[{index}]", arg, "contains a NUL character, which no "
                              "backend can carry")
    for entry in env:
        if entry.value is not None and "\x00" in entry.value:
            raise InvalidSpec(f"env {entry.name!r}.value", entry.value, "contains a NUL character, which no backend "
                              "can carry")


def check_bounds(cluster: BridgeCluster, nodes: int, nodes_field: str, procs: int, time_limit: int | None) -> None:
    """Node count, processes per node and time limit within what the backend can hold (``BackendTraits``)."""
    backend = cluster.spec.type
    traits = traits_of(cluster)
    most = traits.max_nodes
    if nodes > most:
        raise InvalidSpec(nodes_field, nodes, f"at most {most} nodes on a {backend} cluster")
    if procs > MAX_PROCS_PER_NODE:
        raise InvalidSpec("spec.trainer.numProcPerNode", procs,
                          f"at most {MAX_PROCS_PER_NODE} processes per node (derived from the runtime, the GPU or "
                          "CPU count when not given)")
    longest = traits.max_time_limit_seconds
    if time_limit is not None and longest is not None and time_limit > longest:
        raise InvalidSpec("spec.activeDeadlineSeconds", time_limit, f"at most {longest} seconds on a {backend} cluster")


def check_privileged(options: BackendOptions, cluster: BridgeCluster) -> None:
    """Batch-script options that change who the job runs as are refused unless the cluster entry allows them."""
    allowed = set(cluster.spec.defaults.allow_privileged_options)
    for option, value in options.sbatch_extra:
        if option in PRIVILEGED_OPTIONS and option not in allowed:
            raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}{option}]", value,
                              f"--{option} changes the identity or privileges the job runs with; cluster "
                              f"{cluster.name!r} does not allow it (spec.defaults.allowPrivilegedOptions)")




def check_directive_value(where: str, value: str) -> None:
    # These values land in '#SBATCH' lines: one line, and no quote characters sbatch's parser would eat.
    if not value or not DIRECTIVE_SAFE.fullmatch(value):
        raise InvalidSpec(where, value, "must be one line (at most 4096 characters) without quotes, backslashes or "
                                        "control characters")
