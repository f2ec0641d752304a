"""The operator installed as users install it, for bench/operator_failover.py: real kubelet nodes
(tests/harness/kubelet.py) with the operator image loaded (tests/harness/operator_image.py), manifests/operator
applied with the Deployment at N replicas, its SSH key and known_hosts in a Secret, and a Slurm cluster in
network-namespace hosts (tests/harness/slurm.py) whose login host the pods reach over the pod network; what
tests/integration/kubernetes/test_operator_in_cluster.py sets up, started here without pytest.

Also the disruptions the bench makes: deleting a pod, a node's kubelet and containers killed and the kubelet
started again, and a second tag of the operator image in every node's containerd for a rolling update.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness.kubelet import NODE_RUN, RealNodeCluster  # noqa: E402
from tests.harness.netns import HostCluster  # noqa: E402
from tests.harness.operator_image import ensure_operator_image  # noqa: E402
from tests.harness.slurm import NetnsSlurmCluster  # noqa: E402
from tests.integration.kubernetes.test_operator import (  # noqa: E402
    GROUP,
    TEST_NAMESPACE_LABEL,
    TEST_TENANTS,
    VERSION,
    kustomize_build,
    plain_runtime,
)

SYSTEM, DEPLOYMENT, LEASE = "hpcbridge-system", "hpcbridge-operator", "hpcbridge-operator"
CLUSTER, RUNTIME, NAMESPACE = "slurm-failover", "plain-slurm", "bench-failover"
SELECTOR = f"app.kubernetes.io/name={DEPLOYMENT}"
#: the environment RealNodeCluster starts a node's daemons with (a restarted kubelet gets the same)
NODE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
            "NO_PROXY": "*", "no_proxy": "*"}


class BenchSlurm(NetnsSlurmCluster):
    """The netns Slurm cluster with room for many small jobs at once: each job asks for little memory (without a
    default, a job takes its node's whole memory and the cluster runs one job per host), and *jobs_per_cpu* jobs
    share a CPU (sleep jobs; the hosts keep the CPUs this machine has, which slurmd checks)."""

    def __init__(self, base: Path, hosts: HostCluster, jobs_per_cpu: int) -> None:
        super().__init__(base, hosts)
        self.jobs_per_cpu = jobs_per_cpu
        self.min_job_age = 3600  # finished jobs stay in squeue for the count

    def write_config(self) -> None:
        super().write_config()
        text = self.conf.read_text().replace("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                                             "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                                             f"OverSubscribe=FORCE:{self.jobs_per_cpu}")
        self.conf.write_text(text + "DefMemPerCPU=20\n")


def wait_for(what: str, check: Any, timeout: float, detail: Any = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}: {detail()}")
        time.sleep(0.2)


class InClusterOperator:
    """Slurm hosts + Slurm + real kubelet nodes + the operator Deployment; :meth:`stop` tears all down."""

    def __init__(self, base: Path, nodes: int, replicas: int, lease_seconds: float, jobs_per_cpu: int) -> None:
        self.base, self.replicas, self.lease_seconds = base, replicas, lease_seconds
        self.slurm_hosts = HostCluster(count=3, base_dir=base / "slurm-hosts")
        self.jobs_per_cpu = jobs_per_cpu
        self.slurm: BenchSlurm | None = None  # made once the hosts are up: it counts them
        self.kube = RealNodeCluster(base / "kube", nodes=nodes, gpus=0)
        self.workdir = base / "jobs"
        self.workdir.mkdir(parents=True)
        self.image_ref = ""
        self.api: Any = None

    def start(self) -> None:
        from kubernetes import client

        self.slurm_hosts.start()
        self.slurm = BenchSlurm(self.base / "slurm", self.slurm_hosts, self.jobs_per_cpu)
        self.slurm.start()
        self.kube.start()
        image = ensure_operator_image()
        self.kube.load_image(image)
        self.kube.reach(self.slurm_hosts)
        self.image_ref = image.ref
        self.api = self.kube.api_client()
        self.core, self.apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        self.custom, self.leases = client.CustomObjectsApi(self.api), client.CoordinationV1Api(self.api)
        self._install()

    def stop(self) -> None:
        for step in (self.kube.stop, self.slurm.stop if self.slurm else lambda: None, self.slurm_hosts.stop):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - every step runs; what failed is said
                print(f"teardown: {step.__qualname__}: {exc}", file=sys.stderr)

    def slurm_conf(self) -> Path:
        assert self.slurm is not None, "start() first"
        return self.slurm.conf

    # ---- install

    def _install(self) -> None:
        from kubernetes import client, utils

        docs = kustomize_build(ROOT / "manifests" / "operator")
        for doc in [d for d in docs if d["kind"] != "Deployment"]:
            utils.create_from_dict(self.api, doc)
        wait_for("the CRDs established", lambda: {"trainjobs.trainer.kubeflow.org", "bridgeclusters.hpcbridge.io"} <= {
            c.metadata.name for c in client.ApiextensionsV1Api(self.api).list_custom_resource_definition().items
            if any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])}, 60)
        hosts = self.slurm_hosts
        self.core.create_namespaced_secret(SYSTEM, {
            "metadata": {"name": "hpcbridge-credentials"}, "type": "Opaque",
            "stringData": {"id_ed25519": hosts.client_key.read_text(), "known_hosts": hosts.known_hosts.read_text()}})
        ref = {"name": "hpcbridge-credentials"}
        self.custom.create_cluster_custom_object("hpcbridge.io", "v1alpha1", "bridgeclusters", {
            "apiVersion": "hpcbridge.io/v1alpha1", "kind": "BridgeCluster", "metadata": {"name": CLUSTER}, "spec": {
                "type": "slurm", "tenants": TEST_TENANTS,
                "slurm": {"transport": "ssh", "host": hosts.host("node-0").ip, "user": "root",
                          "slurmConf": str(self.slurm_conf()), "keySecretRef": {**ref, "key": "id_ed25519"},
                          "knownHostsSecretRef": {**ref, "key": "known_hosts"}},
                # the steps run on the Slurm hosts, which share this machine's files: this checkout's package
                "defaults": {"launchCommand": ["env", f"PYTHONPATH={ROOT}", sys.executable, "-m", "bridge", "launch"],
                             "workdir": str(self.workdir)}}})
        self.custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", plain_runtime(RUNTIME))
        self.core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {TEST_NAMESPACE_LABEL: "yes"}}})
        binding = yaml.safe_load((ROOT / "manifests" / "operator" / "namespace-binding.yaml").read_text())
        binding["metadata"]["namespace"] = NAMESPACE
        client.RbacAuthorizationV1Api(self.api).create_namespaced_role_binding(NAMESPACE, binding)
        deployment = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == self.image_ref
        deployment["spec"]["replicas"] = self.replicas
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        container["imagePullPolicy"] = "Never"  # nothing is pulled here: the image is in every node's containerd
        container["args"] = [*container["args"], "--lease-duration", f"{self.lease_seconds:g}"]
        self.apps.create_namespaced_deployment(SYSTEM, deployment)
        self.wait_settled(300)

    # ---- state

    def pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(SYSTEM, label_selector=SELECTOR).items)

    def lease(self) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.leases.read_namespaced_lease(LEASE, SYSTEM).spec
        except ApiException:
            return None

    def holder(self) -> str | None:
        spec = self.lease()
        return spec.holder_identity if spec is not None else None

    def active(self, timeout: float = 180) -> Any:
        """The live, undeleted pod that holds the Lease (waits for one)."""
        def find() -> Any:
            name = self.holder()
            return next((p for p in self.pods() if p.metadata.name == name and p.metadata.deletion_timestamp is None
                         and p.status.phase == "Running"), None)

        return wait_for("a pod holding the Lease", find, timeout, self.logs)

    def wait_settled(self, timeout: float) -> None:
        """Every replica of the current template ready, no pod terminating, and one of them holds the Lease."""
        def settled() -> bool:
            dep = self.apps.read_namespaced_deployment(DEPLOYMENT, SYSTEM)
            status, pods = dep.status, self.pods()
            names = {p.metadata.name for p in pods}
            return (status.observed_generation or 0) >= dep.metadata.generation and \
                status.updated_replicas == status.ready_replicas == self.replicas and len(pods) == self.replicas \
                and all(p.metadata.deletion_timestamp is None for p in pods) and self.holder() in names

        wait_for("the Deployment settled", settled, timeout, self.logs)

    def logs(self) -> str:
        out = []
        for pod in self.pods():
            try:
                log = self.core.read_namespaced_pod_log(pod.metadata.name, SYSTEM, tail_lines=30)
            except Exception as exc:  # noqa: BLE001 - only for a failure message
                log = f"(no log: {exc})"
            out.append(f"--- {pod.metadata.name} on {pod.spec.node_name}: {pod.status.phase}\n{log}")
        return "\n".join(out) + f"\nLease holder: {self.holder()}"

    # ---- disruptions

    def delete_pod(self, name: str) -> None:
        """`kubectl delete pod`: the default grace period, SIGTERM first (the operator releases the Lease)."""
        self.core.delete_namespaced_pod(name, SYSTEM)

    def lose_node(self, node: str) -> None:
        """A node's kubelet and every container on it killed (SIGKILL), as a crash of the node's agent that takes
        its pods with it: the pods' processes (pause included) die at once, nothing is released; containerd,
        kube-proxy and the node's network stay (the fail-over waits for the Lease to expire either way)."""
        proc = self.kube.procs[f"kubelet-{node}"]
        proc.kill()
        proc.wait(timeout=30)
        host = self.kube.hosts.host(node)
        in_node = {int(p) for p in subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                                                  text=True).stdout.split()}
        table = [line.split(None, 2) for line in subprocess.run(["ps", "-e", "-o", "pid=,ppid=,comm="],
                                                                capture_output=True, text=True).stdout.splitlines()]
        shims = {int(pid) for pid, _, comm in table if int(pid) in in_node and comm.startswith("containerd-shim")}
        children: dict[int, list[int]] = {}
        for pid, ppid, _ in table:
            children.setdefault(int(ppid), []).append(int(pid))
        todo, doomed = [c for s in shims for c in children.get(s, [])], set()
        while todo:
            pid = todo.pop()
            if pid not in doomed:
                doomed.add(pid)
                todo.extend(children.get(pid, []))
        if doomed:
            subprocess.run(["kill", "-KILL", *map(str, sorted(doomed))], capture_output=True)

    def restart_kubelet(self, node: str) -> None:
        """The kubelet started again as RealNodeCluster started it (same argv, log and environment); it finds its
        pods' containers dead and starts them again."""
        name = f"kubelet-{node}"
        argv = list(self.kube.procs[name].args)
        with open(self.kube.log_dir / f"{name}.log", "ab") as log:
            self.kube.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                     stdin=subprocess.DEVNULL, env=NODE_ENV, start_new_session=True)

    def tag_image(self, tag: str) -> str:
        """A second name for the operator image in every node's containerd (same content, a new tag, as a
        release with nothing changed would be); returns the new reference."""
        new_ref = f"{self.image_ref.rsplit(':', 1)[0]}:{tag}"
        ctr = ["ctr", "--address", f"{NODE_RUN}/containerd/containerd.sock", "--namespace", "k8s.io"]
        for host in self.kube.hosts.hosts:
            listed = self.kube.hosts.exec_in_host(host, [*ctr, "images", "ls", "-q"]).stdout.split()
            source = next(n for n in listed if n == self.image_ref or n == f"docker.io/{self.image_ref}")
            done = self.kube.hosts.exec_in_host(host, [*ctr, "images", "tag", "--force", source, new_ref])
            if done.returncode != 0:
                raise SystemExit(f"tagging {source} as {new_ref} on {host.name}: {done.stderr}")
        return new_ref

    def set_image(self, ref: str) -> None:
        self.apps.patch_namespaced_deployment(DEPLOYMENT, SYSTEM, {"spec": {"template": {"spec": {
            "containers": [{"name": "operator", "image": ref}]}}}})
