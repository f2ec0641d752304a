"""Kubeflow's framework plugins on the trainer container: PET_* for torch, JAX's coordinator, XGBoost's
tracker, each with the rendezvous port; and the torch policy's ``envInjection``."""

from __future__ import annotations

import copy
from typing import Any

from bridge.adapters.kubernetes.pods import pod_spec, set_env
from bridge.errors import InvalidSpec
from bridge.plan import TORCHTUNE_ENTRYPOINT, LaunchPlan, torchtune_arguments

COMPLETION_INDEX = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}


def torch_nproc(plan: LaunchPlan) -> str:
    """PET_NPROC_PER_NODE as Kubeflow sets it: the TrainJob's numProcPerNode, else "auto" (one per GPU) when
    GPUs are asked for, else the CPU count."""
    given = plan.on_kubernetes().procs_per_node_given
    return "auto" if plan.resources.gpus and not given else str(plan.procs_per_node)


def pet_env(plan: LaunchPlan, master: bool, master_host: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "PET_NNODES", "value": str(plan.nodes)},
           {"name": "PET_NPROC_PER_NODE", "value": torch_nproc(plan)},
           {"name": "PET_NODE_RANK", "valueFrom": copy.deepcopy(COMPLETION_INDEX)}]
    if master:
        env += [{"name": "PET_MASTER_ADDR", "value": master_host},
                {"name": "PET_MASTER_PORT", "value": str(plan.rdzv_port)}]
    return env


def torch_env(plan: LaunchPlan, container: dict[str, Any], runtime_command: list[str], master_host: str) -> None:
    """Kubeflow's torch plugin: PET_* for torchrun (and the master address, except for torchtune, which gets a
    rendezvous argument instead) and the rendezvous port."""
    kubernetes = plan.on_kubernetes()
    torchtune = kubernetes.trainer_command_given and tuple(kubernetes.container_command) == TORCHTUNE_ENTRYPOINT
    if torchtune:
        container["command"] = [*kubernetes.container_command,
                                *torchtune_arguments(kubernetes.container_args, runtime_command, plan.runtime_name,
                                                     plan.nodes, torch_nproc(plan), plan.resources.gpus,
                                                     f"{master_host}:{plan.rdzv_port}")]
    set_env(container, pet_env(plan, master=not torchtune, master_host=master_host))
    coordinator_port(plan, container)


def inject_torch_env(plan: LaunchPlan, jobs: list[dict[str, Any]], master_host: str) -> None:
    """The torch policy's ``envInjection``: PET_* and the master address in the named containers (init
    containers and sidecars that check or coordinate), whatever the trainer's own command is."""
    for job_name, names in plan.on_kubernetes().env_injection:
        job = next((j for j in jobs if j.get("name") == job_name), None)
        pod = pod_spec(job) if job is not None else {}
        for name in names:
            found = next((c for c in [*pod.get("initContainers", []), *pod.get("containers", [])]
                          if c.get("name") == name), None)
            if found is None:
                raise InvalidSpec(f"runtime {plan.runtime_name}: spec.mlPolicy.torch.envInjection", f"{job_name}/{name}",
                                  "no such container in the runtime's template")
            set_env(found, pet_env(plan, master=True, master_host=master_host))


def coordinator_port(plan: LaunchPlan, container: dict[str, Any]) -> None:
    ports = [p for p in container.get("ports", []) if p.get("containerPort") != plan.rdzv_port]
    container["ports"] = ports + [{"containerPort": plan.rdzv_port}]


def jax_env(plan: LaunchPlan, container: dict[str, Any], master_host: str) -> None:
    """Kubeflow's JAX plugin: one process per node, the first pod coordinates."""
    set_env(container, [
        {"name": "JAX_NUM_PROCESSES", "value": str(plan.nodes)},
        {"name": "JAX_PROCESS_ID", "valueFrom": copy.deepcopy(COMPLETION_INDEX)},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{master_host}:{plan.rdzv_port}"},
    ])
    coordinator_port(plan, container)


def xgboost_env(plan: LaunchPlan, container: dict[str, Any], master_host: str) -> None:
    """Kubeflow's XGBoost plugin: the first pod runs the tracker; one worker per GPU, else one per node."""
    workers = plan.nodes * (plan.resources.gpus or 1)
    set_env(container, [
        {"name": "DMLC_TRACKER_URI", "value": master_host},
        {"name": "DMLC_TRACKER_PORT", "value": str(plan.rdzv_port)},
        {"name": "DMLC_TASK_ID", "valueFrom": copy.deepcopy(COMPLETION_INDEX)},
        {"name": "DMLC_NUM_WORKER", "value": str(workers)},
    ])
    coordinator_port(plan, container)
