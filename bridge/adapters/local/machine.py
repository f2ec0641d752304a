"""What this machine lends the local cluster's jobs when they start: its GPUs and a free coordinator port."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Collection, Mapping, Sequence

from bridge.errors import BackendRejected, InvalidSpec


def machine_gpus(cluster_gpus: Sequence[str] | None, env: Mapping[str, str],
                 run: Callable[[list[str]], str | None] | None = None,
                 proc_dir: str = "/proc/driver/nvidia/gpus") -> tuple[list[str], str]:
    """The GPUs this machine lends the local cluster's nodes, and where that came from: the cluster entry's
    ``gpus``, else an inherited CUDA_VISIBLE_DEVICES (a job inside an allocation lends only what it was given),
    else ``nvidia-smi -L``, else /proc/driver/nvidia/gpus; none when none of them says any."""
    if cluster_gpus is not None:
        return list(cluster_gpus), "the cluster's gpus"
    if "CUDA_VISIBLE_DEVICES" in env:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()], "CUDA_VISIBLE_DEVICES"
    listing = (run or _nvidia_smi)(["nvidia-smi", "-L"])
    if listing is not None:
        found = [line.split(":", 1)[0].split()[1] for line in listing.splitlines() if line.startswith("GPU ")]
        return found, "nvidia-smi -L"
    try:
        return [str(index) for index in range(len(os.listdir(proc_dir)))], proc_dir
    except OSError:
        return [], "no NVIDIA GPU found (nvidia-smi, /proc/driver/nvidia)"


def _nvidia_smi(argv: list[str]) -> str | None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout if result.returncode == 0 else None


def gpu_slices(nodes: int, per_node: int, gpus: Sequence[str], source: str) -> list[str] | None:
    """Each emulated node's own GPUs, as Slurm's gres gives a node its devices: node i the i-th slice of
    *gpus* (None: the job asks for none, and when the machine has GPUs its nodes see none). A job that needs
    more than the machine has is refused before anything starts."""
    if not per_node:
        return None
    needed = nodes * per_node
    if needed > len(gpus):
        raise InvalidSpec("spec.trainer.resourcesPerNode", f"{nodes} nodes x {per_node} GPUs",
                          f"needs {needed} GPUs; this machine has {len(gpus)} ({source})")
    return [",".join(gpus[node * per_node:(node + 1) * per_node]) for node in range(nodes)]


def free_port(preferred: int, taken: Collection[int] = ()) -> int:
    """*preferred* if a listener could bind it on every address now (as the coordinator will, without
    SO_REUSEADDR) and no other local job has claimed it, else a port the kernel picks."""
    for port in (preferred, *([0] * 8)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
            found: int = probe.getsockname()[1]
        if found not in taken:
            return found
    raise BackendRejected("local", "no free TCP port for the job's coordinator")
