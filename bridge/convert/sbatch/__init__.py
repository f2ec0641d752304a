"""sbatch batch scripts and sbatch command-line flags → TrainJob.

* ``body``: the script body ⇄ the TrainJob command that runs it through its own ``#!`` interpreter;
* ``mapping``: request ⇄ TrainJob (``to_trainjob``, ``apply_flags``, ``sbatch_runtime``).

Reading a script or flags into a request is the sbatch language's part (``bridge.sbatch``). The other
direction, a batch script from a TrainJob, has one writer: the Slurm renderer
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

#: each public name and the submodule that defines it: imported on first use (PEP 562), so importing ``body``
#: does not load the mapping's TrainJob models
_WHERE = {
    "GPU_RESOURCE": "mapping", "SBATCH_RUNTIME": "mapping", "apply_flags": "mapping", "command_body": "body",
    "default_job_name": "mapping", "dns_label": "mapping", "exec_body": "body", "parse_exec_body": "body",
    "sbatch_runtime": "mapping", "script_command": "body", "to_trainjob": "mapping",
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
    "GPU_RESOURCE", "SBATCH_RUNTIME", "apply_flags", "command_body", "default_job_name", "dns_label",
    "exec_body", "parse_exec_body", "sbatch_runtime", "script_command", "to_trainjob",
]
