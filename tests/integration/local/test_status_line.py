"""On a terminal, ``hpcbridge submit`` on the local cluster shows a status line from the start: while the job's
stage step downloads its model (from a Hub-like server whose files come late), the line says what it stages, how
many bytes it has and at what rate; then the job runs, and the line never reaches a pipe."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import builders
from tests.harness.hf_hub import HubServer

pytestmark = [pytest.mark.integration, pytest.mark.local]

ROOT = Path(__file__).resolve().parents[3]
#: seconds the Hub holds each file back: several of the stage step's progress reports and the line's redraws
#: happen meanwhile
DELAY = 5.0
RUNTIME = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": "staged"}, "spec": {"mlPolicy": {"numNodes": 1}}}


@pytest.fixture(scope="module")
def hub() -> Iterator[HubServer]:
    pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (scripts/setup.sh --all)")
    server = HubServer().start()
    server.add("model", "tiny-org/late-model", {"config.json": b"{}", "model.safetensors": b"x" * 65536},
               delay=DELAY)
    yield server
    server.stop()


def _job(tmp_path: Path, hub: HubServer) -> Path:
    doc = builders.trainjob_doc(
        "late", runtime="staged", uid=str(uuid.uuid4()), annotations={"hpcbridge.io/workdir": str(tmp_path)},
        initializer={"model": {"storageUri": "hf://tiny-org/late-model",
                               "env": [{"name": "HF_ENDPOINT", "value": hub.endpoint}]}},
        trainer={"numNodes": 1, "command": ["sh", "-c", "echo trained"]})
    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump_all([RUNTIME, doc]))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def test_the_line_shows_staging_progress_on_a_terminal_only(hub: HubServer, tmp_path: Path) -> None:
    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "bridge", "submit", str(_job(tmp_path, hub))], stdout=child,
                            stderr=child, env=_env(tmp_path), cwd=ROOT)
    os.close(child)
    shown = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed its end
            break
        if not data:
            break
        shown += data
    assert proc.wait(timeout=120) == 0, shown
    os.close(main)
    text = shown.decode()
    assert "default/late Pending " in text and "  staging model hf://tiny-org/late-model " in text, text
    assert "default/late Running " in text and "trained\r\n" in text, text

    piped = subprocess.run([sys.executable, "-m", "bridge", "submit", str(_job(tmp_path, hub))],
                           capture_output=True, text=True, env=_env(tmp_path), cwd=ROOT, timeout=120)
    assert piped.returncode == 0, piped.stderr
    assert "staging model" not in piped.stderr and "\x1b[K" not in piped.stderr + piped.stdout
