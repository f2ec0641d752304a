"""The built-in ``local`` cluster: runs a plan on this machine, no scheduler needed.

``layout`` renders a plan into the processes it starts (the artifact), ``supervisor`` runs and owns them in
the process that submits, ``records`` is the on-disk record every other process reads, ``machine`` what this
machine lends a job (GPUs, a port), and ``adapter`` the contract over them.
"""

from bridge.adapters.local.adapter import LocalAdapter
from bridge.adapters.local.layout import LocalArtifact, LocalProcess, ProcessLayout, StageStep, process_layout
from bridge.adapters.local.machine import free_port, gpu_slices, machine_gpus
from bridge.adapters.local.records import state_dir

__all__ = ["LocalAdapter", "LocalArtifact", "LocalProcess", "ProcessLayout", "StageStep", "free_port",
           "gpu_slices", "machine_gpus", "process_layout", "state_dir"]
