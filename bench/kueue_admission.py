"""200 TrainJobs through Kueue to Slurm: how long after Kueue admits a TrainJob its Slurm job exists.

Run: .venv/bin/python bench/kueue_admission.py [--jobs N]. Starts what the tests start (a real control plane
with kwok nodes, Kueue v0.17 from its Go module, a Slurm cluster on this machine) and `hpcbridge operator` as
its own process, then creates N TrainJobs labelled with a LocalQueue whose ClusterQueue admits them all.

Both times come from one watch on the TrainJobs, in this process's clock: Kueue's admission is the update
that unsuspends a TrainJob; its Slurm job exists once the operator recorded the job id it got from sbatch
(annotation operator.hpcbridge.io/job-id). Kueue's own time (creation to admission) is the baseline, measured
in the same run. Target: p99 of admission → Slurm job <= 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
KUEUE = ("kueue.x-k8s.io", "v1beta2")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    jobs = parser.parse_args().jobs
    import signal

    from kubernetes import client, watch

    from tests.harness.kube import KubeCluster
    from tests.harness.slurm import SlurmCluster

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench stops what it started (finally)
    base = Path(tempfile.mkdtemp(prefix="hpcbridge-bench-kueue-"))
    slurm = SlurmCluster(base / "slurm")
    kube = KubeCluster(base / "kube", nodes=0)
    operator = None
    slurm.start()
    kube.start()
    try:
        api = kube.api_client()
        ext = client.ApiextensionsV1Api(api)
        for path in sorted((ROOT / "manifests" / "crds").glob("*_*.yaml")):
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        time.sleep(2)
        kube.start_kueue()
        custom = client.CustomObjectsApi(api)
        custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "slurm"},
            "spec": {"type": "slurm", "slurm": {"transport": "local", "slurmConf": str(slurm.conf)},
                     "allowedNamespaces": ["default"],
                     "defaults": {"partition": "debug", "launchCommand": [sys.executable, "-m", "bridge", "launch"]}}})
        custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterTrainingRuntime", "metadata": {"name": "queued"},
            "spec": {"mlPolicy": {"numNodes": 1}, "template": {"spec": {"replicatedJobs": [{
                "name": "node", "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "none"}]}}}}}]}}}})
        custom.create_cluster_custom_object(*KUEUE, "resourceflavors", {  # admitted with it: runs on `slurm`
            "apiVersion": "/".join(KUEUE), "kind": "ResourceFlavor", "metadata": {"name": "any"},
            "spec": {"nodeLabels": {"hpcbridge.io/cluster": "slurm"}}})
        custom.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "/".join(KUEUE), "kind": "ClusterQueue", "metadata": {"name": "cq"},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
                {"name": "any", "resources": [{"name": "cpu", "nominalQuota": jobs}]}]}]}})
        custom.create_namespaced_custom_object(*KUEUE, "default", "localqueues", {
            "apiVersion": "/".join(KUEUE), "kind": "LocalQueue", "metadata": {"name": "lq"},
            "spec": {"clusterQueue": "cq"}})
        (base / "no-clusters.yaml").write_text("")
        env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig), "SLURM_CONF": str(slurm.conf),
               "XDG_STATE_HOME": str(base / "state"), "HPCBRIDGE_CONFIG": str(base / "no-clusters.yaml")}
        with open(base / "operator.log", "w") as log:
            operator = subprocess.Popen([sys.executable, "-m", "bridge", "operator"], env=env, cwd=base, stdout=log,
                                        stderr=subprocess.STDOUT)
        created: dict[str, float] = {}
        admitted: dict[str, float] = {}
        submitted: dict[str, float] = {}
        done = threading.Event()

        def follow() -> None:
            stream = watch.Watch()
            for event in stream.stream(custom.list_namespaced_custom_object, GROUP, VERSION, "default", "trainjobs",
                                       timeout_seconds=600):
                now = time.monotonic()
                obj = event["object"]
                name = obj["metadata"]["name"]
                if obj["spec"].get("suspend") is False and name not in admitted:
                    admitted[name] = now
                if "operator.hpcbridge.io/job-id" in (obj["metadata"].get("annotations") or {}) \
                        and name not in submitted:
                    submitted[name] = now
                if len(submitted) == jobs:
                    stream.stop()
            done.set()

        watcher = threading.Thread(target=follow, daemon=True)
        watcher.start()
        time.sleep(1)
        for index in range(jobs):
            name = f"bench-{index:04d}"
            created[name] = time.monotonic()
            custom.create_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", {
                "apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
                "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
                "spec": {"managedBy": "hpcbridge.io/bridge", "runtimeRef": {"name": "queued"},
                         "trainer": {"command": ["true"], "resourcesPerNode": {"requests": {"cpu": "1"}}}}})
        done.wait(600)
        both = [name for name in created if name in admitted and name in submitted]
        kueue_own = [admitted[name] - created[name] for name in both]
        to_slurm = [submitted[name] - admitted[name] for name in both]
        print(f"{len(both)}/{jobs} TrainJobs admitted by Kueue and submitted to Slurm")
        if not both:
            print(f"nothing measured; operator log {base / 'operator.log'}")
            return 1
        print(f"Kueue's own admission (created -> unsuspended):   p50 {statistics.median(kueue_own) * 1000:7.0f} ms  "
              f"p99 {percentile(kueue_own, 0.99) * 1000:7.0f} ms")
        print(f"hpc-bridge (admitted -> Slurm job exists):       p50 {statistics.median(to_slurm) * 1000:7.0f} ms  "
              f"p99 {percentile(to_slurm, 0.99) * 1000:7.0f} ms")
        print(f"ratio p99 hpc-bridge / Kueue's own:               {percentile(to_slurm, 0.99) / percentile(kueue_own, 0.99):7.2f}x")
        print(f"target p99 admitted -> Slurm job <= 1 s:          {'met' if percentile(to_slurm, 0.99) <= 1.0 else 'NOT met'}")
        return 0
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        try:
            kube.stop_kueue()
        finally:
            kube.stop()
            slurm.stop()


if __name__ == "__main__":
    sys.exit(main())
