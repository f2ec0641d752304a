"""On a terminal, ``hpcbridge submit --wait`` to Slurm over SSH shows the job's staging progress on its status
line although this machine does not see the cluster's stagingDir: the stage step's phase file is read by the
job's own poll, through the SSH transport, on the login host.

The stagingDir is under ``/var/tmp``, which each emulated host mounts from a folder of its own (node-local
scratch): this machine's ``/var/tmp`` holds no such folder, so nothing here but the transport can show it. The
job runs on node-0, the login host the transport reaches."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests import builders
from tests.harness.hf_hub import HubServer

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[3]
#: seconds the Hub holds each file back: several polls and redraws happen meanwhile
DELAY = 4.0
RUNTIME = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": "staged"}, "spec": {"mlPolicy": {"numNodes": 1}}}


def _read_all(fd: int) -> bytes:
    shown = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # the child closed its end
            return shown
        if not data:
            return shown
        shown += data


@pytest.mark.parametrize("engine", ["slurm-ssh"], indirect=True)
def test_the_line_shows_a_remote_jobs_staging_progress(engine, netns_hosts, tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (scripts/setup.sh --all)")
    from bridge.api.loader import to_yaml

    hosts = engine.cluster
    hub = HubServer(host=netns_hosts.gateway).start()  # where the emulated hosts reach this machine
    try:
        hub.add("model", "tiny-org/late-model", {"config.json": b"{}", "model.safetensors": b"x" * 65536},
                delay=DELAY)
        staging = f"/var/tmp/hpcbridge-staging-{uuid.uuid4().hex[:8]}"
        assert not Path(staging).exists()
        spec = hosts.spec.model_copy(update={"staging_dir": staging})
        config = tmp_path / "clusters.yaml"
        config.write_text(to_yaml([hosts.model_copy(update={"spec": spec})]))
        doc = builders.trainjob_doc(
            "late-remote", runtime="staged", uid=str(uuid.uuid4()),
            annotations={"hpcbridge.io/workdir": str(tmp_path), "hpcbridge.io/sbatch.nodelist": "node-0"},
            initializer={"model": {"storageUri": "hf://tiny-org/late-model",
                                   "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}]}},
            trainer={"numNodes": 1, "command": ["sh", "-c", "echo trained"]})
        job = tmp_path / "late.yaml"
        job.write_text(yaml.safe_dump_all([RUNTIME, doc]))
        main, child = pty.openpty()
        proc = subprocess.Popen([sys.executable, "-m", "bridge", "submit", str(job), "--cluster", hosts.name, "--wait"],
                                stdout=child, stderr=child, cwd=ROOT,
                                env={**os.environ, "HPCBRIDGE_CONFIG": str(config),
                                     "XDG_STATE_HOME": str(tmp_path / "state")})
        os.close(child)
        shown = _read_all(main)
        code = proc.wait(timeout=180)
        os.close(main)
    finally:
        hub.stop()
    text = shown.decode(errors="replace")
    assert code == 0, text
    # e.g. ``default/late-remote Running 4s  staging model hf://tiny-org/late-model 431 B 0 B/s``
    assert re.search(r"default/late-remote Running \S+  staging model hf://tiny-org/late-model [\d.]+ \w+ [\d.]+ \w+/s",
                     text), text
    assert not re.search(r"Succeeded \S+  staging", text), text  # a finished job stages nothing
    assert not Path(staging).exists()  # it was never this machine's
