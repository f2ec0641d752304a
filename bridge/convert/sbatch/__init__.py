"""sbatch batch scripts and sbatch command-line flags → TrainJob.

* ``parse``: sbatch 22.05's reading rules — the ``#SBATCH`` block, ``get_argument`` tokenising, ``getopt_long``
  over sbatch's option table, last-wins merging, option value checks (``parse_script``, ``parse_flags``, ``merge``);
* ``values``: Slurm's value grammars (time limits, sizes, node counts, GPU counts, GRES);
* ``body``: the script body ⇄ the TrainJob command that runs it through its own ``#!`` interpreter;
* ``mapping``: request ⇄ TrainJob (``to_trainjob``, ``apply_flags``, ``sbatch_runtime``).

The other direction, a batch script from a TrainJob, has one writer: the Slurm renderer
(``bridge.adapters.slurm.render.render_script``) on the resolved plan.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the same names, for the type checker only
    from bridge.convert.sbatch.body import command_body, exec_body, parse_exec_body, script_command
    from bridge.convert.sbatch.mapping import (
        GPU_RESOURCE,
        SBATCH_RUNTIME,
        apply_flags,
        default_job_name,
        dns_label,
        sbatch_runtime,
        to_trainjob,
    )
    from bridge.convert.sbatch.parse import (
        OPTIONS,
        Directive,
        SbatchRequest,
        directive_arg,
        merge,
        parse_flags,
        parse_script,
        passthrough_value,
        split_script,
        tokenize_directive,
    )
    from bridge.convert.sbatch.values import (
        GresItem,
        gpu_counts,
        gres_items,
        node_range,
        size_mb,
        slurm_time,
        time_seconds,
    )

#: each public name and the submodule that defines it: imported on first use (PEP 562), so importing one
#: submodule (the Slurm renderer needs only ``values``) does not load the parser's option tables
_WHERE = {
    "Directive": "parse", "GPU_RESOURCE": "mapping", "GresItem": "values", "OPTIONS": "parse",
    "SBATCH_RUNTIME": "mapping", "SbatchRequest": "parse", "apply_flags": "mapping", "command_body": "body",
    "default_job_name": "mapping", "directive_arg": "parse", "dns_label": "mapping", "exec_body": "body",
    "gpu_counts": "values", "gres_items": "values", "merge": "parse", "node_range": "values",
    "parse_exec_body": "body", "parse_flags": "parse", "parse_script": "parse", "passthrough_value": "parse",
    "sbatch_runtime": "mapping", "script_command": "body", "size_mb": "values", "slurm_time": "values",
    "split_script": "parse", "time_seconds": "values", "to_trainjob": "mapping", "tokenize_directive": "parse",
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [  # noqa: F822 - provided by __getattr__
    "GPU_RESOURCE", "OPTIONS", "SBATCH_RUNTIME", "Directive", "GresItem", "SbatchRequest", "apply_flags",
    "command_body", "default_job_name", "directive_arg", "dns_label", "exec_body", "gpu_counts", "gres_items", "merge", "node_range",
    "parse_exec_body", "parse_flags", "parse_script", "passthrough_value", "sbatch_runtime", "script_command",
    "size_mb", "slurm_time", "split_script", "time_seconds", "to_trainjob", "tokenize_directive",
]
