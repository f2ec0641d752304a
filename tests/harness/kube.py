"""A real Kubernetes control plane for integration tests, built from Go modules and run on loopback.

What: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, the kwok controller (fake nodes whose
pods go Running and then Succeeded or Failed) and the JobSet controller manager (with its admission
webhooks), all started as plain processes on 127.0.0.1 with free ports, state in one directory.

Why: the Kubernetes adapter must be tested against the real API server, scheduler, Job controller and
JobSet controller, not a fake; there are no kubelets or containers, kwok plays the nodes.

Where the binaries come from: the wrapper Go modules in ``tests/harness/kube_build`` (k8s.io/kubernetes
with its staging modules replaced by their tags; etcd, kwok and JobSet each in their own module, so each
builds with the dependency versions its upstream pins). :func:`ensure_built` builds each component once
with the machine's Go into ``~/.cache/hpcbridge/<component>-<version>/bin/`` (``HPCBRIDGE_CACHE_DIR``
overrides the root), never inside the repo. Stage YAMLs (kwok), the JobSet CRD and webhook manifests are
read at run time from the Go module cache, not copied into the repo.

Pod lifecycle on the kwok nodes (stages loaded from the kwok module, see :meth:`KubeCluster._kwok_stages`):

* scheduled pod -> ``Running`` (``pod-ready``, no delay);
* Running pod owned by a Job -> ``Succeeded`` (exit code 0) after ``pod_run_ms`` (``pod-complete``; per
  pod the annotation ``pod-complete.stage.kwok.x-k8s.io/delay``, a Go duration such as ``"5s"`` or an
  RFC 3339 time, overrides it); pods without a Job owner stay Running until deleted;
* **the Failed knob**: a Running pod labelled ``pod-container-running-failed.stage.kwok.x-k8s.io: "true"``
  (:data:`FAIL_LABEL`; put it in a Job's pod template to fail the Job's pods) -> ``Failed`` with container
  exit code 1 after ``pod_run_ms`` (annotation ``pod-container-running-failed.stage.kwok.x-k8s.io/delay``
  overrides it); the annotations ``.../exit-code``, ``.../reason``, ``.../message`` and
  ``.../container-name`` set the terminated state. Labelled pods never Succeed (the complete stage excludes
  them), whether or not a Job owns them.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BUILD_ROOT = Path(__file__).resolve().parent / "kube_build"

#: Label that makes kwok drive a Running pod to Failed (kwok's own chaos stage; only its delay is changed).
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
#: Annotations read by the failure stage (values are strings).
FAIL_EXIT_CODE_ANNOTATION = f"{FAIL_LABEL}/exit-code"
FAIL_REASON_ANNOTATION = f"{FAIL_LABEL}/reason"
FAIL_DELAY_ANNOTATION = f"{FAIL_LABEL}/delay"
#: Annotation that overrides the Running -> Succeeded delay of one pod (a Go duration such as "5s").
COMPLETE_DELAY_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
#: Annotation and value that mark the nodes kwok manages.
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
GPU_RESOURCE = "nvidia.com/gpu"


def cache_root() -> Path:
    """Root of the binary cache (outside the repo): ``$HPCBRIDGE_CACHE_DIR`` or ``~/.cache/hpcbridge``."""
    return Path(os.environ.get("HPCBRIDGE_CACHE_DIR") or Path.home() / ".cache" / "hpcbridge")


# --------------------------------------------------------------------------------------------- building


class KubeBuildError(RuntimeError):
    """A component could not be built; the message names the module, its version and go's last output."""


@dataclass(frozen=True)
class Component:
    """One thing ``go build`` makes from one wrapper module.

    ``module`` is the upstream module whose version (read from the wrapper's go.mod) names the cache
    directory; ``packages`` are built into ``binaries`` (same order).
    """

    name: str
    wrapper: Path
    module: str
    packages: tuple[str, ...]
    binaries: tuple[str, ...]
    ldflags: Callable[[str], list[str]] = field(default=lambda version: [])
    #: the wrapper holds the program's own source (no upstream version): cached by a hash of its files
    own_source: bool = False

    @property
    def version(self) -> str:
        """The pinned version of ``module``, as required by the wrapper's go.mod; for a program of our own
        ``src-`` and a hash of its go.mod, go.sum and .go files; a wrapper with its own main package (CoreDNS
        with a chosen plugin set) appends that hash to the upstream version, so a change rebuilds it."""
        digest = hashlib.sha256()
        for path in sorted(self.wrapper.iterdir()):
            if path.suffix in (".go", ".mod", ".sum"):
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
        if self.own_source:
            return "src-" + digest.hexdigest()[:12]
        own_main = any(path.suffix == ".go" for path in self.wrapper.iterdir())
        text = (self.wrapper / "go.mod").read_text(encoding="utf-8")
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(self.module)}\s+(v\S+)", text, re.MULTILINE)
        if not match:
            raise KubeBuildError(f"{self.wrapper / 'go.mod'} does not require {self.module}")
        return f"{match.group(1)}-{digest.hexdigest()[:8]}" if own_main else match.group(1)

    @property
    def cache_dir(self) -> Path:
        """``<cache root>/<component>-<version>``: bin/ holds the binaries, build.log the go output."""
        return cache_root() / f"{self.name}-{self.version}"

    def paths(self) -> dict[str, Path]:
        """Where the binaries are (or will be) once built."""
        return {binary: self.cache_dir / "bin" / binary for binary in self.binaries}

    def built(self) -> bool:
        """True when every binary of the component is already in the cache."""
        return all(path.is_file() and os.access(path, os.X_OK) for path in self.paths().values())


def _kubernetes_ldflags(version: str) -> list[str]:
    """Stamp the version k8s binaries report (``--version``, ``/version``); unstamped they say v0.0.0."""
    major, minor = version.lstrip("v").split(".")[:2]
    values = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
              "buildDate": "2026-01-01T00:00:00Z"}  # fixed, so that a relink stays cacheable
    return [f"-X {pkg}.{key}={value}" for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")
            for key, value in values.items()]


COMPONENTS: tuple[Component, ...] = (
    Component("etcd", BUILD_ROOT / "etcd", "go.etcd.io/etcd/server/v3", ("go.etcd.io/etcd/server/v3",), ("etcd",)),
    Component("kubernetes", BUILD_ROOT, "k8s.io/kubernetes",
              ("k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager",
               "k8s.io/kubernetes/cmd/kube-scheduler"),
              ("kube-apiserver", "kube-controller-manager", "kube-scheduler"), _kubernetes_ldflags),
    Component("kwok", BUILD_ROOT / "kwok", "sigs.k8s.io/kwok", ("sigs.k8s.io/kwok/cmd/kwok",), ("kwok",)),
    Component("jobset", BUILD_ROOT / "jobset", "sigs.k8s.io/jobset", ("sigs.k8s.io/jobset",), ("jobset",),
              lambda version: [f"-X sigs.k8s.io/jobset/pkg/version.GitVersion={version}"]),
    # the upstream Kubeflow Trainer controller: the oracle for the JobSets hpc-bridge renders (started on demand)
    Component("trainer", BUILD_ROOT / "trainer", "github.com/kubeflow/trainer/v2",
              ("github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",), ("trainer-controller-manager",)),
)

#: Kueue's controller manager (v0.17, its own module: it pins client-go v0.35), built and started only for the
#: tests that queue jobs (tests/harness/kueue.py)
KUEUE = Component("kueue", BUILD_ROOT / "kueue", "sigs.k8s.io/kueue", ("sigs.k8s.io/kueue/cmd/kueue",), ("kueue",),
                  lambda version: [f"-X sigs.k8s.io/kueue/pkg/version.GitVersion={version}"])

#: kustomize, built when a test of manifests/ asks for it: `kustomize build` is what `kubectl apply -k` applies
KUSTOMIZE = Component("kustomize", BUILD_ROOT / "kustomize", "sigs.k8s.io/kustomize/kustomize/v5",
                      ("sigs.k8s.io/kustomize/kustomize/v5",), ("kustomize",))

#: what real nodes add (tests/harness/kubelet.py): kubelet at the control plane's version, CoreDNS with the
#: plugins cluster DNS needs, the pod sandbox program and a device plugin with fake GPUs
NODE_COMPONENTS: tuple[Component, ...] = (
    Component("kubelet", BUILD_ROOT, "k8s.io/kubernetes", ("k8s.io/kubernetes/cmd/kubelet",), ("kubelet",),
              _kubernetes_ldflags),
    # Services on the nodes: the `kubernetes` Service is how a pod's in-cluster configuration reaches the API server
    Component("kube-proxy", BUILD_ROOT, "k8s.io/kubernetes", ("k8s.io/kubernetes/cmd/kube-proxy",), ("kube-proxy",),
              _kubernetes_ldflags),
    Component("coredns", BUILD_ROOT / "coredns", "github.com/coredns/coredns", ("hpcbridge.test/kube-build/coredns",),
              ("coredns",)),
    Component("pause", BUILD_ROOT / "pause", "hpcbridge.test/kube-build/pause", ("hpcbridge.test/kube-build/pause",),
              ("pause",), own_source=True),
    Component("fakegpu", BUILD_ROOT / "fakegpu", "hpcbridge.test/kube-build/fakegpu",
              ("hpcbridge.test/kube-build/fakegpu",), ("fakegpu",), own_source=True),
)


def go_env() -> dict[str, str]:
    """Environment for every go command: the local toolchain only, static binaries, reproducible paths."""
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-trimpath -buildvcs=false")
    return env


def _go() -> str:
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.path.exists(p)),
                                    None)
    if not go:
        raise KubeBuildError("no `go` on PATH: the Kubernetes test control plane is built from Go modules")
    return go


def build_command(component: Component, out_dir: Path) -> list[str]:
    """The exact ``go build`` command for a component, writing into ``out_dir``."""
    ldflags = " ".join(["-s", "-w", *component.ldflags(component.version)])
    cmd = [_go(), "build", "-p", "2", "-ldflags", ldflags]
    if len(component.packages) == 1:  # -o <file>: etcd's package path ends in /v3
        return [*cmd, "-o", str(out_dir / component.binaries[0]), component.packages[0]]
    return [*cmd, "-o", str(out_dir) + "/", *component.packages]


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """One build at a time on this machine (two test runs must not both compile k8s on 2 cores)."""
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / "kube-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(component: Component) -> None:
    """Build one component into its cache dir (bin.tmp, then renamed, so a half build is never used)."""
    version = component.version
    cache = component.cache_dir
    tmp = cache / "bin.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = build_command(component, tmp)
    stats = cache / "build.time"
    if os.path.exists("/usr/bin/time"):  # peak RSS and elapsed time, appended to build.log afterwards
        cmd = ["/usr/bin/time", "-v", "-o", str(stats), *cmd]
    log_path = cache / "build.log"
    started = time.monotonic()
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n=== {dt.datetime.now(dt.UTC).isoformat()} building {component.module}@{version}\n"
                  f"cwd: {component.wrapper}\ncmd: {' '.join(cmd)}\n")
        log.flush()
        offset = log.tell()
        proc = subprocess.run(cmd, cwd=component.wrapper, env=go_env(), stdout=log, stderr=subprocess.STDOUT)
    with open(log_path, encoding="utf-8", errors="replace") as log:
        log.seek(offset)
        go_output = log.read().splitlines()
    with open(log_path, "a", encoding="utf-8") as log:
        if stats.exists():
            log.write(stats.read_text(encoding="utf-8", errors="replace"))
            stats.unlink()
        log.write(f"=== exit {proc.returncode} after {time.monotonic() - started:.0f}s\n")
    if proc.returncode != 0:
        tail = "\n".join(go_output[-30:]) or "(no output)"
        raise KubeBuildError(f"building {component.module}@{version} ({', '.join(component.binaries)}) failed "
                             f"with exit {proc.returncode}; full log {log_path}; last lines of go's output:\n{tail}")
    shutil.rmtree(cache / "bin", ignore_errors=True)
    tmp.rename(cache / "bin")


def ensure_built(components: tuple[Component, ...] = COMPONENTS) -> dict[str, Path]:
    """Build every missing binary (sequentially, under a machine-wide lock) and return name -> path.

    A component whose binaries are all in its cache dir is skipped, so only the first run on a machine
    pays for the builds (tens of minutes for k8s on 2 cores; see build.log in each cache dir).
    """
    paths: dict[str, Path] = {}
    missing = [c for c in components if not c.built()]
    if missing:
        with _build_lock():
            for component in missing:
                if not component.built():  # another run may have built it while we waited for the lock
                    _build(component)
    for component in components:
        paths.update(component.paths())
    return paths


def module_dir(component: Component) -> Path:
    """The module cache directory of the component's upstream module (downloaded and go.sum-verified)."""
    proc = subprocess.run([_go(), "mod", "download", "-json", f"{component.module}@{component.version}"],
                          cwd=component.wrapper, env=go_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        raise KubeBuildError(f"go mod download {component.module}@{component.version} failed: "
                             f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return Path(json.loads(proc.stdout)["Dir"])


def component(name: str) -> Component:
    """The :data:`COMPONENTS` (or :data:`NODE_COMPONENTS`) entry called ``name``."""
    return next(c for c in (*COMPONENTS, *NODE_COMPONENTS) if c.name == name)


# ------------------------------------------------------------------------------------------------- PKI


def _write_pki(directory: Path, extra_ips: tuple[str, ...] = ()) -> dict[str, Path]:
    """A CA, a serving cert (127.0.0.1/localhost/kubernetes.default...), an admin client cert in
    ``system:masters`` and an RSA service-account key pair; PEM files in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=7)

    def key() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def write_key(path: Path, private: rsa.RSAPrivateKey) -> None:
        path.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        path.chmod(0o600)

    def name(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    ca_key = key()
    ca_name = name("hpcbridge-test-ca")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(later)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))

    def leaf(subject: x509.Name, usages: list[x509.ObjectIdentifier],
             sans: list[x509.GeneralName] | None) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
        private = key()
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
                   .public_key(private.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now).not_valid_after(later)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, key_cert_sign=False,
                                                crl_sign=False, content_commitment=False, data_encipherment=False,
                                                key_agreement=False, encipher_only=False, decipher_only=False),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), private

    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local"]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "::1", "10.96.0.1", *extra_ips)]
    serving, serving_key = leaf(name("kube-apiserver"), [ExtendedKeyUsageOID.SERVER_AUTH,
                                                          ExtendedKeyUsageOID.CLIENT_AUTH], sans)
    admin, admin_key = leaf(name("hpcbridge-admin", "system:masters"), [ExtendedKeyUsageOID.CLIENT_AUTH], None)
    # the aggregation-layer proxy identity; KCM and the scheduler read its CA from the apiserver's
    # extension-apiserver-authentication ConfigMap and log errors when it is missing
    proxy, proxy_key = leaf(name("front-proxy-client"), [ExtendedKeyUsageOID.CLIENT_AUTH], None)
    sa_key = key()

    files = {name_: directory / file for name_, file in (
        ("ca", "ca.crt"), ("ca_key", "ca.key"), ("serving", "serving.crt"), ("serving_key", "serving.key"),
        ("admin", "admin.crt"), ("admin_key", "admin.key"), ("proxy", "front-proxy-client.crt"),
        ("proxy_key", "front-proxy-client.key"), ("sa_key", "sa.key"), ("sa_pub", "sa.pub"))}
    pem = serialization.Encoding.PEM
    files["ca"].write_bytes(ca.public_bytes(pem))
    write_key(files["ca_key"], ca_key)
    files["serving"].write_bytes(serving.public_bytes(pem))
    write_key(files["serving_key"], serving_key)
    files["admin"].write_bytes(admin.public_bytes(pem))
    write_key(files["admin_key"], admin_key)
    files["proxy"].write_bytes(proxy.public_bytes(pem))
    write_key(files["proxy_key"], proxy_key)
    write_key(files["sa_key"], sa_key)
    files["sa_pub"].write_bytes(sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    return files


def sign_client_cert(pki: dict[str, Path], directory: Path, name: str, common_name: str,
                     organization: str | None = None) -> tuple[Path, Path]:
    """A client certificate from the cluster's CA (e.g. ``system:node:<node>`` in ``system:nodes`` for a
    kubelet, which the API server's Node authorizer then confines to its own node): (cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca = x509.load_pem_x509_certificate(pki["ca"].read_bytes())
    ca_key = serialization.load_pem_private_key(pki["ca_key"].read_bytes(), password=None)
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


# --------------------------------------------------------------------------------------------- cluster


class KubeClusterError(RuntimeError):
    """The control plane did not come up; the message names the component and ends with its log."""


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all held open together, so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _end(proc: subprocess.Popen) -> None:
    """A process we started, and its group: TERM, then KILL after 15 s."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class KubeCluster:
    """A real control plane on loopback: etcd, kube-apiserver, KCM, scheduler, kwok nodes, JobSet.

    Attributes after :meth:`start`:

    * ``kubeconfig``: admin kubeconfig (client cert in ``system:masters``), file paths inside ``base_dir``;
    * ``api_url``: ``https://127.0.0.1:<port>``; ``ca_file``, ``client_cert``, ``client_key``;
    * ``etcd_url``; ``ports`` (component -> port); ``node_names``; ``binaries`` (name -> path);
    * ``log_dir``: one ``<component>.log`` per process; ``startup_seconds``: how long :meth:`start` took.

    Use :meth:`api_client` for a ``kubernetes.client.ApiClient`` bound to this cluster (never the global
    default configuration).
    """

    def __init__(self, base_dir: Path, nodes: int = 4, node_cpu: str = "8", node_memory: str = "32Gi",
                 node_gpus: int = 4, node_pods: int = 110, pod_run_ms: int = 500,
                 address: str = "127.0.0.1") -> None:
        self.base_dir = Path(base_dir)
        #: where the API server listens and what it advertises (real kubelets in network namespaces reach it
        #: on their bridge's address; kwok-only clusters stay on loopback)
        self.address = address
        self.nodes, self.node_cpu, self.node_memory = nodes, node_cpu, node_memory
        self.node_gpus, self.node_pods, self.pod_run_ms = node_gpus, node_pods, pod_run_ms
        self.log_dir = self.base_dir / "logs"
        self.kubeconfig = self.base_dir / "admin.kubeconfig"
        self.pki: dict[str, Path] = {}
        self.ports: dict[str, int] = {}
        self.binaries: dict[str, Path] = {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.node_names = [f"kwok-node-{i}" for i in range(nodes)]
        self.startup_seconds = 0.0
        self._client: Any = None

    # ---- public surface

    @property
    def api_url(self) -> str:
        return f"https://{self.address}:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['etcd']}"

    @property
    def ca_file(self) -> Path:
        return self.pki["ca"]

    @property
    def client_cert(self) -> Path:
        return self.pki["admin"]

    @property
    def client_key(self) -> Path:
        return self.pki["admin_key"]

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` for this cluster's admin kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def start(self, timeout: float = 180.0) -> None:
        """Build what is missing, then start every component and wait until the cluster can run JobSets."""
        self.binaries = ensure_built()
        started = time.monotonic()
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        names = ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "jobset_webhook", "jobset_health")
        self.ports = dict(zip(names, _free_ports(len(names)), strict=True))
        try:
            self.pki = _write_pki(self.base_dir / "pki", (self.address,) if self.address != "127.0.0.1" else ())
            self._write_kubeconfig()
            deadline = time.monotonic() + timeout
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self._client = self.api_client()
            self._start_kcm_and_scheduler(deadline)
            if self.nodes:
                self._start_kwok(deadline)
            self._start_jobset(deadline)
            self._wait("default ServiceAccount (KCM)", deadline, self._default_sa_exists)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Stop every process this cluster started, by PID, in reverse start order (TERM, then KILL)."""
        for name, proc in reversed(list(self.procs.items())):
            _end(proc)
            del self.procs[name]
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # ---- processes and waiting

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        full_env = {**os.environ, **(env or {})}
        full_env["NO_PROXY"] = full_env["no_proxy"] = f"127.0.0.1,localhost,::1,{self.address}"
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=self.base_dir, env=full_env, start_new_session=True)

    def _wait(self, what: str, deadline: float, check: Callable[[], bool], interval: float = 0.2) -> None:
        """Poll ``check`` until true; fail early, with its log, when a process we started has exited."""
        last_error: BaseException | None = None
        while True:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise KubeClusterError(f"{name} exited with {proc.returncode} while waiting for {what}; "
                                           f"log {self.log_dir / (name + '.log')}:\n{_tail(self.log_dir / (name + '.log'))}")
            try:
                if check():
                    return
            except Exception as exc:  # not up yet
                last_error = exc
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {n}.log\n{_tail(self.log_dir / (n + '.log'), 15)}" for n in self.procs)
                raise KubeClusterError(f"timed out waiting for {what} (last error: {last_error!r})\n{logs}")
            time.sleep(interval)

    def _https_ok(self, port: int, path: str) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                             urllib.request.HTTPSHandler(context=context))
        try:
            host = self.address if port == self.ports.get("apiserver") else "127.0.0.1"
            with opener.open(f"https://{host}:{port}{path}", timeout=5) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    @staticmethod
    def _http_ok(url: str) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=5) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False

    # ---- components

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "hpcbridge-test",
            "clusters": [{"name": "hpcbridge-test", "cluster": {
                "server": self.api_url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self.client_cert), "client-key": str(self.client_key)}}],
            "contexts": [{"name": "hpcbridge-test", "context": {"cluster": "hpcbridge-test", "user": "admin"}}],
        }), encoding="utf-8")
        self.kubeconfig.chmod(0o600)

    def _start_etcd(self, deadline: float) -> None:
        client, peer = self.etcd_url, f"http://127.0.0.1:{self.ports['etcd_peer']}"
        self._spawn("etcd", [str(self.binaries["etcd"]), "--name=n0", f"--data-dir={self.base_dir / 'etcd'}",
                             f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
                             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                             f"--initial-cluster=n0={peer}", "--unsafe-no-fsync=true", "--log-level=warn",
                             "--quota-backend-bytes=4294967296", "--auto-compaction-retention=1"])
        self._wait("etcd /health", deadline, lambda: self._http_ok(f"{client}/health"))

    def _start_apiserver(self, deadline: float) -> None:
        p = self.pki
        self._spawn("kube-apiserver", [
            str(self.binaries["kube-apiserver"]), f"--etcd-servers={self.etcd_url}", "--etcd-prefix=/registry",
            f"--bind-address={self.address}", f"--advertise-address={self.address}",
            f"--secure-port={self.ports['apiserver']}",
            # logs and exec reach real kubelets by their node IP, with a client certificate they trust
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={p['admin']}", f"--kubelet-client-key={p['admin_key']}",
            f"--cert-dir={self.base_dir / 'apiserver'}",
            f"--tls-cert-file={p['serving']}", f"--tls-private-key-file={p['serving_key']}",
            f"--client-ca-file={p['ca']}", "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p['sa_pub']}", f"--service-account-signing-key-file={p['sa_key']}",
            f"--requestheader-client-ca-file={p['ca']}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p['proxy']}", f"--proxy-client-key-file={p['proxy_key']}",
            # the `kubernetes` Service's endpoint is the advertised address, which must not be loopback: a
            # loopback-only cluster has none (no pod reaches it anyway), one on a bridge has it (kube-proxy)
            f"--endpoint-reconciler-type={'none' if self.address == '127.0.0.1' else 'lease'}",
            "--profiling=false", "--v=1"])
        self._wait("kube-apiserver /readyz", deadline, lambda: self._https_ok(self.ports["apiserver"], "/readyz"))

    def _start_kcm_and_scheduler(self, deadline: float) -> None:
        kc, p = str(self.kubeconfig), self.pki
        common = [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                  "--leader-elect=false", "--bind-address=127.0.0.1",
                  f"--tls-cert-file={p['serving']}", f"--tls-private-key-file={p['serving_key']}",
                  "--authorization-always-allow-paths=/healthz,/readyz,/livez", "--v=1"]
        self._spawn("kube-controller-manager", [
            str(self.binaries["kube-controller-manager"]), *common, f"--secure-port={self.ports['kcm']}",
            f"--service-account-private-key-file={p['sa_key']}", f"--root-ca-file={p['ca']}",
            "--controllers=*", "--use-service-account-credentials=false"])
        self._spawn("kube-scheduler", [str(self.binaries["kube-scheduler"]), *common,
                                       f"--secure-port={self.ports['scheduler']}"])
        self._wait("kube-controller-manager /healthz", deadline, lambda: self._https_ok(self.ports["kcm"], "/healthz"))
        self._wait("kube-scheduler /readyz", deadline, lambda: self._https_ok(self.ports["scheduler"], "/readyz"))

    def _kwok_stages(self) -> list[dict[str, Any]]:
        """kwok's own stage files, read from its module dir; only delays and one selector are adjusted.

        node-initialize + node-heartbeat-with-lease keep the nodes Ready; pod-ready (fast) makes a bound
        pod Running; pod-complete (general) takes a Job's Running pod to Succeeded after ``pod_run_ms``
        unless the pod carries :data:`FAIL_LABEL`; pod-container-running-failed (chaos) takes a labelled
        Running pod to Failed after ``pod_run_ms``; pod-delete (fast) finishes deletions.
        """
        root = module_dir(component("kwok")) / "kustomize" / "stage"
        files = ["node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
                 "pod/fast/pod-ready.yaml", "pod/general/pod-complete.yaml",
                 "pod/chaos/pod-container-running-failed.yaml", "pod/fast/pod-delete.yaml"]
        stages = []
        for rel in files:
            doc = copy.deepcopy(yaml.safe_load((root / rel).read_text(encoding="utf-8")))
            spec = doc["spec"]
            if doc["metadata"]["name"] in ("pod-complete", "pod-container-running-failed"):
                # fixed delay, no jitter: kwok uses the jitter value *instead* when it is <= the delay,
                # which would make the per-pod delay annotation useless without a matching jitter one
                spec["delay"]["durationMilliseconds"] = self.pod_run_ms
                spec["delay"].pop("jitterDurationMilliseconds", None)
                spec["delay"].pop("jitterDurationFrom", None)
            if doc["metadata"]["name"] == "pod-complete":
                spec["selector"]["matchExpressions"].append(
                    {"key": f'.metadata.labels["{FAIL_LABEL}"]', "operator": "DoesNotExist"})
            stages.append(doc)
        return stages

    def _start_kwok(self, deadline: float) -> None:
        config = self.base_dir / "kwok.yaml"
        config.write_text(yaml.safe_dump_all(self._kwok_stages()), encoding="utf-8")
        key, value = KWOK_NODE_ANNOTATION
        self._spawn("kwok", [str(self.binaries["kwok"]), f"--kubeconfig={self.kubeconfig}", f"--config={config}",
                             "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={key}={value}",
                             "--cidr=10.244.0.0/16", "--node-ip=10.0.0.1", "--node-lease-duration-seconds=40"])
        from kubernetes import client

        core = client.CoreV1Api(self._client)
        resources = {"cpu": self.node_cpu, "memory": self.node_memory, "pods": str(self.node_pods),
                     GPU_RESOURCE: str(self.node_gpus)}
        for i, node in enumerate(self.node_names):
            core.create_node({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "annotations": {key: value},
                             "labels": {"kubernetes.io/hostname": node, "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64", "type": "kwok"}},
                "spec": {"podCIDR": f"10.244.{i}.0/24", "podCIDRs": [f"10.244.{i}.0/24"]},
                # kept on create; kwok's node-initialize keeps these and fills nodeInfo and the conditions
                "status": {"capacity": resources, "allocatable": resources}})

        def ready() -> bool:
            nodes = core.list_node(label_selector="type=kwok").items
            ok = [n for n in nodes if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                  and (n.status.allocatable or {}).get(GPU_RESOURCE) == str(self.node_gpus)
                  and not any(t.key.startswith("node.kubernetes.io/") for t in n.spec.taints or [])]
            return len(ok) == self.nodes

        self._wait(f"{self.nodes} kwok nodes Ready and untainted", deadline, ready)

    def _start_jobset(self, deadline: float) -> None:
        from kubernetes import client

        jobset = component("jobset")
        src = module_dir(jobset) / "config" / "components"
        crd = yaml.safe_load((src / "crd" / "bases" / "jobset.x-k8s.io_jobsets.yaml").read_text(encoding="utf-8"))
        ext = client.ApiextensionsV1Api(self._client)
        ext.create_custom_resource_definition(crd)

        def established() -> bool:
            got = ext.read_custom_resource_definition(crd["metadata"]["name"])
            return any(c.type == "Established" and c.status == "True" for c in got.status.conditions or [])

        self._wait("JobSet CRD Established", deadline, established)

        certs = self.base_dir / "jobset-certs"
        certs.mkdir(exist_ok=True)
        shutil.copyfile(self.pki["serving"], certs / "tls.crt")
        shutil.copyfile(self.pki["serving_key"], certs / "tls.key")
        config = self.base_dir / "jobset-config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
            "leaderElection": {"leaderElect": False}, "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.ports["jobset_webhook"], "certDir": str(certs)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['jobset_health']}"},
        }), encoding="utf-8")
        self._spawn("jobset", [str(self.binaries["jobset"]), f"--config={config}", "--metrics-bind-address=0",
                               f"--health-probe-bind-address=127.0.0.1:{self.ports['jobset_health']}",
                               "--leader-elect=false", "--zap-log-level=info"],
                    env={"KUBECONFIG": str(self.kubeconfig)})
        self._wait("jobset /readyz", deadline,
                   lambda: self._http_ok(f"http://127.0.0.1:{self.ports['jobset_health']}/readyz"))

        admission = client.AdmissionregistrationV1Api(self._client)
        for doc in self._jobset_webhook_configs(src):
            if doc["kind"] == "MutatingWebhookConfiguration":
                admission.create_mutating_webhook_configuration(doc)
            else:
                admission.create_validating_webhook_configuration(doc)

        custom = client.CustomObjectsApi(self._client)
        probe = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "webhook-probe"},
                 "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {
                     "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}]}}

        def admitted() -> bool:  # a server-side dry run goes through both JobSet webhooks
            got = custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets",
                                                         probe, dry_run="All")
            return bool(got.get("spec", {}).get("successPolicy"))  # set by the mutating webhook

        self._wait("JobSet webhooks admitting a JobSet", deadline, admitted, interval=0.5)

    def start_trainer(self, timeout: float = 120.0) -> Path:
        """Kubeflow Trainer's controller manager (v2.3, built from its Go module) on this cluster: its CRDs,
        the controller as a plain process on loopback, and its webhooks registered by URL with this cluster's
        serving certificate. Returns the Trainer module's directory (its shipped runtimes live there)."""

        trainer = next(c for c in COMPONENTS if c.name == "trainer")
        src = module_dir(trainer)
        deadline = time.monotonic() + timeout
        self._create_crds(sorted((src / "manifests" / "base" / "crds").glob("trainer.kubeflow.org_*.yaml")), deadline)
        webhook_port, health_port = _free_ports(2)
        tmpdir = self.base_dir / "trainer-tmp"
        # Trainer's Configuration has no certDir: controller-runtime reads $TMPDIR/k8s-webhook-server/serving-certs
        certs = tmpdir / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.pki["serving"], certs / "tls.crt")
        shutil.copyfile(self.pki["serving_key"], certs / "tls.key")
        config = self.base_dir / "trainer-config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1", "kind": "Configuration",
            "webhook": {"host": "127.0.0.1", "port": webhook_port}, "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
            "leaderElection": {"leaderElect": False}, "certManagement": {"enable": False},
        }), encoding="utf-8")
        binary = trainer.paths()["trainer-controller-manager"]
        self._spawn("trainer", [str(binary), f"--config={config}", f"--kubeconfig={self.kubeconfig}",
                                "--zap-log-level=2"], env={"TMPDIR": str(tmpdir)})
        self._wait("trainer /readyz", deadline, lambda: self._http_ok(f"http://127.0.0.1:{health_port}/readyz"))
        hooks = src / "manifests" / "base" / "webhook"
        patches = {"MutatingWebhookConfiguration": yaml.safe_load((hooks / "patch_mutating.yaml").read_text()),
                   "ValidatingWebhookConfiguration": yaml.safe_load((hooks / "patch_validating.yaml").read_text())}
        for doc in (d for d in yaml.safe_load_all((hooks / "manifests.yaml").read_text(encoding="utf-8")) if d):
            # what Trainer's kustomize patches do: the configurations' names and the runtime webhooks' selector
            for op in patches[doc["kind"]]:
                parts = op["path"].strip("/").split("/")
                if parts == ["metadata", "name"]:
                    doc["metadata"]["name"] = op["value"]
                elif parts[0] == "webhooks" and parts[2] == "objectSelector":
                    doc["webhooks"][int(parts[1])]["objectSelector"] = op["value"]
            self._register_webhooks(doc, webhook_port)
        return src

    def _create_crds(self, paths: list[Path], deadline: float, existing_ok: bool = False) -> None:
        """Create the CRDs in *paths* and wait until each is Established (served)."""
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self._client)
        names = []
        for path in paths:
            crd = yaml.safe_load(path.read_text(encoding="utf-8"))
            try:
                ext.create_custom_resource_definition(crd)
            except client.exceptions.ApiException as exc:
                if not (existing_ok and exc.status == 409):
                    raise
            names.append(crd["metadata"]["name"])
        for name in names:
            self._wait(f"CRD {name} Established", deadline, lambda n=name: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(n).status.conditions or []))

    def _register_webhooks(self, doc: dict[str, Any], port: int) -> None:
        """A webhook configuration from a controller's manifests, served on loopback: each webhook's in-cluster
        Service becomes a URL on *port* with this cluster's CA."""
        import base64

        from kubernetes import client

        ca_bundle = base64.b64encode(self.ca_file.read_bytes()).decode()
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
        admission = client.AdmissionregistrationV1Api(self._client)
        if doc["kind"] == "MutatingWebhookConfiguration":
            admission.create_mutating_webhook_configuration(doc)
        else:
            admission.create_validating_webhook_configuration(doc)

    #: Kueue's webhooks the tests need (its queues, and the two integrations it runs with); the others serve
    #: kinds this cluster has no controller for and stay unregistered (a registered webhook with failurePolicy
    #: Fail would refuse their objects whenever Kueue is down)
    KUEUE_WEBHOOKS = ("clusterqueue", "resourceflavor", "cohort", "workload", "trainjob", "jobset")
    KUEUE_NAMESPACE = "kueue-system"
    #: where Kueue v0.17 reads its metrics certificate, hard-coded (it exits without one, even with metrics off)
    KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")

    def start_kueue(self, timeout: float = 180.0) -> Path:
        """Kueue's controller manager (v0.17, built from its Go module) on this cluster, as the cluster's own
        would run but out of cluster: its CRDs (server-side), the TrainJob and JobSet integrations, its webhooks
        registered by URL on loopback with this cluster's serving certificate, internal cert management off.
        Needs the TrainJob and JobSet CRDs already served. Returns Kueue's module directory."""
        from kubernetes import client

        binary = ensure_built((KUEUE,))["kueue"]
        src = module_dir(KUEUE)
        deadline = time.monotonic() + timeout
        # the Workload CRD is 1.4 MB: created, never client-side applied (its annotation would not fit)
        self._create_crds(sorted((src / "config" / "components" / "crd" / "bases").glob("*.yaml")), deadline,
                          existing_ok=True)
        core = client.CoreV1Api(self._client)
        with contextlib.suppress(client.exceptions.ApiException):
            core.create_namespace({"metadata": {"name": self.KUEUE_NAMESPACE}})
        certs = self.base_dir / "kueue-certs"
        certs.mkdir(exist_ok=True)
        self.KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        for directory in (certs, self.KUEUE_METRICS_CERTS):
            shutil.copyfile(self.pki["serving"], directory / "tls.crt")
            shutil.copyfile(self.pki["serving_key"], directory / "tls.key")
        webhook_port, health_port = _free_ports(2)
        config = self.base_dir / "kueue-config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
            "namespace": self.KUEUE_NAMESPACE, "leaderElection": {"leaderElect": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}, "metrics": {"bindAddress": "0"},
            "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
            "internalCertManagement": {"enable": False},
            # Kueue's own API rate (default 50/s, burst 100) as clusters with many jobs set it: each admission is
            # several writes, and a conflicting one is retried with backoff
            "clientConnection": {"qps": 500, "burst": 1000},
            # VisibilityOnDemand wants certificates of its own; TopologyAwareScheduling dry-runs a Workload on
            # every TrainJob update, so a deleted runtime would block even a finalizer's removal
            "featureGates": {"VisibilityOnDemand": False, "TopologyAwareScheduling": False},
            "integrations": {"frameworks": ["trainer.kubeflow.org/trainjob", "jobset.x-k8s.io/jobset"]},
        }), encoding="utf-8")
        self._spawn("kueue", [str(binary), f"--config={config}", f"--kubeconfig={self.kubeconfig}",
                              "--zap-log-level=2"])
        self._wait("kueue /readyz", deadline, lambda: self._http_ok(f"http://127.0.0.1:{health_port}/readyz"))
        manifests = src / "config" / "components" / "webhook" / "manifests.yaml"
        for doc in (d for d in yaml.safe_load_all(manifests.read_text(encoding="utf-8")) if d):
            doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
            doc["webhooks"] = [hook for hook in doc["webhooks"]
                               if hook["name"][1:].split(".")[0] in self.KUEUE_WEBHOOKS]
            self._register_webhooks(doc, webhook_port)
        flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
        custom = client.CustomObjectsApi(self._client)
        self._wait("Kueue webhooks admitting a ResourceFlavor", deadline, lambda: bool(
            custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "resourceflavors", flavor,
                                                dry_run="All")), interval=0.5)
        return src

    def stop_kueue(self) -> None:
        """Kueue's webhooks first (they refuse TrainJobs and JobSets while nobody answers), then the process."""
        from kubernetes import client

        admission = client.AdmissionregistrationV1Api(self._client)
        for delete in (admission.delete_mutating_webhook_configuration,
                       admission.delete_validating_webhook_configuration):
            for name in ("kueue-mutating-webhook-configuration", "kueue-validating-webhook-configuration"):
                with contextlib.suppress(client.exceptions.ApiException):
                    delete(name)
        proc = self.procs.pop("kueue", None)
        if proc is not None:
            _end(proc)

    def _jobset_webhook_configs(self, src: Path) -> list[dict[str, Any]]:
        """JobSet's webhook manifests with a URL clientConfig (+ our CA) instead of an in-cluster Service,
        and the pod webhooks limited to JobSet pods (the objectSelector its kustomize patches add)."""
        import base64

        ca_bundle = base64.b64encode(self.ca_file.read_bytes()).decode()
        pod_selector = {}
        for patch_file in (src / "webhook" / "patches").glob("*.yaml"):
            for op in yaml.safe_load(patch_file.read_text(encoding="utf-8")) or []:
                if op.get("value", {}).get("objectSelector"):
                    pod_selector[op["value"]["name"]] = op["value"]["objectSelector"]
        docs = [d for d in yaml.safe_load_all((src / "webhook" / "manifests.yaml").read_text(encoding="utf-8")) if d]
        for doc in docs:
            doc["metadata"]["name"] = f"jobset-{doc['metadata']['name']}"
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.ports['jobset_webhook']}{path}",
                                        "caBundle": ca_bundle}
                if hook["name"] in pod_selector:
                    hook["objectSelector"] = pod_selector[hook["name"]]
                elif any("pods" in rule.get("resources", []) for rule in hook.get("rules", [])):
                    raise KubeClusterError(f"no objectSelector found for JobSet pod webhook {hook['name']}")
        return docs

    def _default_sa_exists(self) -> bool:
        from kubernetes import client

        client.CoreV1Api(self._client).read_namespaced_service_account("default", "default")
        return True
