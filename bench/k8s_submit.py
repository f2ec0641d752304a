"""200 TrainJobs submitted through the Kubernetes adapter against 200 raw JobSet creates with the same client,
in the same run, on the real test control plane (tests/harness/kube.py; builds it on first use).

Run: .venv/bin/python bench/k8s_submit.py [--jobs N]. Also prints the control plane's start time.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from bridge.adapters.kubernetes import GROUP, PLURAL, VERSION, KubernetesAdapter  # noqa: E402
from bridge.api import load_documents  # noqa: E402
from bridge.api.catalog import builtin_runtimes  # noqa: E402
from bridge.api.cluster import BridgeCluster  # noqa: E402
from bridge.plan import find_runtime, resolve  # noqa: E402
from tests.harness import layer  # noqa: E402
from tests.harness.kube import KubeCluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    count = parser.parse_args().jobs
    # the layer's submission record of this run only: a fresh cluster reuses job ids
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="hpcbridge-bench-state-")
    kube = KubeCluster(Path(tempfile.mkdtemp(prefix="hpcbridge-bench-k8s-")))
    started = time.perf_counter()
    kube.start()
    print(f"control plane start:                   {time.perf_counter() - started:6.1f} s")
    try:
        from kubernetes import client

        api = kube.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        for ns in ("bench-raw", "bench-ours"):
            core.create_namespace({"metadata": {"name": ns}})
        cluster = BridgeCluster.model_validate({
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": "k8s"},
            "spec": {"type": "kubernetes", "kubernetes": {"kubeconfig": str(kube.kubeconfig)}}})
        adapter = KubernetesAdapter(cluster, api_client=api)
        artifacts = []
        for i in range(count):
            job = load_documents(yaml.safe_dump({
                "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": f"job-{i}", "namespace": "bench-ours"},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True,
                         "trainer": {"numNodes": 2, "command": ["python3", "t.py"]}}}))[0]
            artifacts.append(adapter.render(resolve(job, find_runtime(job, builtin_runtimes()), cluster)))
        raw_bodies = []
        for artifact in artifacts:  # the same JobSets, created by hand in another namespace
            body = copy.deepcopy(yaml.safe_load(artifact.main))
            body["metadata"]["namespace"] = "bench-raw"
            raw_bodies.append(body)

        raw = ours = 0.0
        refs = []
        step = 20  # interleaved in chunks, so server warm-up and noise hit both sides alike
        for first in range(0, count, step):
            start = time.perf_counter()
            for body in raw_bodies[first:first + step]:
                custom.create_namespaced_custom_object(GROUP, VERSION, "bench-raw", PLURAL, body)
            raw += time.perf_counter() - start
            start = time.perf_counter()
            refs += layer.submit_many(adapter, artifacts[first:first + step])
            ours += time.perf_counter() - start
        assert len({r.job_id for r in refs}) == count
        print(f"{count} raw JobSet creates:                {raw:6.2f} s")
        print(f"{count} TrainJobs through the adapter:     {ours:6.2f} s")
        print(f"ratio adapter / raw:                   {ours / raw:6.2f}x   (target <= 1.10)")
        start = time.perf_counter()
        assert layer.submit_many(adapter, artifacts) == refs
        print(f"resubmitting all {count} (idempotent):      {time.perf_counter() - start:6.2f} s (one list call)")
    finally:
        kube.stop()


if __name__ == "__main__":
    main()
