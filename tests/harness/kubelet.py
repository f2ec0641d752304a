"""A Kubernetes cluster whose nodes run containers: real kubelets with containerd, each in its own network
namespace, plus CoreDNS, on top of the control plane of tests/harness/kube.py.

Why: kwok nodes run no process, so they prove scheduling, never execution. Here a JobSet's pods really start
`hpcbridge launch` from this checkout (tests/harness/node_image.py), talk over the pod network and end with the
command's exit code. Why each setting is needed is said where it is made, below.

Layout (defaults, 2 nodes):

* the emulated hosts of tests/harness/netns.py on bridge ``br-hpck`` (10.78.0.0/24): host ``kube-node-i`` at
  10.78.0.(10+i) with its own network, UTS and mount namespaces; the API server and CoreDNS listen on the
  bridge's 10.78.0.1;
* in each host's mount namespace: tmpfs with everything of that node's run (containerd state and socket,
  /var/lib/kubelet, /run/netns, CNI config and IP leases, pod logs) and stand-ins over the kernel settings kubelet writes, so
  the machine's own are never touched; when the namespace ends, every mount of the node ends with it;
* containerd (Debian's, cgroupfs, runc) and kubelet (built from k8s.io/kubernetes at the control plane's
  version) in those namespaces; pods on node i get 10.79.i.0/24 from the CNI bridge plugin, and each
  namespace (and the root one) routes the other nodes' pod subnets to them, so pod-to-pod traffic crosses
  hosts as it would between machines;
* kube-proxy (iptables mode, built like kubelet) in each node's namespace, so pods reach the API server through
  the ``kubernetes`` Service (10.96.0.1:443, in-cluster configuration) and one another through Services;
  :meth:`RealNodeCluster.reach` gives the nodes a leg on another host cluster's bridge (the Slurm hosts), through
  which their pods reach those hosts as pods reach a site's network;
* :meth:`RealNodeCluster.load_image` imports a further image (the operator's) into every node's containerd;
* node ``kube-node-0`` has no GPU; the others run the fake device plugin (tests/harness/kube_build/fakegpu),
  so the scheduler sees ``nvidia.com/gpu`` capacity only there and containers get NVIDIA_VISIBLE_DEVICES;
* containerd's image store stays on disk under ``<cache root>/kube-nodes/<node>`` between runs: an image is
  imported once per content key, not on every run.

Stopping kills, per node, every process in its network namespace and all their descendants (containers
included), then tears down the hosts and the control plane.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.harness import node_image
from tests.harness.kube import (
    COMPONENTS,
    NODE_COMPONENTS,
    KubeCluster,
    cache_root,
    ensure_built,
    sign_client_cert,
)
from tests.harness.netns import HostCluster

BRIDGE, SUBNET, POD_SUBNET = "br-hpck", "10.78.0", "10.79"
#: the `kubernetes` Service's cluster IP (the first of the API server's service range): kube-proxy is ready once
#: its rules name it
KUBERNETES_SERVICE_IP = "10.96.0.1"
GPU_RESOURCE = "nvidia.com/gpu"
#: kernel settings kubelet writes at start-up; each gets a writable stand-in in the node's mount namespace
KERNEL_STANDINS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1"}
#: where each node's run state lives inside its own mount namespace (a tmpfs there)
NODE_RUN = "/run/hpcbridge-node"


class RealNodeError(RuntimeError):
    """The real-node cluster could not start; the message carries the failing component's log."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _descendants(roots: set[int]) -> set[int]:
    """*roots* and every process below them (by parent pid, from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


class RealNodeCluster:
    """Control plane + ``nodes`` real kubelet nodes; see the module docstring. ``gpus`` fake GPUs on every
    node but the first. Attributes after :meth:`start`: ``kube`` (the KubeCluster: kubeconfig, api_client),
    ``hosts`` (the HostCluster), ``node_names``, ``images`` (name -> node_image.Image), ``startup_seconds``."""

    def __init__(self, base_dir: Path, nodes: int = 2, gpus: int = 2) -> None:
        self.base_dir = Path(base_dir)
        self.count, self.gpus = nodes, gpus
        self.hosts = HostCluster(count=nodes, base_dir=self.base_dir / "hosts", subnet=SUBNET, bridge=BRIDGE,
                                 prefix="kube-node")
        self.kube = KubeCluster(self.base_dir / "control-plane", nodes=0, address=self.hosts.gateway)
        self.node_names: list[str] = []
        self.images: dict[str, node_image.Image] = {}
        self.binaries: dict[str, Path] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.startup_seconds = 0.0
        self.timings: dict[str, float] = {}
        self.log_dir = self.base_dir / "logs"
        #: bridges of other host clusters the pods reach (:meth:`reach`)
        self.reached: set[str] = set()

    # ---- lifecycle

    def start(self, timeout: float = 240.0) -> None:
        started = time.monotonic()
        self.binaries = ensure_built((*COMPONENTS, *NODE_COMPONENTS))
        self.images["node"] = node_image.node_image()
        self.timings["build"] = time.monotonic() - started
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.hosts.start()
            self._route_pod_subnets()
            self.kube.start()
            self._start_coredns()
            pause = self._pause_image()
            for index, host in enumerate(self.hosts.hosts):
                self._start_node(index, host, pause)
            self.node_names = [host.name for host in self.hosts.hosts]
            self._wait_nodes(time.monotonic() + timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Kubelets first (they would restart what is killed), then every node's processes and containers,
        then CoreDNS, the hosts and the control plane. Every step runs even when one before it failed (a
        half-stopped cluster would leave a CoreDNS answering for a dead API server on the next run's address)."""
        errors: list[BaseException] = []

        def step(function, *args, **kwargs) -> None:
            try:
                function(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - reported after every step ran
                errors.append(exc)

        for name in [n for n in self.procs if n.startswith("kubelet-")]:
            step(self._stop_proc, name)
        step(self._kill_node_processes)
        for name in list(self.procs):
            step(self._stop_proc, name)
        for index in range(self.count):
            step(subprocess.run, ["ip", "route", "del", f"{POD_SUBNET}.{index}.0/24"], capture_output=True)
        step(self.hosts.stop)
        step(self.kube.stop)
        if errors:
            raise errors[0]

    def _kill_node_processes(self) -> None:
        """Everything in each node's network namespace (containerd, its shims) and below it (the containers)."""
        for host in self.hosts.hosts:
            pids = {int(p) for p in subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True,
                                                   text=True).stdout.split()}
            pids.discard(host.pid)  # the holder goes last, with the hosts
            for pid in _descendants(pids):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _stop_proc(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)

    def api_client(self) -> Any:
        return self.kube.api_client()

    # ---- network

    def _route_pod_subnets(self) -> None:
        """Node i's pods are 10.79.i.0/24, reached through node i from everywhere else."""
        hosts = self.hosts.hosts
        for index, host in enumerate(hosts):
            subnet = f"{POD_SUBNET}.{index}.0/24"
            subprocess.run(["ip", "route", "replace", subnet, "via", host.ip], check=True)
            for other in hosts:
                if other is not host:
                    subprocess.run(["ip", "-n", other.netns, "route", "replace", subnet, "via", host.ip], check=True)
            subprocess.run(["ip", "-n", host.netns, "route", "replace", "default", "via", self.hosts.gateway],
                           check=True)

    # ---- processes

    def _spawn(self, name: str, argv: list[str], host=None, env: dict[str, str] | None = None) -> None:
        full = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                "NO_PROXY": "*", "no_proxy": "*", **(env or {})}
        if host is not None:
            argv = self.hosts.nsenter_argv(host, argv)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                env=full, start_new_session=True)

    def _wait(self, what: str, deadline: float, check, names: tuple[str, ...] = ()) -> None:
        last: BaseException | None = None
        while True:
            for name in names or tuple(self.procs):
                proc = self.procs.get(name)
                if proc is not None and proc.poll() is not None:
                    raise RealNodeError(f"{name} exited with {proc.returncode} while waiting for {what}; "
                                        f"log {self.log_dir / (name + '.log')}:\n{_tail(self.log_dir / (name + '.log'))}")
            try:
                if check():
                    return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}.log\n{_tail(self.log_dir / (n + '.log'), 12)}" for n in names or self.procs)
                raise RealNodeError(f"timed out waiting for {what} (last error: {last!r})\n{logs}")
            time.sleep(0.2)

    def _in_node(self, host, script: str) -> None:
        proc = self.hosts.exec_in_host(host, ["sh", "-ec", script], timeout=600)
        if proc.returncode != 0:
            raise RealNodeError(f"on {host.name}: {script.strip()[:200]}... failed: {proc.stderr.strip()[-2000:]}")

    # ---- cluster DNS

    def _start_coredns(self) -> None:
        corefile = self.base_dir / "Corefile"
        gateway = self.hosts.gateway
        corefile.write_text(f"""cluster.local:53 {{
    bind {gateway}
    errors
    kubernetes cluster.local {{
        kubeconfig {self.kube.kubeconfig} hpcbridge-test
        pods insecure
    }}
}}
.:53 {{
    bind {gateway}
    errors
}}
""")
        self._spawn("coredns", [str(self.binaries["coredns"]), "-conf", str(corefile)])
        import socket

        def answers() -> bool:  # a DNS query for the API service's name answered with an address
            query = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" +
                     b"".join(bytes([len(p)]) + p.encode() for p in "kubernetes.default.svc.cluster.local".split("."))
                     + b"\x00\x00\x01\x00\x01")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.settimeout(1)
                sock.sendto(query, (gateway, 53))
                reply = sock.recv(512)
            return reply[:2] == b"\x12\x34" and (reply[3] & 0x0F) in (0, 3)  # NOERROR or NXDOMAIN: serving

        self._wait("CoreDNS answering", time.monotonic() + 60, answers, ("coredns",))

    # ---- images

    def _pause_image(self) -> str:
        """The sandbox image: the pause binary alone in one layer, content-keyed like the node image."""
        binary = self.binaries["pause"]
        key = binary.parent.parent.name.split("-", 1)[1]
        ref = f"hpcbridge.test/pause:{key}"
        archive = cache_root() / "images" / f"pause-{key}.tar"
        if not archive.exists():
            layer = archive.with_suffix(".layer")
            shutil.rmtree(layer, ignore_errors=True)
            (layer / "layer").mkdir(parents=True)
            shutil.copy2(binary, layer / "layer" / "pause")
            diff_id = node_image.layer_tar(layer / "layer", layer / "layer.tar", layer / "build.log")
            (layer / "layer.sha256").write_text(diff_id)
            node_image.write_archive(ref, [layer], archive, {"Entrypoint": ["/pause"]})
            shutil.rmtree(layer)
        self.images["pause"] = node_image.Image(ref, archive, key)
        return ref

    def _import_images(self, host, socket_path: str) -> None:
        """Import into this node's containerd the images it does not hold yet (its store persists)."""
        for image in self.images.values():
            self._import_image(host, socket_path, image)

    def _import_image(self, host, socket_path: str, image: node_image.Image) -> None:
        """*image* into this node's containerd unless it holds that content under that name already: a tag
        (the operator's version) can name new content, so what was imported is recorded beside the store."""
        ctr = ["ctr", "--address", socket_path, "--namespace", "k8s.io"]
        listed = self.hosts.exec_in_host(host, [*ctr, "images", "ls", "-q"]).stdout.split()
        record = cache_root() / "kube-nodes" / host.name / "imported" / image.ref.replace("/", "_")
        held = image.ref in listed or f"docker.io/{image.ref}" in listed
        if held and record.exists() and record.read_text() == image.key:
            return
        started = time.monotonic()
        proc = self.hosts.exec_in_host(host, [*ctr, "images", "import", "--no-unpack=false", str(image.archive)],
                                       timeout=900)
        if proc.returncode != 0:
            raise RealNodeError(f"importing {image.ref} on {host.name}: {proc.stderr.strip()[-1500:]}")
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(image.key)
        self.timings[f"import {image.ref} on {host.name}"] = time.monotonic() - started

    def load_image(self, image: node_image.Image) -> None:
        """Import *image* (a docker-archive, e.g. tests/harness/operator_image.py's) into every node's containerd,
        where pods with ``imagePullPolicy: Never`` or ``IfNotPresent`` find it; kept in :attr:`images`."""
        self.images[image.ref] = image
        for host in self.hosts.hosts:
            self._import_image(host, f"{NODE_RUN}/containerd/containerd.sock", image)

    # ---- nodes

    def _start_node(self, index: int, host, pause: str) -> None:
        name = host.name
        store = cache_root() / "kube-nodes" / name / "containerd"
        store.mkdir(parents=True, exist_ok=True)
        run = NODE_RUN
        standins = " ".join(f"echo {value} > {run}/sysctl/{path.replace('/', '_')}; "
                            f"mount --bind {run}/sysctl/{path.replace('/', '_')} /proc/sys/{path};"
                            for path, value in KERNEL_STANDINS.items())
        # the node's mounts: shared among themselves (kubelet's volume propagation), private to the machine
        self._in_node(host, f"""
            mkdir -p {run} && mount -t tmpfs -o mode=0755 hpcbridge-node {run}
            mount --make-rshared /
            mkdir -p {run}/sysctl {run}/cni {run}/containerd {run}/pod-logs /run/netns /var/lib/kubelet
            mount -t tmpfs -o mode=0755 netns /run/netns
            mount -t tmpfs -o mode=0755 kubelet /var/lib/kubelet
            {standins}
            echo 1 > /proc/sys/net/ipv4/ip_forward
            """)
        node_dir = self.base_dir / "nodes" / name
        node_dir.mkdir(parents=True, exist_ok=True)
        socket_path = f"{run}/containerd/containerd.sock"
        (node_dir / "containerd.toml").write_text(f"""version = 2
root = "{store}"
state = "{run}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{socket_path}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{run}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{run}/cni"
""")
        conflist = {"cniVersion": "1.0.0", "name": "hpcbridge-pods", "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": f"{POD_SUBNET}.{index}.0/24"}]],
                     "routes": [{"dst": "0.0.0.0/0"}], "dataDir": f"{run}/cni/leases"}}]}
        self._in_node(host, f"cat > {run}/cni/10-hpcbridge.conflist <<'EOF'\n{json.dumps(conflist)}\nEOF")
        self._spawn(f"containerd-{name}", ["containerd", "--config", str(node_dir / "containerd.toml")], host)
        self._wait(f"containerd on {name}", time.monotonic() + 60, lambda: self.hosts.exec_in_host(
            host, ["ctr", "--address", socket_path, "version"]).returncode == 0, (f"containerd-{name}",))
        self._import_images(host, socket_path)

        kubeconfig = self._client_kubeconfig(node_dir, "kubelet", f"system:node:{name}", "system:nodes")
        resolv = node_dir / "resolv.conf"  # pods get the cluster DNS only, not this machine's search domains
        resolv.write_text("")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": host.ip, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            # the API server's client certificate (from the test CA) is the only way in
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.kube.ca_file)}},
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDomain": "cluster.local", "clusterDNS": [self.hosts.gateway], "resolvConf": str(resolv),
            "containerRuntimeEndpoint": f"unix://{socket_path}",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failSwapOn": False, "localStorageCapacityIsolation": False, "oomScoreAdj": 0,
            "makeIPTablesUtilChains": False, "protectKernelDefaults": False,
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "podLogsDir": f"{run}/pod-logs", "serializeImagePulls": False, "maxPods": 50,
            "registerNode": True, "syncFrequency": "10s", "fileCheckFrequency": "20s",
        }
        (node_dir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self._spawn(f"kubelet-{name}", [
            str(self.binaries["kubelet"]), f"--config={node_dir / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
            "--root-dir=/var/lib/kubelet", "--cert-dir=/var/lib/kubelet/pki", f"--hostname-override={name}",
            f"--node-ip={host.ip}", "--v=1"], host)
        if index > 0 and self.gpus:
            plugins = "/var/lib/kubelet/device-plugins"  # kubelet's fixed path, whatever its root dir
            self._wait(f"kubelet device plugin socket on {name}", time.monotonic() + 60, lambda: self.hosts.exec_in_host(
                host, ["test", "-S", f"{plugins}/kubelet.sock"]).returncode == 0, (f"kubelet-{name}",))
            self._spawn(f"fakegpu-{name}", [str(self.binaries["fakegpu"]), "-dir", plugins, "-count", str(self.gpus),
                                            "-prefix", f"GPU-{name}"], host)
        self._start_kube_proxy(host, node_dir)

    def _client_kubeconfig(self, node_dir: Path, name: str, user: str, group: str | None) -> Path:
        """A kubeconfig for *user* (in *group*) with a client certificate from the test CA."""
        cert, key = sign_client_cert(self.kube.pki, node_dir, f"{name}-client", user, group)
        kubeconfig = node_dir / f"{name}.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "test", "cluster": {"server": self.kube.api_url,
                                                      "certificate-authority": str(self.kube.ca_file)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "test", "user": "node"}}]}))
        return kubeconfig

    def _start_kube_proxy(self, host, node_dir: Path) -> None:
        """kube-proxy in iptables mode, in the node's network namespace (its rules are that namespace's only), as
        ``system:kube-proxy`` (the role the API server gives it at bootstrap). It leaves the kernel's conntrack
        limits and route_localnet alone (machine-wide or not needed), and masquerades all Service traffic so that a
        pod reaching a Service whose endpoint is on its own node's bridge gets the reply back through the node."""
        kubeconfig = self._client_kubeconfig(node_dir, "kube-proxy", "system:kube-proxy", None)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}, "hostnameOverride": host.name,
            "bindAddress": host.ip, "mode": "iptables", "clusterCIDR": f"{POD_SUBNET}.0.0/16",
            "healthzBindAddress": f"{host.ip}:10256", "metricsBindAddress": "127.0.0.1:10249",
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                          "udpTimeout": "0s", "udpStreamTimeout": "0s"},
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "syncPeriod": "30s",
                         "minSyncPeriod": "0s"},
        }
        (node_dir / "kube-proxy.yaml").write_text(yaml.safe_dump(config))
        name = f"kube-proxy-{host.name}"
        self._spawn(name, [str(self.binaries["kube-proxy"]), f"--config={node_dir / 'kube-proxy.yaml'}", "--v=1"], host)
        self._wait(f"kube-proxy on {host.name}", time.monotonic() + 60, lambda: self.hosts.exec_in_host(
            host, ["iptables", "-t", "nat", "-S", "KUBE-SERVICES"]).stdout.count(KUBERNETES_SERVICE_IP) > 0, (name,))

    def reach(self, other: HostCluster) -> None:
        """Pods reach *other*'s hosts (e.g. the Slurm cluster's login node) as pods reach a site's network: each
        node gets a leg on *other*'s bridge and masquerades its pods' traffic leaving through it, so *other*'s
        hosts need no route back. Gone with the nodes' namespaces."""
        if other.bridge in self.reached:
            return
        inside = f"site{len(self.reached)}"
        for index, host in enumerate(self.hosts.hosts):
            leg = f"{BRIDGE}-x{len(self.reached)}{index}"
            subprocess.run(["ip", "link", "del", leg], capture_output=True)
            subprocess.run(["ip", "link", "add", leg, "type", "veth", "peer", "name", inside, "netns", host.netns],
                           check=True)
            subprocess.run(["ip", "link", "set", leg, "master", other.bridge, "up"], check=True)
            address = f"{other.subnet}.{200 + index}/24"
            self._in_node(host, f"""
                ip addr add {address} dev {inside} && ip link set {inside} up
                iptables -t nat -A POSTROUTING -s {POD_SUBNET}.0.0/16 -o {inside} -j MASQUERADE
                """)
        self.reached.add(other.bridge)

    def _wait_nodes(self, deadline: float) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.kube._client)

        def ready() -> bool:
            nodes = {n.metadata.name: n for n in core.list_node().items}
            for index, name in enumerate(self.node_names):
                node = nodes.get(name)
                if node is None or not any(c.type == "Ready" and c.status == "True"
                                           for c in node.status.conditions or []):
                    return False
                if index > 0 and self.gpus and (node.status.allocatable or {}).get(GPU_RESOURCE) != str(self.gpus):
                    return False
            return True

        self._wait(f"{self.count} real nodes Ready", deadline, ready)
