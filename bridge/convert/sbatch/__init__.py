"""sbatch batch scripts and sbatch command-line flags → TrainJob.

* ``parse``: sbatch 22.05's reading rules — the ``#SBATCH`` block, ``get_argument`` tokenising, ``getopt_long``
  over sbatch's option table, last-wins merging, option value checks (``parse_script``, ``parse_flags``, ``merge``);
* ``values``: Slurm's value grammars (time limits, sizes, node counts, GPU counts, GRES);
* ``body``: the script body ⇄ the TrainJob command that runs it through its own ``#!`` interpreter;
* ``mapping``: request ⇄ TrainJob (``to_trainjob``, ``apply_flags``, ``sbatch_runtime``).

The other direction, a batch script from a TrainJob, has one writer: the Slurm renderer
(``bridge.adapters.slurm.render.render_script``) on the resolved plan.
"""

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

__all__ = [
    "GPU_RESOURCE", "OPTIONS", "SBATCH_RUNTIME", "Directive", "GresItem", "SbatchRequest", "apply_flags",
    "command_body", "default_job_name", "directive_arg", "dns_label", "exec_body", "gpu_counts", "gres_items", "merge", "node_range",
    "parse_exec_body", "parse_flags", "parse_script", "passthrough_value", "sbatch_runtime", "script_command",
    "size_mb", "slurm_time", "split_script", "time_seconds", "to_trainjob", "tokenize_directive",
]
