"""The parts of a plan only one backend reads, each a typed extension a LaunchPlan carries for that backend's
clusters alone (``plan.kubernetes``, ``plan.slurm``); what two or more backends read stays on LaunchPlan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KubernetesPlan:
    """What the Kubernetes backend renders a JobSet from beyond the neutral plan: Kubeflow's own objects and
    the facts its runtime plugins key on."""

    #: the runtime's JobSet template with runtime patches and trainer overrides merged
    jobset_template: Mapping[str, Any] = field(default_factory=dict)
    #: the JobSet's labels and annotations from the runtime template and runtime patches
    jobset_metadata: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the trainer container's command and args, kept apart as Kubeflow keeps them (LaunchPlan.command joins them)
    container_command: tuple[str, ...] = ()
    container_args: tuple[str, ...] = ()
    #: whether the TrainJob has a ``trainer`` section: Kubeflow's framework plugins inject their environment
    #: (PET_*, JAX_*, DMLC_*) only then
    trainer_given: bool = True
    #: whether numProcPerNode was given (Kubeflow's torch plugin says "auto" otherwise, when there are GPUs)
    procs_per_node_given: bool = False
    #: whether the TrainJob gave the command itself (Kubeflow's torchtune rewriting keys on it)
    trainer_command_given: bool = False
    #: the torch policy's ``envInjection`` targets: (replicated job, container names) that get PET_* too
    env_injection: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: the cluster's own copies of images: (image named, image run), and the pull policy to write
    image_map: tuple[tuple[str, str], ...] = ()
    image_pull_policy: str | None = None
    #: the MPI policy's SSH key mount path, and whether the launcher pod is one of the nodes
    ssh_auth_mount_path: str | None = None
    run_launcher_as_node: bool = False
    #: the Kueue LocalQueue the JobSet is queued in: submit --queue, else the TrainJob's
    #: kueue.x-k8s.io/queue-name label, else the cluster's spec.kubernetes.queue
    queue: str | None = None


@dataclass(frozen=True)
class SlurmPlan:
    """What the Slurm backend writes beyond the neutral plan: a converted batch script's own spellings."""

    #: a converted batch script's own node and task options (``hpcbridge.io/slurm-layout``): which of ``nodes``
    #: and ``ntasks-per-node`` the job asks for (``nodes`` from ``nodes``, ``ntasks-per-node`` from
    #: ``procs_per_node``; ``--ntasks`` and a node range are passed through), so a node count the script left to
    #: Slurm stays Slurm's. None: hpc-bridge's own layout, ``--nodes`` and ``--ntasks-per-node`` both stated
    layout: tuple[str, ...] | None = None
    #: the script's GPU option as sbatch had it (``hpcbridge.io/slurm-gpus``, e.g. ``gres=gpu:a100:2``): Slurm's
    #: job environment differs by spelling; other backends read the count from the resources
    gpus: str | None = None
