"""The address a framework meets at, on the real single-machine Slurm cluster, whose nodes are called node1..4
(names that resolve nowhere) at NodeAddr 127.0.0.1: a Kubeflow-style command that runs its own torchrun meets
at node 0's address, not its name; a meeting point that never answers fails the job within
HPCBRIDGE_RENDEZVOUS_TIMEOUT with one line naming it."""

from __future__ import annotations

import re
import socket
import sys
from pathlib import Path

import pytest

from bridge.adapters.base import JobState
from bridge.api.catalog import builtin_runtimes

from .conftest import finished, wait_for
from .test_slurm_adapter import submit, trainjob

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

RUNTIMES = {runtime.metadata.name: runtime for runtime in builtin_runtimes()}

#: one gloo all-reduce between the two nodes' workers, as a CustomTrainer's function would start one
ALL_REDUCE = """\
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} master {os.environ['MASTER_ADDR']} sum {int(total)}", flush=True)
dist.destroy_process_group()
"""


def resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
        return True
    except socket.gaierror:
        return False


def node_address(slurm_cluster, name: str) -> str:
    out = slurm_cluster.run("scontrol", "show", "node", "--oneliner", name).stdout
    match = re.search(r"\sNodeAddr=(\S+)", out)
    assert match, out
    return match.group(1)


def sdk_command(torchrun: str, code: str) -> list[str]:
    """The command the Kubeflow SDK's CustomTrainer gives a torch runtime (kubeflow 0.5.0's TORCH_COMMAND):
    bash writes the function to a file and runs torchrun on it, which reads the PET_* variables."""
    return ["bash", "-c", f"\nread -r -d '' SCRIPT << EOM\n\n{code}\nEOM\n"
                          f"printf \"%s\" \"$SCRIPT\" > \"train_fn.py\"\n{torchrun} \"train_fn.py\""]


@pytest.mark.parametrize("style", ["torchrun", "sdk"])
def test_kubeflow_style_torchrun_meets_at_the_node_address_not_its_name(adapter, slurm_cluster, tmp_path,
                                                                        style) -> None:
    pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --all installs it)")
    # the case this is about: Slurm's name for node 0 does not resolve here; its NodeAddr does
    assert not resolves("node1") and node_address(slurm_cluster, "node1") == "127.0.0.1"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    if style == "sdk":
        command = sdk_command(torchrun, ALL_REDUCE)
    else:
        (tmp_path / "train.py").write_text(ALL_REDUCE)
        command = [torchrun, "train.py"]
    job = trainjob(f"torch-meets-{style}", command, nodes=2, runtime=RUNTIMES["torch-distributed"],
                   deadline=600, annotations={"hpcbridge.io/workdir": str(tmp_path)})
    _plan, ref = submit(adapter, job, RUNTIMES["torch-distributed"])
    status = wait_for(adapter, ref, finished, timeout=240)
    text = "".join(adapter.logs(ref))
    assert status.state == JobState.SUCCEEDED, text
    assert "cannot be retrieved" not in text
    # one job of two ranks (not two jobs of one): both add 1 + 2
    assert sorted(re.findall(r"rank \d master \S+ sum \d+", text)) == [
        "rank 0 master 127.0.0.1 sum 3", "rank 1 master 127.0.0.1 sum 3"], text


def test_a_meeting_point_that_never_answers_fails_the_job_with_one_line(adapter, tmp_path) -> None:
    # node 0's JAX program never starts its coordinator: node 1 gives up after the bound, not after the sleep
    job = trainjob("never-meets", [sys.executable, "-c", "import time; time.sleep(600)"], nodes=2,
                   runtime=RUNTIMES["jax-distributed"], deadline=900, env={"HPCBRIDGE_RENDEZVOUS_TIMEOUT": "3"},
                   annotations={"hpcbridge.io/workdir": str(tmp_path)})
    _plan, ref = submit(adapter, job, RUNTIMES["jax-distributed"])
    status = wait_for(adapter, ref, finished, timeout=120)
    text = "".join(adapter.logs(ref))
    assert status.state == JobState.FAILED, text
    lines = [line for line in text.splitlines() if "cannot reach the rendezvous" in line]
    assert len(lines) == 1, text
    assert re.fullmatch(r"hpcbridge launch: node 1 cannot reach the rendezvous at 127\.0\.0\.1:\d+ "
                        r"\(JAX coordinator on node 0\): connection refused after 3 s "
                        r"\(HPCBRIDGE_RENDEZVOUS_TIMEOUT\)", lines[0]), lines[0]
