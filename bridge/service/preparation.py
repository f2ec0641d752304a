"""Input → plan → artifact for one cluster: everything decided before anything is sent."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bridge.annotations import QUEUE_LABEL, WORKDIR_ANNOTATION
from bridge.errors import InvalidSpec
from bridge.service import targets
from bridge.service.inputs import Input, queued, read_input

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, Artifact
    from bridge.api.cluster import BridgeCluster
    from bridge.api.loader import Resource
    from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
    from bridge.api.trainjob import TrainJob
    from bridge.plan import LaunchPlan
    from bridge.tenancy import Request as TenantRequest


@dataclass(frozen=True)
class Prepared:
    """A TrainJob resolved for one cluster and rendered: ``artifact`` is exactly what submit sends."""

    adapter: Adapter
    plan: LaunchPlan
    artifact: Artifact
    notes: tuple[str, ...] = ()
    #: the runtime and the TrainJob as they ran (uid set): kept at submit, so ``migrate`` can run it elsewhere
    objects: tuple[Resource, ...] = ()
    #: a job array on a backend without arrays: its elements, each a job of its own (bridge.plan.array_elements);
    #: ``artifact`` then shows them all, and ``submit_array`` sends them
    elements: tuple[Prepared, ...] = ()
    #: the array's ``%`` limit: at most this many elements unfinished at once (None: all at once)
    array_limit: int | None = None
    #: a dependency the backend cannot hold (the local cluster, Kubernetes): ``submit`` waits for it, then sends
    waits_for: str | None = None
    #: its uid was made for this submission (a batch script's): no job can carry it yet
    fresh_uid: bool = False
    #: the job its uid was last recorded with on this cluster (the operator's annotation): where the lookup by
    #: uid looks first, never taken on trust (``Adapter.find``)
    recorded_job: str | None = None

    def definition(self) -> str:
        from bridge.api.loader import to_yaml

        return to_yaml(list(self.objects)) if self.objects else ""


def prepare(source: Input, *, cluster: str | None = None, to: str | None = None, runtimes: Sequence[str] = (),
            configured: Mapping[str, BridgeCluster] | None = None, default_cluster: str = "local",
            adapter_for: Callable[[BridgeCluster], Adapter] | None = None,
            tenancy: TenantRequest | None = None, cluster_field: str = "--cluster",
            tag_output: bool = False) -> Prepared:
    """Input → plan → artifact for the chosen cluster (or backend type, with *to*); nothing is sent. A TrainJob
    whose annotations and runtime name no cluster goes to *default_cluster*. *adapter_for* gives the adapter of
    a cluster (the operator: one per cluster and tenant, kept open); by default a new one. With *tenancy* (the
    operator) the TrainJob runs as the tenant its namespace maps to on the chosen cluster, within that tenant's
    mapping, or is refused. *cluster_field* is where the caller's user wrote *cluster*, for errors about it.
    With *tag_output* (the operator, whose stand-in pods each show their node's lines) a job on a backend that
    runs no pods writes each line after the node and rank that wrote it."""
    from bridge.api.catalog import all_runtimes
    from bridge.api.cluster import BridgeCluster
    from bridge.placement import AUTO
    from bridge.plan import find_runtime, requested_cluster, select_cluster

    trainjob = source.single_trainjob()
    runtime = find_runtime(trainjob, all_runtimes(source.objects, list(runtimes), name=trainjob.spec.runtime_ref.name))
    if to is not None:
        if cluster is not None:
            raise InvalidSpec("--to", to, "give either --to or --cluster, not both")
        target = targets.backend_cluster(to)
    else:
        # a mapping, not copied: the operator's resolves a cluster (its credentials) only when it is chosen
        available: Mapping[str, BridgeCluster] = configured if configured is not None else targets.clusters()
        inline = [obj for obj in source.objects if isinstance(obj, BridgeCluster)]
        if inline:
            merged = dict(available)
            for obj in inline:
                if obj.name in merged:
                    raise InvalidSpec(f"{source.source}: BridgeCluster {obj.name}", obj.name,
                                      "a cluster in an input file may not replace a configured cluster of the same "
                                      "name")
                merged[obj.name] = obj
            available = merged
        if requested_cluster(trainjob, runtime, cluster, default_cluster) == AUTO and AUTO not in available:
            from bridge import placement

            chosen, judged = placement.place(
                available, lambda target: _prepare_for(target, trainjob, runtime, source, adapter_for, tenancy, tag_output))
            return replace(chosen, notes=(*placement.notes(judged), *chosen.notes))
        target = select_cluster(trainjob, runtime, available, cluster, default=default_cluster,
                                override_field=cluster_field)
    return _prepare_for(target, trainjob, runtime, source, adapter_for, tenancy, tag_output)


def _prepare_for(target: BridgeCluster, trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime,
                 source: Input,
                 adapter_for: Callable[[BridgeCluster], Adapter] | None,
                 tenancy: TenantRequest | None = None, tag_output: bool = False) -> Prepared:
    if not source.origins:
        return _prepare_target(target, trainjob, runtime, source, adapter_for, tenancy, tag_output)
    try:
        prepared = _prepare_target(target, trainjob, runtime, source, adapter_for, tenancy, tag_output)
    except InvalidSpec as exc:
        where = source.where(exc.field)
        if where is None:
            raise
        # the user wrote a #SBATCH line or a flag, not an annotation: the error names what they wrote
        raise InvalidSpec(where, exc.value, exc.problem, source=source.source) from None
    return _told_by_line(prepared, source)


def _told_by_line(prepared: Prepared, source: Input) -> Prepared:
    """Options dropped off Slurm are told once each, by the #SBATCH line or flag that gave them: the plan's note
    names the line instead of the annotation, and conversion's "passed through verbatim" goes."""
    from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX
    from bridge.plan import dropped_note

    plan, notes = prepared.plan, list(prepared.notes)
    for option, value, why in plan.options.dropped:
        key = f"{SBATCH_PASSTHROUGH_PREFIX}{option}"
        for origin, where, said in source.origins:
            if origin != key:
                continue
            by_key = dropped_note(f"metadata.annotations[{key}]", option, value, why, plan.cluster, plan.backend)
            by_line = dropped_note(where.rpartition(": ")[0], option, value, why, plan.cluster, plan.backend)
            notes = [by_line if note == by_key else note for note in notes if note != said]
    return replace(prepared, notes=tuple(notes))


def _prepare_target(target: BridgeCluster, trainjob: TrainJob,
                    runtime: TrainingRuntime | ClusterTrainingRuntime, source: Input,
                    adapter_for: Callable[[BridgeCluster], Adapter] | None,
                    tenancy: TenantRequest | None = None, tag_output: bool = False) -> Prepared:
    from bridge.plan import resolve, traits_of

    tenant = None
    if tenancy is not None:
        from bridge import tenancy as tenants

        tenant, target = tenants.resolve(target, tenancy)
    if not traits_of(target).runs_pods:
        trainjob = _workdir_relative_to_file(trainjob, source.path, WORKDIR_ANNOTATION)
    adapter = (adapter_for or targets.get_adapter)(target)
    script = source.script
    before = trainjob.metadata.uid
    if script is not None:
        trainjob = _uid_per_submit(trainjob, adapter)
    fresh_uid = trainjob.metadata.uid != before
    plan = resolve(trainjob, runtime, adapter.cluster, tenant)
    if tag_output and not traits_of(target).runs_pods:
        plan = _tagging_output(plan)
    notes = source.notes
    if script is not None:
        if adapter.capabilities.batch_scripts:
            # sent as it is: what conversion said about fields does not apply
            plan, notes = replace(plan, batch_script=script), script.notes
        elif script.only_verbatim:
            raise InvalidSpec("script", source.source, f"{script.only_verbatim} runs only on a Slurm cluster that "
                              f"takes batch scripts (sbatch, here or over ssh); cluster {target.name} is "
                              f"{target.spec.type}" + (" over slurmrestd" if traits_of(target).takes_sbatch_options
                                                        else ""))
    ran = trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(update={"uid": plan.uid})})
    declared = {option.name for option in adapter.options}
    waits_for = None
    if plan.options.dependency and "dependency" not in declared:
        # kept here, by ordered creation: the job is sent once what it depends on has ended as it must
        waits_for, plan = plan.options.dependency, replace(plan, options=replace(plan.options, dependency=None))
        notes = (*notes, f"dependency {waits_for}: submit waits for it, then sends the job")
    if plan.options.array and "array" not in declared:
        return replace(_array_for(adapter, plan, (*notes, *plan.notes), (runtime, ran)), waits_for=waits_for,
                       fresh_uid=fresh_uid)
    _refuse_early(adapter, plan)
    return Prepared(adapter, plan, adapter.render(plan), (*notes, *plan.notes), (runtime, ran), waits_for=waits_for,
                    fresh_uid=fresh_uid)


def _tagging_output(plan: LaunchPlan) -> LaunchPlan:
    """*plan* with TAG_OUTPUT_ENV set for its launch: each line of its output after ``[node-N] `` (a rank's
    ``[node-N rank-R] ``), so that one stream can be cut into each node's."""
    from bridge.envnames import TAG_OUTPUT_ENV
    from bridge.plan.model import EnvEntry

    kept = tuple(entry for entry in plan.env if entry.name != TAG_OUTPUT_ENV)
    return replace(plan, env=(*kept, EnvEntry(TAG_OUTPUT_ENV, "1")))


def _uid_per_submit(trainjob: TrainJob, adapter: Adapter) -> TrainJob:
    """A batch script's TrainJob with a uid of its own: each submit of a script is a new job, as with sbatch (a
    sweep submits one script many times), while retries within this submit still find the job they sent, by
    this uid. Where a job is named after its TrainJob and names are unique (Kubernetes' JobSets) a second job
    cannot stand beside the first: there the script keeps the uid derived from its name, as a TrainJob file."""
    capabilities = adapter.capabilities
    if capabilities.unique_names and not capabilities.named_by_uid:
        return trainjob
    return trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(update={"uid": str(uuid.uuid4())})})


def _refuse_early(adapter: Adapter, plan: LaunchPlan) -> None:
    """Every refusal that can come before anything is sent, here where ``--dry-run`` and submit both pass:
    submit adds only the sending, so a dry run's verdict is submit's."""
    adapter.check_options(plan)
    adapter.admit(plan)


def _array_for(adapter: Adapter, plan: LaunchPlan, notes: tuple[str, ...], objects: tuple[Resource, ...]) -> Prepared:
    """A job array where the backend has none: one job per element, all rendered now (so ``render`` and
    ``--dry-run`` show every one), sent by ``submit_array`` with at most ``%`` of them unfinished at once."""
    from bridge.adapters.base import Artifact
    from bridge.plan import array_elements, expand_array

    indices, limit, _ = expand_array(plan.options.array or "")
    elements = []
    for element in array_elements(plan):
        _refuse_early(adapter, element)
        elements.append(Prepared(adapter, element, adapter.render(element), (), objects))
    first = elements[0].artifact
    combined = Artifact(first.backend, first.kind, plan, tuple(f for e in elements for f in e.artifact.files))
    note = (f"array {plan.options.array}: {len(indices)} jobs on {adapter.cluster.name}, one per element "
            f"({plan.name}-{indices[0]} …)" + (f", at most {limit} unfinished at once" if limit else ""))
    return Prepared(adapter, plan, combined, (*notes, note), objects, tuple(elements), limit)


def _workdir_relative_to_file(trainjob: TrainJob, path: str | None, key: str) -> TrainJob:
    """A relative ``hpcbridge.io/workdir`` is relative to the TrainJob's file, so examples run from anywhere."""
    workdir = (trainjob.metadata.annotations or {}).get(key)
    if not workdir or os.path.isabs(workdir) or path is None:
        return trainjob
    annotations = dict(trainjob.metadata.annotations or {})
    annotations[key] = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), workdir))
    return trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(update={"annotations": annotations})})


def render(file: str, *, cluster: str | None = None, to: str | None = None, runtimes: Sequence[str] = (),
           sbatch_flags: Sequence[str] = (), queue: str | None = None) -> Prepared:
    from bridge.plan import backend_traits

    source = read_input(file, sbatch_flags)
    if queue is not None:
        source = queued(source, queue)
    prepared = prepare(source, cluster=cluster, to=to, runtimes=runtimes)
    if queue is not None and not backend_traits(prepared.plan.backend).runs_pods:
        # a TrainJob bound for Slurm or Flux is queued by the operator, where Kueue sees the TrainJob itself
        raise InvalidSpec("--queue", queue, f"only a Kubernetes cluster queues its JobSets in Kueue; cluster "
                                            f"{prepared.plan.cluster!r} is {prepared.plan.backend} (apply the TrainJob "
                                            f"with the {QUEUE_LABEL} label for the operator instead)")
    return prepared
