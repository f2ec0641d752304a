"""Job arrays where the backend has none: the elements, each a job of its own."""

from __future__ import annotations

import uuid
from dataclasses import replace

from bridge.annotations import ARRAY_ANNOTATION
from bridge.errors import InvalidSpec
from bridge.plan.model import UID_NAMESPACE, EnvEntry, LaunchPlan

#: the most elements an array may have where hpc-bridge runs them one by one (Slurm's default MaxArraySize)
MAX_EXPANDED_ARRAY = 1001


def expand_array(value: str) -> tuple[list[int], int | None, int]:
    """A valid array spec (array_problem) as its indices in order, the ``%`` limit (None: none) and the step
    Slurm reports as SLURM_ARRAY_TASK_STEP (a single stepped range's step, else 1)."""
    body, _, limit = value.partition("%")
    indices: list[int] = []
    steps = []
    for item in body.split(","):
        span, _, step = item.partition(":")
        low, _, high = span.partition("-")
        steps.append(int(step or 1))
        indices.extend(range(int(low), int(high or low) + 1, int(step or 1)))
        if len(indices) > MAX_EXPANDED_ARRAY:
            raise InvalidSpec(f"metadata.annotations[{ARRAY_ANNOTATION}]", value,
                              f"more than {MAX_EXPANDED_ARRAY - 1} elements; off Slurm each is a job of its own")
    ordered = list(dict.fromkeys(indices))
    return ordered, int(limit) if limit else None, steps[0] if len(steps) == 1 else 1


def array_elements(plan: LaunchPlan) -> list[LaunchPlan]:
    """A job array as the jobs it is made of, for backends without arrays: element *i* is the plan named
    ``<name>-<i>`` (uid derived from the array's), without the array option, with the SLURM_ARRAY_* variables
    Slurm gives an element (SLURM_ARRAY_JOB_ID: the array's uid, as no element's id is known before submit)."""
    indices, _, step = expand_array(plan.options.array or "")
    # the elements share the array's job name, as under Slurm (SLURM_JOB_NAME)
    options = replace(plan.options, array=None, slurm_job_name=plan.options.slurm_job_name or plan.name)
    common = (("SLURM_ARRAY_JOB_ID", plan.uid), ("SLURM_ARRAY_TASK_COUNT", str(len(indices))),
              ("SLURM_ARRAY_TASK_MIN", str(min(indices))), ("SLURM_ARRAY_TASK_MAX", str(max(indices))),
              ("SLURM_ARRAY_TASK_STEP", str(step)))
    elements = []
    for index in indices:
        env = [entry for entry in plan.env if not entry.name.startswith("SLURM_ARRAY_")]
        env += [EnvEntry(name, value) for name, value in (*common, ("SLURM_ARRAY_TASK_ID", str(index)))]
        elements.append(replace(plan, name=f"{plan.name}-{index}", uid=str(uuid.uuid5(uuid.UUID(plan.uid)
                                                                                     if _is_uuid(plan.uid)
                                                                                     else UID_NAMESPACE,
                                                                                     f"{plan.uid}/{index}")),
                                options=options, env=tuple(env)))
    return elements


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
