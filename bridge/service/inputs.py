"""What a front end reads: a TrainJob YAML file (a Training Operator v1 job converted), or a batch script."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from bridge.annotations import QUEUE_LABEL, WORKDIR_ANNOTATION
from bridge.errors import InvalidSpec

if TYPE_CHECKING:
    from bridge.api.loader import Resource
    from bridge.api.trainjob import TrainJob
    from bridge.plan import BatchScript
    from bridge.sbatch.directives import SbatchRequest


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
    #: for a TrainJob with sbatch flags laid over it, (annotation, flag, conversion note) for each
    #: ``hpcbridge.io/*`` annotation a flag became, as ``BatchScript.origins`` says it for a script's lines
    flag_origins: tuple[tuple[str, str, str | None], ...] = ()

    @property
    def origins(self) -> tuple[tuple[str, str, str | None], ...]:
        """(annotation, where the user wrote it, conversion note) for each ``hpcbridge.io/*`` annotation an
        ``#SBATCH`` line or a command-line flag became: errors and notes about it name what the user typed."""
        return self.script.origins if self.script is not None else self.flag_origins

    def where(self, field: str) -> str | None:
        """The line or flag an annotation field (``metadata.annotations[KEY]``) came from; None if none did (the
        TrainJob itself carries it)."""
        return next((where for key, where, _ in self.origins if field == f"metadata.annotations[{key}]"), None)

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
        from bridge.convert.sbatch import apply_flags
        from bridge.sbatch.directives import parse_flags

        flags = parse_flags(sbatch_flags)
        converted = []
        origins: tuple[tuple[str, str, str | None], ...] = ()
        for obj in objects:
            if isinstance(obj, TrainJob):
                obj, report = apply_flags(obj, flags)
                notes.extend(report)
                origins += _origins(flags, obj, report)
            converted.append(obj)
        return Input(tuple(converted), source, path, tuple(notes), flag_origins=origins)
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
    from bridge.convert.sbatch import to_trainjob
    from bridge.plan import BatchScript
    from bridge.sbatch.directives import merge, parse_flags
    from bridge.sbatch.script import parse_script

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
    """For each ``hpcbridge.io/*`` annotation a directive or flag became: (annotation, directive, conversion
    note)."""
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


def queued(source: Input, queue: str) -> Input:
    """*source* with its TrainJob in Kueue's LocalQueue *queue* (``submit --queue``): the label Kueue reads."""
    from bridge.api.names import check_label_value


    try:
        check_label_value(queue)
    except ValueError as exc:
        raise InvalidSpec("--queue", queue, str(exc)) from None
    trainjob = source.single_trainjob()
    labels = {**(trainjob.metadata.labels or {}), QUEUE_LABEL: queue}
    changed = trainjob.model_copy(update={"metadata": trainjob.metadata.model_copy(update={"labels": labels})})
    return replace(source, objects=tuple(changed if obj is trainjob else obj for obj in source.objects))
