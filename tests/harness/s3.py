"""A real S3 server for the staging tests: SeaweedFS's ``weed server -s3`` (master, volume, filer and S3
gateway in one process), built from its Go module (kube_build/seaweedfs) and cached like the Kubernetes
components. Its Prometheus metrics count the requests it served, so a test can tell a download from a cache hit.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.harness.kube import BUILD_ROOT, Component, ensure_built

SEAWEEDFS = Component("seaweedfs", BUILD_ROOT / "seaweedfs", "github.com/seaweedfs/seaweedfs",
                      ("github.com/seaweedfs/seaweedfs/weed",), ("weed",))

ACCESS_KEY = "hpcbridge-test-key"
SECRET_KEY = "hpcbridge-test-secret-7f3a9c"  # a test credential: the tests look for it in every artifact and log


def _free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _port_pairs(count: int, start: int = 20000, end: int = 30000) -> list[int]:
    """*count* ports p that are free with p + 10000 free too: every weed server also listens on its gRPC
    port, its HTTP port + 10000."""
    found: list[int] = []
    for port in range(start + (int(time.time() * 1000) % 997) * 7, end):
        if len(found) == count:
            return found
        if port not in found and all(_free(p) and _free(p, "0.0.0.0") for p in (port, port + 10000)):
            found.append(port)
    raise RuntimeError("no free port pairs for SeaweedFS")


class S3Server:
    def __init__(self, base_dir: Path, host: str = "127.0.0.1") -> None:
        """*host*: the address it serves on (pods reach this machine at the real-node cluster's gateway)."""
        self.base_dir, self.host = base_dir, host
        self.proc: subprocess.Popen | None = None
        self.master, self.volume, self.filer, self.s3, self.metrics = 0, 0, 0, 0, 0

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.s3}"

    def start(self, timeout: float = 120.0) -> S3Server:
        weed = ensure_built((SEAWEEDFS,))["weed"]
        data = self.base_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.base_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{"name": "tester", "credentials": [
            {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "List", "Write"]}]}))
        self.master, self.volume, self.filer, self.s3 = _port_pairs(4)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.metrics = probe.getsockname()[1]
        self.log = open(self.base_dir / "weed.log", "w")
        self.proc = subprocess.Popen(
            [str(weed), "server", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
             f"-master.port={self.master}", f"-volume.port={self.volume}", f"-filer.port={self.filer}",
             "-s3", f"-s3.port={self.s3}", f"-s3.config={config}", "-volume.max=16", f"-metricsPort={self.metrics}",
             "-master.volumeSizeLimitMB=1024"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        # ready when a write lands: the gateway answers before the volume server has registered
        deadline = time.monotonic() + timeout
        client = self.client()
        while True:
            try:
                client.create_bucket(Bucket="hpcbridge-ready")
                client.put_object(Bucket="hpcbridge-ready", Key="probe", Body=b"ok")
                return self
            except Exception as exc:  # noqa: BLE001 - any failure before the deadline means "not yet"
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = (self.base_dir / "weed.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"SeaweedFS did not come up ({exc}); its log ends:\n{tail}") from None
                time.sleep(0.3)

    def client(self):
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def requests(self, kind: str = "GET", bucket: str | None = None) -> int:
        """How many S3 requests of *kind* (GET, LIST, PUT, HEAD…) the server has answered, from its metrics."""
        text = urllib.request.urlopen(f"http://{self.host}:{self.metrics}/metrics", timeout=10).read().decode()
        total = 0
        for line in text.splitlines():
            if not line.startswith("SeaweedFS_s3_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if labels.get("type") == kind and (bucket is None or labels.get("bucket") == bucket):
                total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import os
            import signal

            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=3)  # its data is thrown away: no need to flush it
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for port in (self.master, self.volume, self.filer, self.s3):
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                sock.unlink(missing_ok=True)
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port + 10000}.sock"):
                sock.unlink(missing_ok=True)
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(self.base_dir / "data", ignore_errors=True)
