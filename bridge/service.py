"""The one orchestration layer: load → validate → resolve → plan → render → submit → poll → cancel → logs.

Every front end (the CLI, the operator) calls these functions and nothing below them: a front end never
builds a LaunchPlan or reaches into an adapter. What lives here and nowhere else:
- idempotent submit: a TrainJob uid that already has a job on the cluster gets that job back; a finished
  one is run again only when asked (``if_finished="rerun"``), never by accident;
- the durable record of submissions (``bridge.records``), written before submit returns;
- bounded retries of transient backend errors (``BackendUnavailable``), reported, then raised.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from bridge.annotations import (
    ARRAY_ANNOTATION,
    CHECKPOINT_ANNOTATION,
    DEPENDENCY_ANNOTATION,
    WORKDIR_ANNOTATION,
)
from bridge.errors import AlreadyRan, BackendRejected, BackendUnavailable, BridgeError, InvalidSpec

if TYPE_CHECKING:
    from bridge.adapters.base import Adapter, Artifact, Identity, JobRef, JobStatus
    from bridge.api.cluster import BridgeCluster
    from bridge.api.loader import Resource
    from bridge.api.runtime import ClusterTrainingRuntime, TrainingRuntime
    from bridge.api.trainjob import TrainJob
    from bridge.convert.sbatch.parse import SbatchRequest
    from bridge.plan import BatchScript, LaunchPlan
    from bridge.records import Records
    from bridge.staging.cache import CacheEntry
    from bridge.tenancy import Request as TenantRequest

T = TypeVar("T")

#: what submit does when the TrainJob's uid already has a finished job on the cluster
IfFinished = Literal["error", "attach", "rerun"]


# --- retries ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    """Bounded exponential backoff for errors that say they are ``retryable`` (``BackendUnavailable``);
    every other error passes through at once."""

    attempts: int = 4
    first_delay: float = 0.5
    factor: float = 2.0
    sleep: Callable[[float], None] = time.sleep
    #: told of each retry: the error, the attempt that failed (1-based), the delay before the next
    on_retry: Callable[[BridgeError, int, float], None] | None = None

    def call(self, fn: Callable[[], T]) -> T:
        delay = self.first_delay
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except BridgeError as exc:
                if not exc.retryable or attempt == self.attempts:
                    raise
                if self.on_retry is not None:
                    self.on_retry(exc, attempt, delay)
                self.sleep(delay)
                delay *= self.factor
        raise AssertionError("unreachable")


NO_RETRY = Retry(attempts=1)


# --- input -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Input:
    """Objects read from one file (or stdin), with the notes conversion made about them."""

    objects: tuple[Resource, ...]
    source: str
    #: the file's path, for paths relative to it; None for stdin
    path: str | None
    notes: tuple[str, ...] = ()
    #: the batch script itself, when the input was one: Slurm runs it as it is (``BatchScript``)
    script: BatchScript | None = None

    @property
    def trainjobs(self) -> list[TrainJob]:
        from bridge.api.trainjob import TrainJob

        return [obj for obj in self.objects if isinstance(obj, TrainJob)]

    def trainjob_form(self) -> TrainJob:
        """The one TrainJob this input is, for ``convert --to trainjob``: a script with no TrainJob form (a
        heterogeneous job) is refused rather than cut down to its first component."""
        if self.script is not None and self.script.only_verbatim:
            raise InvalidSpec("script", self.source, f"{self.script.only_verbatim} has no TrainJob form; it runs "
                              "only on a Slurm cluster, as the script it is (hpcbridge submit FILE --cluster "
                              "<slurm cluster>)")
        return self.single_trainjob()

    def converted(self) -> list[Resource]:
        """``convert --to trainjob``'s output: the TrainJob form, and the runtime it names when that came with
        it (a converted Training Operator v1 job's own TrainingRuntime)."""
        trainjob = self.trainjob_form()
        wanted = trainjob.spec.runtime_ref.name
        return [trainjob, *(obj for obj in self.objects if obj.kind in ("TrainingRuntime", "ClusterTrainingRuntime")
                            and obj.name == wanted)]

    def single_trainjob(self) -> TrainJob:
        found = self.trainjobs
        if len(found) != 1:
            raise InvalidSpec("file", self.source, f"expected exactly one TrainJob or batch script, found {len(found)}")
        return found[0]


def read_input(file: str, sbatch_flags: Sequence[str] = (), stdin: str | None = None) -> Input:
    """A TrainJob YAML file or a batch script (it starts with ``#!``, as sbatch requires); ``-`` is stdin.

    sbatch flags override a script's directives, or a TrainJob's fields, as ``sbatch`` flags would.
    """
    from bridge.api.loader import MAX_INPUT_BYTES, decode_input, read_text

    if file == "-":
        # bytes, as a file is read: no newline translation, bounded, strict UTF-8
        if stdin is None:
            stream = getattr(sys.stdin, "buffer", None)
            data = stream.read(MAX_INPUT_BYTES + 1) if stream is not None else sys.stdin.read().encode()
        else:
            data = stdin.encode("utf-8", "surrogatepass")
        text, source, path = decode_input(data, "<stdin>"), "<stdin>", None
    else:
        text, source, path = read_text(file), file, file
    notes: list[str] = []
    if text.startswith("#!"):
        return _read_script(text, source, path, sbatch_flags)
    objects, converted_notes = _load_documents(text, source)
    notes.extend(converted_notes)
    if sbatch_flags:
        from bridge.api.trainjob import TrainJob
        from bridge.convert.sbatch import apply_flags, parse_flags

        flags = parse_flags(sbatch_flags)
        converted = []
        for obj in objects:
            if isinstance(obj, TrainJob):
                obj, report = apply_flags(obj, flags)
                notes.extend(report)
            converted.append(obj)
        objects = converted
    return Input(tuple(objects), source, path, tuple(notes))


def _load_documents(text: str, source: str) -> tuple[list[Resource], list[str]]:
    """The documents of a YAML input as typed objects; a Training Operator v1 job (PyTorchJob, TFJob,
    MPIJob) becomes the TrainJob it means, and the TrainingRuntime it needs, with a note for each field that
    does not carry over."""
    from bridge.api.loader import parse_object, safe_load_all
    from bridge.convert.kubeflow_v1 import is_v1_job

    documents = [doc for doc in safe_load_all(text, source) if doc is not None]
    objects: list[Resource] = []
    notes: list[str] = []
    for index, document in enumerate(documents):
        label = source if len(documents) == 1 else f"{source}[doc {index + 1}]"
        if is_v1_job(document):
            from bridge.api.catalog import builtin_runtime_documents
            from bridge.convert.kubeflow_v1 import convert

            converted = convert(document, label, builtin_runtime_documents())
            objects += [parse_object(doc, f"{label} (converted)") for doc in converted.documents()]
            notes += converted.notes
        else:
            objects.append(parse_object(document, label))
    return objects, notes


def _read_script(text: str, source: str, path: str | None, sbatch_flags: Sequence[str]) -> Input:
    """A batch script: the TrainJob it means, for every backend, and the script itself, for Slurm."""
    from bridge.convert.sbatch import merge, parse_flags, parse_script, to_trainjob
    from bridge.plan import BatchScript

    request = parse_script(text, source)
    if sbatch_flags:
        request = merge(request, parse_flags(sbatch_flags))
    only_verbatim = None
    if request.components:
        # its first component stands for it (name, identity); only Slurm can run the whole of it
        only_verbatim = (f"a heterogeneous job ({1 + len(request.components)} components, #SBATCH hetjob on line "
                         f"{request.hetjob_line})")
        for component in request.components:
            to_trainjob(component, script_body=request.body, uncarried=[])  # checked as the first one is
        request = replace(request, components=())
    uncarried: list[InvalidSpec] = []
    trainjob, report = to_trainjob(request, uncarried=uncarried)
    if uncarried and only_verbatim is None:
        only_verbatim = (f"a script with {uncarried[0].field} {uncarried[0].value!r} (a value no TrainJob annotation "
                         "can carry)")
    script = BatchScript(text, os.path.abspath(path) if path else None, tuple(sbatch_flags),
                         request.get("job-name"), request.get("comment"), only_verbatim, request.notes,
                         _origins(request, trainjob, report))
    return Input((trainjob,), source, path, tuple(report), script)


def _origins(request: SbatchRequest, trainjob: TrainJob, report: Sequence[str]) -> tuple[tuple[str, str, str | None], ...]:
    """For each ``hpcbridge.io/*`` annotation a directive became: (annotation, directive, conversion note)."""
    from bridge.annotations import PREFIX, SBATCH_PASSTHROUGH_PREFIX

    annotations = trainjob.metadata.annotations or {}
    found = []
    for option, directive in request.options.items():
        # a knob is named as the option it comes from (--partition: hpcbridge.io/partition), but --chdir
        knob = WORKDIR_ANNOTATION if option == "chdir" else f"{PREFIX}{option}"
        for key in (f"{SBATCH_PASSTHROUGH_PREFIX}{option}", knob):
            if key in annotations:
                said = next((line for line in report if line.endswith(f"passed through verbatim as {key}")), None)
                found.append((key, directive.where, said))
    return tuple(found)


# --- clusters ----------------------------------------------------------------------------------------------


def clusters() -> dict[str, BridgeCluster]:
    """Configured clusters by name, the built-in ``local`` included."""
    from bridge.api.catalog import load_clusters

    return load_clusters()


def backend_cluster(backend: str) -> BridgeCluster:
    """A cluster of *backend* type with the documented defaults (``render --to``, ``convert --to``)."""
    from bridge.adapters import REGISTRY
    from bridge.api.cluster import BridgeCluster

    if backend not in REGISTRY:
        raise InvalidSpec("--to", backend, f"use one of {', '.join(REGISTRY)}")
    return BridgeCluster.model_validate({"apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster",
                                         "metadata": {"name": backend}, "spec": {"type": backend}})


def get_adapter(cluster: BridgeCluster) -> Adapter:
    from bridge.adapters import get_adapter as _get

    return _get(_defaults_for_this_machine(cluster))


def cluster_adapter(name: str | None) -> Adapter:
    """The adapter of a configured cluster: *name*, else $HPCBRIDGE_CLUSTER, else the only remote one."""
    configured = clusters()
    name = name or os.environ.get("HPCBRIDGE_CLUSTER")
    if not name:
        remote = [n for n, c in configured.items() if c.spec.type != "local"]
        if len(remote) != 1:
            raise InvalidSpec("--cluster", None, f"name the cluster; configured: {', '.join(sorted(configured))}")
        name = remote[0]
    if name not in configured:
        raise InvalidSpec("--cluster", name, f"no such cluster; configured: {', '.join(sorted(configured))}")
    return get_adapter(configured[name])


def _defaults_for_this_machine(cluster: BridgeCluster) -> BridgeCluster:
    """Clusters whose jobs run where this hpc-bridge runs — the local cluster, and Flux reached without SSH —
    launch with this very interpreter and find ``flux`` where this process does, unless the config says
    otherwise: an entry that gives only a URI works as written (examples/clusters.yaml)."""
    spec = cluster.spec
    flux = spec.flux
    on_this_machine = spec.type == "local" or (spec.type == "flux" and not (flux and flux.host)
                                               and not (flux and flux.uri and flux.uri.startswith("ssh://")))
    if not on_this_machine:
        return cluster
    update: dict[str, Any] = {}
    if not spec.defaults.launch_command:
        update["defaults"] = spec.defaults.model_copy(
            update={"launch_command": [sys.executable, "-m", "bridge", "launch"]})
    if spec.type == "flux" and (flux is None or not os.path.isabs(flux.flux_command)):
        import shutil

        found = shutil.which(flux.flux_command if flux else "flux")
        if found:
            from bridge.api.cluster import FluxConnection

            update["flux"] = (flux or FluxConnection()).model_copy(update={"flux_command": found})
    return cluster.model_copy(update={"spec": spec.model_copy(update=update)}) if update else cluster


# --- plan and render -------------------------------------------------------------------------------------


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

    def definition(self) -> str:
        from bridge.api.loader import to_yaml

        return to_yaml(list(self.objects)) if self.objects else ""


def prepare(source: Input, *, cluster: str | None = None, to: str | None = None, runtimes: Sequence[str] = (),
            configured: Mapping[str, BridgeCluster] | None = None, default_cluster: str = "local",
            adapter_for: Callable[[BridgeCluster], Adapter] | None = None,
            tenancy: TenantRequest | None = None) -> Prepared:
    """Input → plan → artifact for the chosen cluster (or backend type, with *to*); nothing is sent. A TrainJob
    whose annotations and runtime name no cluster goes to *default_cluster*. *adapter_for* gives the adapter of
    a cluster (the operator: one per cluster and tenant, kept open); by default a new one. With *tenancy* (the
    operator) the TrainJob runs as the tenant its namespace maps to on the chosen cluster, within that tenant's
    mapping, or is refused."""
    from bridge.api.catalog import all_runtimes
    from bridge.api.cluster import BridgeCluster
    from bridge.placement import AUTO
    from bridge.plan import find_runtime, requested_cluster, select_cluster

    trainjob = source.single_trainjob()
    runtime = find_runtime(trainjob, all_runtimes(source.objects, list(runtimes), name=trainjob.spec.runtime_ref.name))
    if to is not None:
        if cluster is not None:
            raise InvalidSpec("--to", to, "give either --to or --cluster, not both")
        target = backend_cluster(to)
    else:
        # a mapping, not copied: the operator's resolves a cluster (its credentials) only when it is chosen
        available: Mapping[str, BridgeCluster] = configured if configured is not None else clusters()
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
                available, lambda target: _prepare_for(target, trainjob, runtime, source, adapter_for, tenancy))
            return replace(chosen, notes=(*placement.notes(judged), *chosen.notes))
        target = select_cluster(trainjob, runtime, available, cluster, default=default_cluster)
    return _prepare_for(target, trainjob, runtime, source, adapter_for, tenancy)


def _prepare_for(target: BridgeCluster, trainjob: TrainJob, runtime: TrainingRuntime | ClusterTrainingRuntime,
                 source: Input,
                 adapter_for: Callable[[BridgeCluster], Adapter] | None,
                 tenancy: TenantRequest | None = None) -> Prepared:
    script = source.script
    if script is None:
        return _prepare_target(target, trainjob, runtime, source, adapter_for, tenancy)
    try:
        prepared = _prepare_target(target, trainjob, runtime, source, adapter_for, tenancy)
    except InvalidSpec as exc:
        where = script.where(exc.field)
        if where is None:
            raise
        # the user wrote a #SBATCH line, not an annotation: the error names the line
        raise InvalidSpec(where, exc.value, exc.problem, source=source.source) from None
    return _told_by_line(prepared, script)


def _told_by_line(prepared: Prepared, script: BatchScript) -> Prepared:
    """A script's options dropped off Slurm are told once each, by the line that gave them: the plan's note
    names the line instead of the annotation, and conversion's "passed through verbatim" goes."""
    from bridge.annotations import SBATCH_PASSTHROUGH_PREFIX
    from bridge.plan import dropped_note

    plan, notes = prepared.plan, list(prepared.notes)
    for option, value, why in plan.options.dropped:
        key = f"{SBATCH_PASSTHROUGH_PREFIX}{option}"
        for origin, where, said in script.origins:
            if origin != key:
                continue
            by_key = dropped_note(f"metadata.annotations[{key}]", option, value, why, plan.cluster, plan.backend)
            by_line = dropped_note(where.rpartition(": ")[0], option, value, why, plan.cluster, plan.backend)
            notes = [by_line if note == by_key else note for note in notes if note != said]
    return replace(prepared, notes=tuple(notes))


def _prepare_target(target: BridgeCluster, trainjob: TrainJob,
                    runtime: TrainingRuntime | ClusterTrainingRuntime, source: Input,
                    adapter_for: Callable[[BridgeCluster], Adapter] | None,
                    tenancy: TenantRequest | None = None) -> Prepared:
    from bridge.plan import resolve

    tenant = None
    if tenancy is not None:
        from bridge import tenancy as tenants

        tenant, target = tenants.resolve(target, tenancy)
    if target.spec.type != "kubernetes":
        trainjob = _workdir_relative_to_file(trainjob, source.path, WORKDIR_ANNOTATION)
    adapter = (adapter_for or get_adapter)(target)
    plan = resolve(trainjob, runtime, adapter.cluster, tenant)
    notes = source.notes
    script = source.script
    if script is not None:
        if not adapter.capabilities.unique_names:
            # each submit of a batch script is a new job, as with sbatch (a sweep submits one script many
            # times); retries within this submit still find the job they sent, by this uid
            plan = replace(plan, uid=str(uuid.uuid4()))
        if adapter.capabilities.batch_scripts:
            # sent as it is: what conversion said about fields does not apply
            plan, notes = replace(plan, batch_script=script), script.notes
        elif script.only_verbatim:
            raise InvalidSpec("script", source.source, f"{script.only_verbatim} runs only on a Slurm cluster that "
                              f"takes batch scripts (sbatch, here or over ssh); cluster {target.name} is "
                              f"{target.spec.type}" + (" over slurmrestd" if target.spec.type == "slurm" else ""))
    ran = trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(update={"uid": plan.uid})})
    declared = {option.name for option in adapter.options}
    waits_for = None
    if plan.options.dependency and "dependency" not in declared:
        # kept here, by ordered creation: the job is sent once what it depends on has ended as it must
        waits_for, plan = plan.options.dependency, replace(plan, options=replace(plan.options, dependency=None))
        notes = (*notes, f"dependency {waits_for}: submit waits for it, then sends the job")
    if plan.options.array and "array" not in declared:
        return replace(_array_for(adapter, plan, (*notes, *plan.notes), (runtime, ran)), waits_for=waits_for)
    adapter.check_options(plan)
    return Prepared(adapter, plan, adapter.render(plan), (*notes, *plan.notes), (runtime, ran), waits_for=waits_for)


def _array_for(adapter: Adapter, plan: LaunchPlan, notes: tuple[str, ...], objects: tuple[Resource, ...]) -> Prepared:
    """A job array where the backend has none: one job per element, all rendered now (so ``render`` and
    ``--dry-run`` show every one), sent by ``submit_array`` with at most ``%`` of them unfinished at once."""
    from bridge.adapters.base import Artifact
    from bridge.plan import array_elements, expand_array

    indices, limit, _ = expand_array(plan.options.array or "")
    elements = []
    for element in array_elements(plan):
        adapter.check_options(element)
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
    source = read_input(file, sbatch_flags)
    if queue is not None:
        source = queued(source, queue)
    prepared = prepare(source, cluster=cluster, to=to, runtimes=runtimes)
    if queue is not None and prepared.plan.backend != "kubernetes":
        # a TrainJob bound for Slurm or Flux is queued by the operator, where Kueue sees the TrainJob itself
        raise InvalidSpec("--queue", queue, f"only a Kubernetes cluster queues its JobSets in Kueue; cluster "
                                            f"{prepared.plan.cluster!r} is {prepared.plan.backend} (apply the TrainJob "
                                            "with the kueue.x-k8s.io/queue-name label for the operator instead)")
    return prepared


def queued(source: Input, queue: str) -> Input:
    """*source* with its TrainJob in Kueue's LocalQueue *queue* (``submit --queue``): the label Kueue reads."""
    from bridge.api.names import check_label_value
    from bridge.plan import QUEUE_LABEL

    try:
        check_label_value(queue)
    except ValueError as exc:
        raise InvalidSpec("--queue", queue, str(exc)) from None
    trainjob = source.single_trainjob()
    labels = {**(trainjob.metadata.labels or {}), QUEUE_LABEL: queue}
    changed = trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(update={"labels": labels})})
    return replace(source, objects=tuple(changed if obj is trainjob else obj for obj in source.objects))


# --- submit ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    ref: JobRef
    #: the job already existed (this call sent nothing)
    existing: bool
    #: its state when found, for an existing job
    status: JobStatus | None = None


def _identity(plan: LaunchPlan) -> Identity:
    from bridge.adapters.base import Identity

    return Identity(plan.uid, plan.name, plan.namespace)


def submit(prepared: Prepared, *, if_finished: IfFinished = "error", retry: Retry = NO_RETRY,
           on_wait: Callable[[str], None] | None = None, sleep: Callable[[float], None] = time.sleep) -> Submitted:
    if prepared.waits_for:
        wait_for_dependency(prepared.adapter, prepared.waits_for, prepared.plan, retry=retry, on_wait=on_wait,
                            sleep=sleep)
        prepared = replace(prepared, waits_for=None)
    return submit_many([prepared], if_finished=if_finished, retry=retry)[0]


def wait_for_dependency(adapter: Adapter, spec: str, plan: LaunchPlan, *, retry: Retry = NO_RETRY,
                        on_wait: Callable[[str], None] | None = None, poll_seconds: float = 1.0,
                        sleep: Callable[[float], None] = time.sleep) -> None:
    """Block until *spec* (afterok/afterany/afternotok:JOB[:JOB], singleton; items joined by ",") holds on
    *adapter*'s cluster: one batched poll per check. A dependency that can no longer hold (afterok on a job that
    failed) is BackendRejected, and nothing is sent, as Slurm never starts such a job."""
    items = [item.split(":") for item in spec.split(",")]
    ids = [job for kind, *jobs in items if kind != "singleton" for job in jobs]
    told = False
    while True:
        waiting = []
        states = retry.call(lambda: adapter.poll(job_refs(adapter, ids))) if ids else {}
        by_id = {ref.job_id: status for ref, status in states.items()}
        for kind, *jobs in items:
            if kind == "singleton":
                others = [s for s in retry.call(adapter.list_jobs)
                          if s.ref.name == plan.name and s.ref.uid != plan.uid and not s.state.finished]
                waiting += [f"{s.ref.job_id} (same name)" for s in others]
                continue
            for job in jobs:
                status = by_id[job]
                if status.state.value == "Unknown":
                    raise BackendRejected(adapter.backend, f"dependency {kind}:{job}: no such job on cluster "
                                                           f"{adapter.cluster.name}")
                if not status.state.finished:
                    waiting.append(f"{job} ({status.state.value})")
                elif kind == "afterok" and status.state.value != "Succeeded" or \
                        kind == "afternotok" and status.state.value == "Succeeded":
                    raise BackendRejected(adapter.backend, f"dependency {kind}:{job} can never hold: job {job} "
                                                           f"ended {status.state.value}; {plan.name} was not sent")
        if not waiting:
            return
        if on_wait is not None and not told:
            on_wait(f"{plan.name} waits for {', '.join(waiting)} ({spec})")
            told = True
        sleep(poll_seconds)


def submit_array(prepared: Prepared, *, if_finished: IfFinished = "error", retry: Retry = NO_RETRY,
                 poll_seconds: float = 1.0, sleep: Callable[[float], None] = time.sleep,
                 on_wait: Callable[[str], None] | None = None,
                 on_sent: Callable[[Submitted], None] | None = None) -> list[Submitted]:
    """Send a job array's elements in order (each idempotent by its own uid, as ``submit``); with a ``%``
    limit, an element is sent only while fewer than that many sent ones are unfinished (one batched poll per
    check), so the submitting process stays until the last element is sent."""
    adapter = prepared.adapter
    if prepared.waits_for:
        wait_for_dependency(adapter, prepared.waits_for, prepared.plan, retry=retry, on_wait=on_wait, sleep=sleep)
    sent: list[Submitted] = []
    for element in prepared.elements:
        if prepared.array_limit is not None:
            told = False
            while True:
                running = [s.ref for s in sent]
                states = retry.call(partial(adapter.poll, running)) if running else {}
                unfinished = sum(1 for status in states.values() if not status.state.finished)
                if unfinished < prepared.array_limit:
                    break
                if on_wait is not None and not told:
                    on_wait(f"{element.plan.name} waits: {unfinished} elements unfinished, the limit is "
                            f"{prepared.array_limit}")
                    told = True
                sleep(poll_seconds)
        sent.append(submit(element, if_finished=if_finished, retry=retry))
        if on_sent is not None:
            on_sent(sent[-1])
    return sent


def submit_many(batch: Sequence[Prepared], *, if_finished: IfFinished = "error",
                retry: Retry = NO_RETRY) -> list[Submitted]:
    """Submit plans bound for one cluster, idempotently by uid, with one lookup for the whole batch.

    A uid whose job is pending or running gets that job back. A uid whose job finished raises ``AlreadyRan``
    (``if_finished="error"``), gets the finished job back (``"attach"``, the operator re-attaching), or
    runs again (``"rerun"``). The lookup asks the backend first, then the durable record for jobs the
    backend no longer lists. Transient failures are retried whole, lookup included, so a retry after a
    send whose answer was lost finds the job instead of sending it twice.
    """
    if not batch:
        return []
    held = next((p for p in batch if p.waits_for), None)
    if held is not None:
        raise InvalidSpec(f"metadata.annotations[{DEPENDENCY_ANNOTATION}]", held.waits_for,
                          f"cluster {held.adapter.cluster.name} keeps no dependencies: hpcbridge submit waits for "
                          "them, which this path does not do")
    array = next((p for p in batch if p.elements), None)
    if array is not None:
        raise InvalidSpec(f"metadata.annotations[{ARRAY_ANNOTATION}]", array.plan.options.array,
                          f"cluster {array.adapter.cluster.name} has no job arrays: its elements are sent one by one "
                          "(hpcbridge submit), which this path does not do")
    adapter = batch[0].adapter
    if any(p.adapter is not adapter for p in batch):
        raise ValueError("submit_many takes plans for one cluster (one adapter)")
    from bridge.records import JobStore, Records, Submission, now

    records = Records(adapter.cluster.name)
    results: dict[str, Submitted] = {}

    def attempt() -> list[Submitted]:
        pending = [p for p in batch if p.plan.uid not in results]
        existing = _existing(adapter, records, [p.plan for p in pending])
        to_send: list[Prepared] = []
        for prepared in pending:
            uid = prepared.plan.uid
            status = existing.get(uid)
            if status is None:
                to_send.append(prepared)
            elif not status.state.finished and status.state.value != "Unknown":
                results[uid] = Submitted(status.ref, True, status)
            elif if_finished == "attach":
                results[uid] = Submitted(status.ref, True, status)
            elif if_finished == "rerun":
                if adapter.capabilities.unique_names:
                    adapter.remove(status.ref)
                to_send.append(prepared)
            else:
                plan = prepared.plan
                what = (f"{status.state.value}" if status.state.value != "Unknown"
                        else "which the cluster no longer knows (recorded by this machine)")
                raise AlreadyRan(f"{plan.namespace}/{plan.name} (uid {uid}) already ran on cluster {plan.cluster} "
                                 f"as job {status.ref.job_id}, {what}; `hpcbridge status "
                                 f"{status.ref.job_id}` shows it; submit --rerun runs it again",
                                 status.ref.job_id, status.state.value)
        for prepared in to_send:
            ref = adapter.submit(prepared.artifact)
            plan = prepared.plan
            records.add([Submission(plan.uid, ref.job_id, plan.name, plan.namespace, now())])
            if prepared.objects:
                JobStore().keep_definition(plan.uid, prepared.definition())
            results[plan.uid] = Submitted(ref, False)
        return [results[p.plan.uid] for p in batch]

    return retry.call(attempt)


def _existing(adapter: Adapter, records: Records, plans: Sequence[LaunchPlan]) -> dict[str, JobStatus]:
    """Jobs that already carry these uids: the backend's view, then the record for what it forgot."""
    found = adapter.find([_identity(plan) for plan in plans])
    missing = [plan.uid for plan in plans if plan.uid not in found]
    recorded = records.by_uid(missing) if missing else {}
    if recorded:
        from bridge.adapters.base import Identity

        refs = [adapter.ref(item.job_id, Identity(item.uid, item.name, item.namespace)) for item in recorded.values()]
        for ref, status in adapter.poll(refs).items():
            found[ref.uid] = status
    return found


# --- following -------------------------------------------------------------------------------------------


def job_refs(adapter: Adapter, job_ids: Sequence[str]) -> list[JobRef]:
    """References for jobs named by backend id, with the uid and name the record kept for them."""
    from bridge.adapters.base import Identity
    from bridge.records import Records

    known = Records(adapter.cluster.name).by_job_id(job_ids)
    refs = []
    for job_id in job_ids:
        item = known.get(job_id)
        refs.append(adapter.ref(job_id, Identity(item.uid, item.name, item.namespace) if item else None))
    return refs


def job_ref(adapter: Adapter, job_id: str, uid: str, name: str, namespace: str) -> JobRef:
    """A reference to a job whose TrainJob identity the caller knows (the operator: from the TrainJob)."""
    from bridge.adapters.base import Identity

    return adapter.ref(job_id, Identity(uid, name, namespace))


def tenant_adapter(cluster: BridgeCluster, request: TenantRequest,
                   adapter_for: Callable[[BridgeCluster], Adapter] | None = None) -> Adapter:
    """The adapter that acts for the tenant *request*'s namespace maps to on *cluster* (its identity, its
    credentials); InvalidSpec when the cluster maps no tenant to it."""
    from bridge import tenancy

    return (adapter_for or get_adapter)(tenancy.resolve(cluster, request)[1])


def owned_job(adapter: Adapter, uid: str, name: str, namespace: str, retry: Retry = NO_RETRY) -> JobStatus | None:
    """The job the backend holds for the TrainJob *uid*, looked up on the backend by that uid as the adapter's
    identity (a tenant's adapter sees only its own user's jobs): never an id someone wrote on the TrainJob.
    None when the backend has no job for it."""
    from bridge.adapters.base import Identity

    return retry.call(lambda: adapter.find([Identity(uid, name, namespace)])).get(uid)


def status(adapter: Adapter, job_ids: Sequence[str], retry: Retry = NO_RETRY) -> list[JobStatus]:
    refs = job_refs(adapter, job_ids)
    found = retry.call(lambda: adapter.poll(refs))
    return [found[ref] for ref in refs]


def poll(adapter: Adapter, refs: Sequence[JobRef], retry: Retry = NO_RETRY) -> dict[JobRef, JobStatus]:
    """The state of many jobs of one cluster in one batched query (what a sync loop calls each cycle)."""
    return retry.call(lambda: adapter.poll(refs)) if refs else {}


def list_jobs(adapter: Adapter, retry: Retry = NO_RETRY) -> list[JobStatus]:
    return retry.call(adapter.list_jobs)


@dataclass
class Follow:
    """Polls one job until it ends, calling *on_change* on every new (state, reason)."""

    adapter: Adapter
    ref: JobRef
    on_change: Callable[[JobStatus], None] = lambda status: None
    poll_interval: float = 1.0
    retry: Retry = field(default_factory=Retry)
    sleep: Callable[[float], None] = time.sleep

    def run(self) -> JobStatus:
        last = None
        while True:
            current = self.retry.call(lambda: self.adapter.poll([self.ref])[self.ref])
            shown = (current.state, current.reason)
            if shown != last:
                self.on_change(current)
                last = shown
            if current.state.finished:
                return current
            self.sleep(self.poll_interval)


def exit_code(status: JobStatus) -> int:
    """The process exit code a front end reports for a finished job: the job's own, else 0 or 1."""
    if status.exit_code:
        return status.exit_code
    return 0 if status.state.value == "Succeeded" else 1


def cancel(adapter: Adapter, job_ids: Sequence[str], signal: str | None = None, grace_seconds: float | None = None,
           retry: Retry = NO_RETRY) -> None:
    from bridge.adapters.base import signal_name

    signal_name(signal)  # an unknown signal is refused before any job is touched
    if grace_seconds is not None and grace_seconds < 0:
        raise InvalidSpec("--grace", grace_seconds, "must not be negative")
    for ref in job_refs(adapter, job_ids):
        cancel_ref(adapter, ref, signal, grace_seconds, retry)


def cancel_ref(adapter: Adapter, ref: JobRef, signal: str | None = None, grace_seconds: float | None = None,
               retry: Retry = NO_RETRY) -> None:
    """Cancel one job the caller found (``owned_job``), with the signal and grace of ``cancel``."""
    from bridge.adapters.base import signal_name

    name = signal_name(signal)
    retry.call(lambda: adapter.cancel(ref, signal=name, grace_seconds=grace_seconds))


#: where a migrated job finds the checkpoint to resume from (the annotation CHECKPOINT_ANNOTATION declares it)
RESUME_ENV = "HPCBRIDGE_RESUME_FROM"


def parse_stop_signal(text: str) -> tuple[str, float]:
    """``USR1@60`` (Slurm's --signal spelling: the signal, then the seconds it gets before the hard stop) →
    ("USR1", 60.0); a bare signal gets 30 s."""
    from bridge.adapters.base import signal_name

    name, _, grace = text.partition("@")
    if grace and not grace.isdigit():
        raise InvalidSpec("--signal", text, "write SIGNAL@SECONDS, e.g. USR1@60")
    return signal_name(name) or "TERM", float(grace) if grace else 30.0


@dataclass(frozen=True)
class Moved:
    """A job moved: where it ran, how it ended there, and where it runs now."""

    source: JobStatus
    submitted: Submitted
    prepared: Prepared
    move: dict[str, Any]


def migrate(adapter: Adapter, job_id: str, target: str, *, signal: str = "TERM", grace_seconds: float = 30.0,
            reason: str = "", configured: Mapping[str, BridgeCluster] | None = None, wait_seconds: float = 300.0,
            retry: Retry = NO_RETRY, clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> Moved:
    """Stop job *job_id* (*signal*, then the hard stop after *grace_seconds*), wait until it has ended, and run
    its TrainJob again on cluster *target* with HPCBRIDGE_RESUME_FROM set to its declared checkpoint directory
    (annotation hpcbridge.io/checkpoint-dir); the move goes into the job's history. The job keeps its uid."""
    import yaml

    from bridge.records import JobStore

    (ref,) = job_refs(adapter, [job_id])
    store = JobStore()
    text = store.definition(ref.uid) if ref.uid else None
    if text is None:
        raise InvalidSpec("JOB", job_id, f"no definition of this job on this machine (cluster {adapter.cluster.name}): "
                                         "only jobs submitted from here with this hpc-bridge can be moved")
    documents = list(yaml.safe_load_all(text))
    add_resume_env(next(doc for doc in documents if doc.get("kind") == "TrainJob"), job_id)
    source = read_input("-", stdin=yaml.safe_dump_all(documents, sort_keys=False))
    prepared = prepare(source, cluster=target, configured=configured)  # refused here: nothing was stopped yet
    if prepared.plan.cluster == adapter.cluster.name:
        raise InvalidSpec("--to", target, f"job {job_id} already runs on cluster {target}")
    status, stopped_by = stop_to_move(adapter, ref, signal, grace_seconds, wait_seconds=wait_seconds, retry=retry,
                                      clock=clock, sleep=sleep)
    submitted = submit(prepared, if_finished="rerun", retry=retry)
    move = move_record(status, stopped_by, prepared.plan.cluster, submitted.ref.job_id, reason)
    store.add_move(ref.uid, move)
    return Moved(status, submitted, prepared, move)


def add_resume_env(trainjob: dict[str, Any], job_id: str) -> None:
    """HPCBRIDGE_RESUME_FROM = the TrainJob's declared checkpoint directory, in its trainer's environment (the
    TrainJob as a wire document, changed in place); InvalidSpec where it declares none."""
    checkpoint = ((trainjob.get("metadata") or {}).get("annotations") or {}).get(CHECKPOINT_ANNOTATION)
    if not checkpoint:
        raise InvalidSpec(f"metadata.annotations[{CHECKPOINT_ANNOTATION}]", None,
                          f"job {job_id} declares no checkpoint directory to resume from; a moved job would start "
                          "over")
    trainer = trainjob.setdefault("spec", {}).setdefault("trainer", {})
    env = [entry for entry in trainer.get("env") or [] if entry.get("name") != RESUME_ENV]
    trainer["env"] = [*env, {"name": RESUME_ENV, "value": checkpoint}]


def stop_to_move(adapter: Adapter, ref: JobRef, signal: str, grace_seconds: float, *, wait_seconds: float = 300.0,
                 retry: Retry = NO_RETRY, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> tuple[JobStatus, str | None]:
    """Stop a job that is to run elsewhere and wait until it has ended: its final status, and the signal that
    stopped it (None: it had ended already). BackendUnavailable when it has not ended after *wait_seconds*:
    then it must not run twice, so nothing else happens."""
    from bridge.adapters.base import signal_name

    status = retry.call(lambda: adapter.poll([ref])[ref])
    if status.state.finished or status.state.value == "Unknown":
        return status, None
    stopped_by = signal_name(signal)
    retry.call(lambda: adapter.cancel(ref, signal=stopped_by, grace_seconds=grace_seconds))
    deadline = clock() + wait_seconds
    while not status.state.finished:
        if clock() > deadline:
            raise BackendUnavailable(adapter.backend, f"job {ref.job_id} still {status.state.value} "
                                     f"{wait_seconds:g}s after SIG{stopped_by}: not moved; try again")
        sleep(0.5)
        status = retry.call(lambda: adapter.poll([ref])[ref])
    return status, stopped_by


def move_record(source: JobStatus, stopped_by: str | None, target: str, job_id: str, reason: str) -> dict[str, Any]:
    """One entry of a job's history of moves."""
    from bridge.records import now

    return {"at": now(), "from": {"cluster": source.ref.cluster, "job": source.ref.job_id,
                                  "state": source.state.value, "exitCode": source.exit_code},
            "to": {"cluster": target, "job": job_id},
            "signal": f"SIG{stopped_by}" if stopped_by else None, "reason": reason or None}


def history(uid: str) -> list[dict[str, Any]]:
    from bridge.records import JobStore

    return JobStore().history(uid) if uid else []


def stop_and_remove(adapter: Adapter, ref: JobRef, retry: Retry = NO_RETRY) -> None:
    """Cancel a job and remove what submitting it created (a JobSet and its Secret), for a TrainJob that is
    deleted: nothing of it stays running or stored on the cluster. Backends that keep no objects only cancel."""
    status = retry.call(lambda: adapter.poll([ref])[ref])
    if not status.state.finished and status.state.value != "Unknown":
        retry.call(lambda: adapter.cancel(ref))
    if adapter.capabilities.unique_names:
        retry.call(lambda: adapter.remove(ref))


def logs(adapter: Adapter, job_id: str, follow: bool = False) -> Iterator[str]:
    (ref,) = job_refs(adapter, [job_id])
    return adapter.logs(ref, follow=follow)


def check(cluster: BridgeCluster) -> str:
    return get_adapter(cluster).check()


# --- the staging cache -----------------------------------------------------------------------------------------


def staging_dir(cluster_name: str | None) -> str:
    """A cluster's shared staging directory (default: the local cluster's, under the state dir), as this
    machine sees it: ``cache list``/``prune`` read it here, so on a remote cluster run them on a node that
    mounts it."""
    from bridge.records import state_root

    configured = clusters()
    name = cluster_name or "local"
    if name not in configured:
        raise InvalidSpec("--cluster", name, f"no such cluster; configured: {', '.join(sorted(configured))}")
    spec = configured[name].spec
    if spec.staging_dir:
        return spec.staging_dir
    if spec.type == "local":
        return str(state_root() / "staging")
    raise InvalidSpec("--cluster", name, "this cluster has no spec.stagingDir (Kubernetes stages into each "
                      "job's initializer volume)")


def _entry_row(entry: CacheEntry) -> dict[str, Any]:
    import datetime as dt

    return {"key": entry.key, "uri": entry.uri, "version": entry.version, "bytes": entry.bytes,
            "files": entry.files, "path": str(entry.path),
            "lastUsed": dt.datetime.fromtimestamp(entry.last_used, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def cache_entries(directory: str) -> list[dict[str, Any]]:
    from bridge.staging.cache import StageCache

    return [_entry_row(entry) for entry in StageCache(directory).entries()]


def cache_prune(directory: str, older_than: float | None, dry_run: bool = False) -> list[dict[str, Any]]:
    from bridge.staging.cache import StageCache

    return [_entry_row(entry) for entry in StageCache(directory).prune(older_than, dry_run=dry_run)]
