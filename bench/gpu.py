"""GPU check on a machine with NVIDIA GPUs: the torch NCCL and JAX examples through the local cluster, each
node's devices checked, and the end-to-end cost against a bare ``torchrun --standalone`` in the same run.

Run: .venv/bin/python bench/gpu.py [--runs N]. Without a GPU it says so and exits 0 (CI never has one).
Checks, each printed as it ends:
- torch, 1 node x all GPUs, NCCL all-reduce: hpcbridge submit against bare torchrun (interleaved runs,
  medians, ratio; target <= 1.05x);
- torch, 2 nodes x half the GPUs each (with 2 GPUs or more): every rank on its own GPU, the nodes disjoint;
- JAX, 2 nodes (or 1) with all their GPUs: each process drives its node's GPUs and nobody else's (skipped
  when jax has no CUDA backend: pip install 'jax[cuda12]');
- XGBoost, 2 nodes x one worker per GPU: each worker on its own GPU (skipped without a CUDA xgboost).
Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

TORCH = """\
import os, torch, torch.distributed as dist
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
value = torch.ones(1, device="cuda")
dist.all_reduce(value)
uuid = str(torch.cuda.get_device_properties(local).uuid)
ok = value.item() == dist.get_world_size()
print(f"rank {dist.get_rank()} node {os.environ.get('GROUP_RANK')} gpu {uuid} allreduce {'OK' if ok else 'WRONG'}",
      flush=True)
dist.destroy_process_group()
"""

JAX = """\
import os, jax
jax.distributed.initialize(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"],
                           num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
                           process_id=int(os.environ["JAX_PROCESS_ID"]))
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
mine = [visible[d.local_hardware_id] if visible != [""] else str(d.local_hardware_id) for d in jax.local_devices()]
print(f"process {jax.process_index()} gpus {','.join(mine)} of {jax.device_count()}", flush=True)
jax.distributed.shutdown()
"""

XGB = """\
import os, xgboost, numpy
print(f"task {os.environ['DMLC_TASK_ID']} gpus {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
"""


def gpus() -> list[str]:
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in listing.splitlines() if line.startswith("GPU ")]


def trainjob(workdir: Path, name: str, runtime: str, nodes: int, gpus_per_node: int, command: list[str],
             procs: int | None = None) -> Path:
    trainer: dict = {"numNodes": nodes, "command": command,
                     "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus_per_node}}}
    if procs:
        trainer["numProcPerNode"] = procs
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                    "metadata": {"name": name, "annotations": {"hpcbridge.io/workdir": str(workdir)}},
                                    "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer}}))
    return path


def submit(path: Path, env: dict[str, str]) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bridge", "submit", str(path), "--rerun"], capture_output=True,
                          text=True, env=env, timeout=900)
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def report(name: str, ok: bool, detail: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=6, help="interleaved runs of each side of the ratio")
    runs = parser.parse_args().runs
    found = gpus()
    if not found:
        print("no NVIDIA GPU here (nvidia-smi -L lists none): nothing to check")
        return 0
    count = len(found)
    print(f"{count} GPU(s): " + "; ".join(found), flush=True)
    work = Path(tempfile.mkdtemp(prefix="hpcbridge-gpu-check-"))
    env = {**os.environ, "XDG_STATE_HOME": str(work / "state")}
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the local cluster lends every GPU nvidia-smi lists
    python = sys.executable
    ok = True
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIP torch checks: torch is not installed")
    else:
        (work / "nccl.py").write_text(TORCH)
        job = trainjob(work, "nccl-1node", "torch-distributed", 1, count, [python, "nccl.py"])
        bare = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={count}", "nccl.py"]
        ours, theirs = [], []
        for _ in range(runs):
            code, text, seconds = submit(job, env)
            if code or text.count("allreduce OK") != count:
                ok = report("torch 1 node", False, text[-2000:])
                break
            ours.append(seconds)
            start = time.perf_counter()
            subprocess.run(bare, cwd=work, env=env, check=True, capture_output=True, timeout=900)
            theirs.append(time.perf_counter() - start)
        else:
            ratio = statistics.median(ours) / statistics.median(theirs)
            ok &= report("torch 1 node", True, f"hpcbridge submit {statistics.median(ours):.2f} s, bare torchrun "
                         f"--standalone {statistics.median(theirs):.2f} s (medians of {runs}): ratio {ratio:.3f}x "
                         f"(target <= 1.05x: {'met' if ratio <= 1.05 else 'NOT met'})")
        if count >= 2:
            half = count // 2
            code, text, _ = submit(trainjob(work, "nccl-2nodes", "torch-distributed", 2, half, [python, "nccl.py"]),
                                   env)
            ranks = re.findall(r"rank (\d+) node (\d) gpu (\S+) allreduce OK", text)
            nodes = {node: {gpu for _, n, gpu in ranks if n == node} for _, node, _ in ranks}
            ok &= report("torch 2 nodes", code == 0 and len(ranks) == 2 * half and
                         len({gpu for *_, gpu in ranks}) == 2 * half and len(nodes) == 2,
                         f"node GPUs {dict(sorted((k, sorted(v)) for k, v in nodes.items()))}" if code == 0
                         else text[-2000:])
    try:
        import jax

        jax_gpu = bool(jax.devices("gpu"))
    except Exception:  # no jax, or no CUDA backend in it
        jax_gpu = False
    if not jax_gpu:
        print("SKIP jax: jax has no CUDA backend here (pip install 'jax[cuda12]')")
    else:
        (work / "jax_gpus.py").write_text(JAX)
        nodes = 2 if count >= 2 else 1
        code, text, _ = submit(trainjob(work, "jax-gpus", "jax-distributed", nodes, count // nodes,
                                        [python, "jax_gpus.py"]), env)
        seen = re.findall(r"process (\d) gpus (\S+) of (\d+)", text)
        devices = [gpu for _, listed, _ in seen for gpu in listed.split(",")]
        distinct = len(devices) == len(set(devices)) == nodes * (count // nodes)
        ok &= report("jax", code == 0 and len(seen) == nodes and distinct,
                     f"processes {seen}" if code == 0 else text[-2000:])
    try:
        import xgboost

        xgb_gpu = bool(xgboost.build_info().get("USE_CUDA"))
    except ImportError:
        xgb_gpu = False
    if not xgb_gpu or count < 2:
        print("SKIP xgboost: needs a CUDA xgboost (pip install xgboost) and 2 GPUs or more")
    else:
        (work / "xgb_gpus.py").write_text(XGB)
        code, text, _ = submit(trainjob(work, "xgb-gpus", "xgboost-distributed", 2, count // 2,
                                        [python, "xgb_gpus.py"]), env)
        tasks = re.findall(r"task (\d+) gpus (\S+)", text)
        ok &= report("xgboost", code == 0 and len(tasks) == 2 * (count // 2) and
                     len({gpu for _, gpu in tasks}) == len(tasks), f"workers {sorted(tasks)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
