"""``LaunchSpec``: what ``hpcbridge launch`` does on a node, the contract between the renderers (which write its
arguments into batch scripts and pod commands) and the launch (bridge.mpi.bootstrap)."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Mapping

from bridge.errors import InvalidSpec
from bridge.mpi import discovery, ssh

#: True for the type checker only (which reads any TYPE_CHECKING so): importing typing would add to the
#: start-up of every node of every job
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NamedTuple

LAUNCHERS = ("openmpi", "mpich", "intel", "torchrun", "plain", "flux", "script")
#: frameworks whose processes get their coordinates from the launch (as Kubeflow's plugins give a pod them)
FRAMEWORKS = ("", "jax", "xgboost")


def launch_framework(framework: str) -> str:
    """The plan's framework as ``--framework`` takes it: "" for those the launch gives nothing of their own."""
    return framework if framework in FRAMEWORKS else ""
MPI = ("openmpi", "mpich", "intel")


_SPEC_DEFAULTS = {"nodes": None, "forward_env": (), "hosts": (), "node_rank": None, "hostfile": None,
                  "rdzv_port": 29500, "job_id": "", "ssh_dir": None, "ssh_port": ssh.DEFAULT_PORT,
                  "wait_timeout": 120.0, "extra_env": None, "leader": None, "framework": "",
                  "gpus_per_node": 0}


if TYPE_CHECKING:
    class _LaunchSpec(NamedTuple):
        # the fields as the type checker sees them; the defaults are _SPEC_DEFAULTS, through LaunchSpec.__new__
        launcher: str
        discovery: str
        procs_per_node: int
        command: tuple[str, ...]
        nodes: int | None
        forward_env: tuple[str, ...]
        hosts: tuple[str, ...]
        node_rank: int | None
        hostfile: str | None
        rdzv_port: int
        job_id: str
        ssh_dir: str | None
        ssh_port: int
        wait_timeout: float
        extra_env: Mapping[str, str]
        leader: str | None
        framework: str
        gpus_per_node: int
else:
    _LaunchSpec = namedtuple("LaunchSpec", ["launcher", "discovery", "procs_per_node", "command", *_SPEC_DEFAULTS],
                             defaults=tuple(_SPEC_DEFAULTS.values()))


class LaunchSpec(_LaunchSpec):
    """What ``hpcbridge launch`` does, immutable (a named tuple, not a dataclass: see hostfile.py).

    ``ssh_dir`` is the directory with the job's SSH keys (mpi.ssh.create_job_keys) and enables ssh between the
    nodes, with the job's sshd on ``ssh_port``; ``wait_timeout`` is how long rank 0 waits for every peer's sshd.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> LaunchSpec:
        self = super().__new__(cls, *args, **kwargs)
        if self.launcher not in LAUNCHERS:
            raise InvalidSpec("--launcher", self.launcher, f"use one of {', '.join(LAUNCHERS)}")
        if self.discovery not in discovery.SOURCES:
            raise InvalidSpec("--discovery", self.discovery, f"use one of {', '.join(discovery.SOURCES)}")
        if self.procs_per_node < 1:
            raise InvalidSpec("--procs-per-node", self.procs_per_node, "must be at least 1")
        if not self.command:
            raise InvalidSpec("command", None, "nothing to launch: give the command after --")
        if self.framework not in FRAMEWORKS:
            raise InvalidSpec("--framework", self.framework, f"use one of {', '.join(f for f in FRAMEWORKS if f)}")
        return self if self.extra_env is not None else self._replace(extra_env={})

    def to_args(self) -> list[str]:
        """The ``hpcbridge launch`` arguments that recreate this spec (what renderers embed)."""
        args = ["--launcher", self.launcher, "--discovery", self.discovery, "--procs-per-node", str(self.procs_per_node)]
        if self.nodes is not None:
            args += ["--nodes", str(self.nodes)]
        for host in self.hosts:
            args += ["--host", host]
        if self.node_rank is not None:
            args += ["--node-rank", str(self.node_rank)]
        if self.hostfile:
            args += ["--hostfile", self.hostfile]
        if self.leader:
            args += ["--leader", self.leader]
        if self.framework:
            args += ["--framework", self.framework]
        if self.gpus_per_node:
            args += ["--gpus-per-node", str(self.gpus_per_node)]
        if self.launcher == "torchrun" or self.framework:
            args += ["--rdzv-port", str(self.rdzv_port)]
        if self.job_id:
            args += ["--job-id", self.job_id]
        if self.ssh_dir:
            args += ["--ssh-dir", self.ssh_dir, "--ssh-port", str(self.ssh_port),
                     "--wait-timeout", f"{self.wait_timeout:g}"]
        for name in self.forward_env:
            args += ["--forward-env", name]
        return [*args, "--", *self.command]
