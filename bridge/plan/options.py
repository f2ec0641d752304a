"""Scheduler knobs: ``hpcbridge.io/*`` annotations and the cluster's defaults as BackendOptions, a converted
batch script's Slurm layout, and the sbatch options left out off Slurm."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from bridge import tenancy
from bridge.annotations import KNOBS, PREFIX, SBATCH_PASSTHROUGH_PREFIX, SLURM_LAYOUT_ANNOTATION
from bridge.api.cluster import CONSTRAINT, SLURM_NAME, BridgeCluster, Tenant
from bridge.errors import InvalidSpec, closest
from bridge.plan.limits import check_directive_value
from bridge.plan.model import BackendOptions, Launcher
from bridge.plan.traits import traits_of
from bridge.sbatch.values import array_problem

_DEPENDENCY = re.compile(r"^(singleton|[a-z_]+(:[0-9_+]+)+)([,?](singleton|[a-z_]+(:[0-9_+]+)+))*$")
#: dependencies off Slurm, on that backend's own job ids (a local uid, namespace/jobset, a Flux ƒ… id): Flux
#: keeps them (RFC 26), hpc-bridge keeps them for the local cluster and Kubernetes; all items must hold (",")
_KEPT_DEPENDENCY_ITEM = r"(singleton|(afterok|afterany|afternotok)(:[A-Za-z0-9ƒ][A-Za-z0-9ƒ._/-]{0,252})+)"
_KEPT_DEPENDENCY = re.compile(rf"^{_KEPT_DEPENDENCY_ITEM}(,{_KEPT_DEPENDENCY_ITEM})*$")


#: the options hpc-bridge states from TrainJob fields that a converted script may have left to Slurm
SLURM_LAYOUT_OPTIONS = ("nodes", "ntasks-per-node")
#: the layout annotation's word for "neither": one task, on a node Slurm picks
SLURM_LAYOUT_NONE = "none"


def parse_slurm_layout(value: str, where: str) -> tuple[str, ...]:
    """``nodes,ntasks-per-node`` (any of them, in that order) or ``none`` → the option names."""
    if value == SLURM_LAYOUT_NONE:
        return ()
    names = tuple(value.split(","))
    if not names or any(name not in SLURM_LAYOUT_OPTIONS for name in names) or len(set(names)) != len(names):
        raise InvalidSpec(where, value, f"must be {SLURM_LAYOUT_NONE!r} or a comma-separated list of "
                                        f"{', '.join(SLURM_LAYOUT_OPTIONS)}")
    return tuple(name for name in SLURM_LAYOUT_OPTIONS if name in names)


def slurm_layout_text(names: Iterable[str]) -> str:
    """The layout annotation's value for these option names (``parse_slurm_layout`` reads it back)."""
    given = [name for name in SLURM_LAYOUT_OPTIONS if name in set(names)]
    return ",".join(given) or SLURM_LAYOUT_NONE


def slurm_layout_counts(min_nodes: int | None, ntasks: int | None, per_node: int | None) -> tuple[int, int]:
    """(nodes, tasks per node) a TrainJob records for sbatch's ``--nodes`` minimum, ``--ntasks`` and
    ``--ntasks-per-node`` (None: not given). Without ``--nodes`` Slurm picks the count: at least
    ntasks / ntasks-per-node nodes when both are given (``-n 16 --ntasks-per-node=4`` is 4 nodes), else one as
    far as the TrainJob can say; without ``--ntasks-per-node`` the tasks are spread over that minimum."""
    nodes = min_nodes if min_nodes is not None else -(-ntasks // per_node) if ntasks and per_node else 1
    procs = per_node if per_node is not None else -(-ntasks // nodes) if ntasks else 1
    return nodes, procs


def checked_slurm_layout(value: str | None, options: BackendOptions, cluster: BridgeCluster, launcher: Launcher,
                  nodes: int, procs: int, nodes_field: str) -> tuple[str, ...] | None:
    """A converted script's own layout (``hpcbridge.io/slurm-layout``) on Slurm, checked against the fields: a
    numNodes or numProcPerNode the layout would not ask Slurm for is refused, never dropped. Elsewhere the
    fields alone say what runs."""
    if value is None or not traits_of(cluster).takes_sbatch_options:
        return None
    where = f"metadata.annotations[{SLURM_LAYOUT_ANNOTATION}]"
    names = parse_slurm_layout(value, where)
    if launcher != Launcher.SCRIPT:
        raise InvalidSpec(where, value, "only a batch script (runtime sbatch-script) has a Slurm layout of its own; "
                                        "remove the annotation")
    extra = dict(options.sbatch_extra)
    ntasks = int(extra["ntasks"]) if extra.get("ntasks", "").isdigit() else None
    given_range = extra.get("nodes")
    if given_range is not None:
        from bridge.sbatch.values import BadValue, node_range

        try:
            min_nodes: int | None = node_range(given_range)[0]
        except BadValue:
            min_nodes = None  # check_passthrough refused it already
    else:
        min_nodes = nodes if "nodes" in names else None
    want_nodes, want_procs = slurm_layout_counts(min_nodes, ntasks, procs if "ntasks-per-node" in names else None)
    said = " ".join(f"--{name}" for name in names) or "no --nodes or --ntasks-per-node"
    if given_range is not None and min_nodes is not None and nodes != min_nodes:
        raise InvalidSpec(nodes_field, nodes, f"the job asks Slurm for --nodes={given_range} "
                          f"({SBATCH_PASSTHROUGH_PREFIX}nodes), at least {min_nodes}; make them agree")
    if nodes != want_nodes:
        raise InvalidSpec(nodes_field, nodes, f"{where} says the script gave {said}, so Slurm picks the node count "
                          f"(at least {want_nodes}); remove the annotation to ask Slurm for exactly {nodes} nodes")
    if procs != want_procs:
        total = f"--ntasks={ntasks} over {nodes} node(s)" if ntasks else "one task"
        raise InvalidSpec("spec.trainer.numProcPerNode", procs, f"{where} says the script gave {said}, so Slurm "
                          f"places {total} ({want_procs} per node); remove the annotation to ask Slurm for "
                          f"--ntasks-per-node={procs}")
    return names


# --- annotations → backend options ---------------------------------------------------------------------

#: how a converted batch script spelled its GPU request (``gres=gpu:2``): Slurm re-emits it, since
#: Slurm's job environment differs by spelling (SLURM_GPUS_PER_NODE); other backends read the count
SLURM_GPU_OPTIONS = ("gres", "gpus", "gpus-per-node")


#: sbatch options that change nothing about what a job computes, the resources it gets, when or where it runs,
#: or where its output goes: off Slurm (local, Flux, Kubernetes) each is left out with one note saying why,
#: instead of refusing a script for its mail line. Every other sbatch option off Slurm is mapped to a TrainJob
#: field or scheduler knob the backend declares, or refused naming it. The same list is documented in README.md
#: ("Moving from Slurm") and docs/sbatch-anywhere.md.
SBATCH_DROPPED_OFF_SLURM: Mapping[str, str] = {
    "comment": "a note Slurm keeps with the job record; the job never reads it",
    "mail-type": "when Slurm mails about the job's state; nothing is mailed here and the job runs the same",
    "mail-user": "whom Slurm mails about the job's state; nothing is mailed here and the job runs the same",
    "nice": "the job's place in Slurm's queue; the job runs the same whenever it starts",
    "requeue": "whether Slurm may rerun the job after a node failure or preemption; here a job is never rerun",
    "no-requeue": "that Slurm must not rerun the job after a node failure or preemption; here a job is never rerun",
    "kill-on-invalid-dep": "what Slurm does with a job whose dependency can no longer hold (cancel it or leave it "
                           "pending); either way it never runs, and here it is never sent",
    "acctg-freq": "how often Slurm samples the job's usage for accounting; the job runs the same",
    "profile": "which usage profiles Slurm's profiling plugin records; the job runs the same",
    "wckey": "the workload characterization key Slurm accounts the job under; the job runs the same",
    "verbose": "how much sbatch itself prints; the job runs the same",
    "quiet": "how much sbatch itself prints; the job runs the same",
    "ignore-pbs": "tells sbatch to skip #PBS lines, which hpc-bridge never reads",
}
#: values that say only what a job gets off Slurm anyway, so they are left out with a note like the options above
_DROPPED_VALUES: Mapping[str, tuple[frozenset[str], str]] = {
    "export": (frozenset({"all"}), "sbatch's default said outright: the job gets the environment it gets "
                                   "without this line"),
    "time": (frozenset({"unlimited", "infinite", "-1"}), "no time limit, and the TrainJob sets none "
                                                         "(no activeDeadlineSeconds)"),
}


def dropped_note(where: str, option: str, value: str, why: str, cluster: str, backend: str) -> str:
    """The one note a dropped sbatch option gets, naming it by *where* (its annotation, or its #SBATCH line)."""
    from bridge.sbatch.options import passthrough_value

    written = passthrough_value(option, value)
    shown = f"--{option}" if written is None else f"--{option}={written}"
    return f"{where}: {shown} dropped on cluster {cluster!r} ({backend}): {why}"


def drop_slurm_only(options: BackendOptions, cluster: BridgeCluster, nodes: int, procs: int) -> BackendOptions:
    """Off Slurm: the sbatch options that change nothing about the job left out (``dropped``, one note each),
    and a converted script's Slurm spellings of what numNodes and numProcPerNode already say (``--ntasks``, a
    ``--nodes`` range) too; a total the fields cannot say is refused. Everything else stays, for the adapter to
    map or refuse by name. Tenancy's allowlist was applied before: a tenant may not pass what it may not drop."""
    if traits_of(cluster).takes_sbatch_options or not options.sbatch_extra:
        return options
    kept: list[tuple[str, str]] = []
    dropped: list[tuple[str, str, str]] = []
    for option, value in options.sbatch_extra:
        why = SBATCH_DROPPED_OFF_SLURM.get(option)
        if why is None and option in _DROPPED_VALUES and value.lower() in _DROPPED_VALUES[option][0]:
            why = _DROPPED_VALUES[option][1]
        if why is None and option == "open-mode" and options.output is None and options.error is None:
            why = ("whether Slurm appends to or truncates output files; here the job's output is a log of its own, "
                   "new for each job, so both write the same")
        if why is None and option == "ntasks":
            why = _ntasks_here(value, nodes, procs, cluster)
        if why is None and option == "nodes":
            why = _node_range_here(value, nodes)
        if why is None:
            kept.append((option, value))
        else:
            dropped.append((option, value, why))
    return replace(options, sbatch_extra=tuple(kept), dropped=tuple(dropped))


def _ntasks_here(value: str, nodes: int, procs: int, cluster: BridgeCluster) -> str | None:
    """A script's total task count off Slurm: what numNodes x numProcPerNode already says, or refused."""
    if not value.isdigit():
        return None
    if int(value) != nodes * procs:
        raise InvalidSpec(f"metadata.annotations[{SBATCH_PASSTHROUGH_PREFIX}ntasks]", value,
                          f"cluster {cluster.name!r} ({cluster.spec.type}) runs the same number of tasks on every "
                          f"node: {nodes} node(s) x {procs} is {nodes * procs}, not {value}; give a task count "
                          "the node count divides, or pick a Slurm cluster")
    return f"the total numNodes x numProcPerNode gives ({nodes} x {procs}); the job runs {value} tasks here too"


def _node_range_here(value: str, nodes: int) -> str | None:
    """A script's node range off Slurm: the job runs on numNodes, the range's minimum, which the range allows."""
    from bridge.sbatch.values import BadValue, node_range

    try:
        low, high = node_range(value)
    except BadValue:
        return None
    if not low <= nodes <= high:
        return None
    return (f"a node count Slurm picks within the range; here the job runs on numNodes ({nodes}), which the "
            "range allows")


def backend_options(annotations: Mapping[str, str], cluster: BridgeCluster, namespace: str,
                    tenant: Tenant | None = None) -> BackendOptions:
    """The ``hpcbridge.io/*`` annotations checked and read, with the cluster's defaults (and for *tenant* its
    mapping) filling in the rest."""
    values: dict[str, Any] = {}
    extra: list[tuple[str, str]] = []
    for key, value in sorted(annotations.items()):
        if not key.startswith(PREFIX):
            continue
        where = f"metadata.annotations[{key}]"
        if key.startswith(SBATCH_PASSTHROUGH_PREFIX):
            option = key[len(SBATCH_PASSTHROUGH_PREFIX):]
            _check_passthrough(where, option, value, tenant)
            extra.append((option, value))
            continue
        knob = key[len(PREFIX):]
        _check_knob(where, knob, value, cluster)
        values[knob.replace("-", "_")] = value
    account, partition, qos = _account_partition_qos(values, cluster, namespace, tenant)
    return BackendOptions(
        partition=partition,
        account=account,
        qos=qos,
        constraint=values.get("constraint") or cluster.spec.defaults.constraint,
        exclusive=values.get("exclusive") == "true",
        array=values.get("array"),
        dependency=values.get("dependency"),
        output=values.get("output"),
        error=values.get("error"),
        sbatch_extra=tuple(extra),
        slurm_job_name=values.get("slurm_job_name"),
    )


def _check_passthrough(where: str, option: str, value: str, tenant: Tenant | None) -> None:
    """An ``hpcbridge.io/sbatch.<option>`` annotation: an sbatch option sbatch would take, and the tenant's to pass."""
    # the parser builds sbatch's option table on import: only when an option is passed through
    from bridge.sbatch.options import check_passthrough

    if not re.fullmatch(r"[a-z][a-z0-9-]*", option):
        raise InvalidSpec(where, option, "not an sbatch long option name")
    check_directive_value(where, value)
    check_passthrough(option, value, where)
    if tenant is not None:
        tenancy.check_passthrough(option, value, tenant)


def _check_knob(where: str, knob: str, value: str, cluster: BridgeCluster) -> None:
    """One of hpc-bridge's own annotations (``KNOBS``), in the grammar the backend reads it in."""
    if knob not in KNOBS:
        close = closest(knob, KNOBS)
        hint = f"did you mean {PREFIX + close!r}?" if close else ""
        raise InvalidSpec(where, value, f"unknown hpc-bridge annotation; {hint + ' ' if hint else ''}known: "
                                        f"{', '.join(KNOBS)}")
    if knob in ("partition", "account", "qos"):
        if not SLURM_NAME.fullmatch(value):
            raise InvalidSpec(where, value, "must be a Slurm name: letters, digits and _ . + @ -")
    elif knob == "constraint":
        if not CONSTRAINT.fullmatch(value):
            raise InvalidSpec(where, value, "not a Slurm constraint expression")
    elif knob == "exclusive":
        if value not in ("true", "false"):
            raise InvalidSpec(where, value, "must be \"true\" or \"false\"")
    elif knob == "array":
        problem = array_problem(value)
        if problem:
            raise InvalidSpec(where, value, problem)
    elif knob == "dependency":
        _check_dependency(where, value, cluster)
    elif knob in ("output", "error", "workdir", "slurm-job-name"):
        check_directive_value(where, value)
    elif knob == "checkpoint-dir":
        # where a moved job resumes (hpcbridge migrate): shared storage both clusters see, by one path
        if not value.startswith("/") or "\n" in value or "\x00" in value:
            raise InvalidSpec(where, value, "must be an absolute path on storage the clusters share")
    elif knob == "slurm-gpus":
        _check_slurm_gpus(where, value)


def _check_dependency(where: str, value: str, cluster: BridgeCluster) -> None:
    """A dependency on the backend's own job ids where it keeps them, else in Slurm's grammar."""
    traits = traits_of(cluster)
    if traits.own_job_dependencies:
        if not _KEPT_DEPENDENCY.fullmatch(value):
            raise InvalidSpec(where, value, "not a dependency like afterok:JOB[:JOB] (afterok, afterany, "
                                            "afternotok; items joined by ,) or singleton")
        if not traits.singleton_dependency and "singleton" in value.split(","):
            raise InvalidSpec(where, value, "Flux has no singleton dependency (RFC 26: after, afterany, "
                                            "afterok, afternotok)")
    elif not _DEPENDENCY.fullmatch(value):
        raise InvalidSpec(where, value, "not a dependency like afterok:123 or singleton")


def _check_slurm_gpus(where: str, value: str) -> None:
    """A converted script's GPU option as sbatch takes it (``gres=…``, ``gpus=…``, ``gpus-per-node=…``)."""
    from bridge.sbatch.options import check_passthrough

    option, eq, spelled = value.partition("=")
    if option not in SLURM_GPU_OPTIONS or not eq or not spelled:
        raise InvalidSpec(where, value, "must be gres=…, gpus=… or gpus-per-node=…, as sbatch takes it")
    check_directive_value(where, spelled)
    check_passthrough(option, spelled, where)


def _account_partition_qos(values: Mapping[str, Any], cluster: BridgeCluster, namespace: str,
                           tenant: Tenant | None) -> tuple[str | None, str | None, str | None]:
    """The annotations' account, partition and QOS, else the cluster's for the namespace; a tenant's only
    within its mapping."""
    defaults = cluster.spec.defaults
    mapped_account = (cluster.spec.account_mapping or {}).get(namespace)
    if tenant is None:
        return (values.get("account") or mapped_account or defaults.account,
                values.get("partition") or defaults.partition, values.get("qos") or defaults.qos)
    # a tenant's annotations are requests: within its mapping, never over the cluster's accountMapping
    account = tenancy.choose("account", values.get("account"), tenant.accounts, mapped_account or defaults.account,
                             tenant, cluster)
    partition = tenancy.choose("partition", values.get("partition"), tenant.partitions, defaults.partition, tenant,
                               cluster)
    qos = tenancy.choose("qos", values.get("qos"), tenant.qos, defaults.qos, tenant, cluster)
    return account, partition, qos
