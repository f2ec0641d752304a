"""A tenant's job environment (issue 36, secrets): TrainJob env values reach the job and nothing else.

For a plan from a Kubernetes namespace (``plan.tenant`` set), no env value is in the batch script (slurmctld
keeps it; ``scontrol show job -dd`` prints it), on a command line (``ps``, sshd) or in sbatch's own environment:
sbatch reads the job's whole environment on fd 3 (``--export-file=3``), fed by a fixed reader from stdin.
The submitting side's environment (the operator's) never flows into the job. CLI plans keep sbatch's
semantics: the user's environment exported, the TrainJob's env in the script.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from bridge.adapters import transport as transport_module
from bridge.adapters.flux import FluxAdapter
from bridge.adapters.slurm import SlurmAdapter
from bridge.adapters.slurm.render import ENV_FD, TENANT_PATH, job_env
from bridge.adapters.slurm.rest import submission
from bridge.adapters.transport import JOB_ENV_READER, LocalTransport, SSHTransport, job_env_input
from bridge.api import load_documents
from bridge.api.cluster import BridgeCluster
from bridge.errors import InvalidSpec
from bridge.plan import resolve
from tests import builders
from tests.fakes import FakeTransport, replying

SECRET = "s3cr3t-VALUE-7f1c"
#: a value that a shell, printf's %b or a line-based reader could mangle
AWKWARD = "it's $(not) `a command` \\n \\0 \\c * \"quoted\"\nsecond line\\"
PLANTED = "operator-PLANTED-9d2e"

PLAIN = load_documents("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: ClusterTrainingRuntime\n"
                       "metadata: {name: plain}\nspec: {mlPolicy: {numNodes: 1}}\n")[0]


def cluster(kind: str = "slurm", **connection) -> BridgeCluster:
    spec: dict = {"defaults": {"launchCommand": [sys.executable, "-m", "bridge", "launch"]}}
    if connection:
        spec[kind] = connection
    return builders.cluster(kind, "c", **spec)


def plan_for(target: BridgeCluster, env: dict[str, str], tenant: str | None = "team-a", workdir: str = "/w"):
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "envjob", "namespace": "team-a", "annotations": {"hpcbridge.io/workdir": workdir}},
           "spec": {"runtimeRef": {"name": "plain"},
                    "trainer": {"numNodes": 1, "command": ["sh", "-c", "env"],
                                "env": [{"name": k, "value": v} for k, v in env.items()]}}}
    plan = resolve(load_documents(yaml.safe_dump(doc))[0], PLAIN, target)
    return dataclasses.replace(plan, tenant=tenant)


def recording() -> FakeTransport:
    """A transport that answers sbatch with a job id and keeps every call."""
    return FakeTransport(replying(stdout="4242\n"))


# --- what render shows and submit sends ------------------------------------------------------------------


def test_a_tenant_script_and_command_carry_no_env_value() -> None:
    adapter = SlurmAdapter(cluster(slurmConf="/etc/slurm-test/slurm.conf"))
    plan = plan_for(adapter.cluster, {"TOKEN": SECRET, "NOTE": AWKWARD})
    artifact = adapter.render(plan)
    text = artifact.text()
    assert SECRET not in text and "second line" not in text
    assert "export TOKEN" not in artifact.main
    assert artifact.command == ("sbatch", "--parsable", "--export=ALL", f"--export-file={ENV_FD}")
    # the artifact names what fd 3 carries, in the order sent, and no value
    names = [line for line in artifact.files[1].content.splitlines() if not line.startswith("#")]
    assert names == ["PATH", "SLURM_CONF", "SLURM_JOB_NAME", "TOKEN", "NOTE"]


def test_submit_sends_the_values_apart_from_command_and_script() -> None:
    transport = recording()
    adapter = SlurmAdapter(cluster(slurmConf="/etc/slurm-test/slurm.conf"), transport=transport)
    plan = plan_for(adapter.cluster, {"TOKEN": SECRET, "NOTE": AWKWARD})
    artifact = adapter.render(plan)
    ref = adapter.submit(artifact)
    assert ref.job_id == "4242"
    (call,) = transport.calls
    assert call.argv == artifact.command  # exactly what render showed
    assert call.stdin == artifact.main and SECRET not in call.stdin
    assert not any(SECRET in arg for arg in call.argv)
    assert call.job_env == {"PATH": TENANT_PATH, "SLURM_CONF": "/etc/slurm-test/slurm.conf",
                               "SLURM_JOB_NAME": artifact.plan.name, "TOKEN": SECRET, "NOTE": AWKWARD}


def test_a_cli_plan_keeps_sbatch_semantics() -> None:
    transport = recording()
    adapter = SlurmAdapter(cluster(), transport=transport)
    plan = plan_for(adapter.cluster, {"TOKEN": "visible"}, tenant=None)
    artifact = adapter.render(plan)
    assert "export TOKEN=visible" in artifact.main and artifact.command == () and len(artifact.files) == 1
    adapter.submit(artifact)
    assert transport.calls[0].job_env is None and transport.calls[0].argv == ("sbatch", "--parsable")
    assert job_env(plan) is None


def test_a_tenant_batch_script_gets_the_same_environment() -> None:
    from bridge.plan import BatchScript

    transport = recording()
    adapter = SlurmAdapter(cluster(), transport=transport)
    plan = dataclasses.replace(plan_for(adapter.cluster, {"TOKEN": SECRET}),
                               batch_script=BatchScript("#!/bin/sh\nenv\n", "/w/job.sh", ("--nodes=1",), None, None,
                                                        None, ()))
    artifact = adapter.render(plan)
    assert f"--export-file={ENV_FD}" in artifact.command and SECRET not in artifact.text()
    adapter.submit(artifact)
    assert transport.calls[0].job_env["TOKEN"] == SECRET


def test_the_tenant_path_and_order_of_the_environment() -> None:
    target = cluster()
    plan = plan_for(target, {"A": "1"})
    # SLURM_JOB_NAME, as sbatch exports it (from a file it does not, and slurmd would open %x as "(null)")
    assert job_env(plan) == {"PATH": TENANT_PATH, "SLURM_JOB_NAME": plan.name, "A": "1"}
    # the TrainJob's own PATH wins over the default
    assert job_env(plan_for(target, {"PATH": "/opt/x/bin"}))["PATH"] == "/opt/x/bin"


@pytest.mark.parametrize(("env", "words"), [
    ({"DISPLAY": SECRET}, "drops DISPLAY"),
    ({"BIG": "x" * (256 * 1024)}, "under 256 KiB"),
    ({"N" * 256: SECRET}, "at most 255"),
])
def test_what_slurm_would_drop_is_refused_without_its_value(env, words) -> None:
    with pytest.raises(InvalidSpec, match=words) as caught:
        job_env(plan_for(cluster(), env))
    assert SECRET not in str(caught.value) and "xxxx" not in str(caught.value)


def test_over_slurmrestd_the_script_has_no_value_and_the_job_description_has_them() -> None:
    """slurmrestd takes the environment as a field of the job description (no command line); the script it
    stores is the one without values."""
    plan = plan_for(cluster(), {"TOKEN": SECRET})
    body = submission(plan, {"SLURM_CONF": "/c"})
    assert SECRET not in body["script"]
    assert body["job"]["environment"]["TOKEN"] == SECRET


# --- the transports: fd 3, never argv or the command's environment ---------------------------------------


class _Popen(subprocess.Popen):
    seen: list = []

    def __init__(self, args, *rest, **kwargs) -> None:
        _Popen.seen.append((list(args), dict(kwargs.get("env") or {})))
        super().__init__(args, *rest, **kwargs)


def test_local_transport_hands_the_environment_on_fd3_and_nothing_of_its_own(monkeypatch) -> None:
    monkeypatch.setenv("HPCB_PLANTED", PLANTED)
    monkeypatch.setenv("SLURM_CONF", "/from/the/operator")  # configuration, kept unless the cluster names one
    monkeypatch.setattr(transport_module.subprocess, "Popen", _Popen)
    _Popen.seen.clear()
    local = LocalTransport({"SLURM_CONF": "/c"})
    env = {"PATH": TENANT_PATH, "TOKEN": SECRET, "NOTE": AWKWARD}
    result = local.run([sys.executable, "-c", "import os, sys; sys.stdout.write(repr(os.read(3, 1 << 20))); "
                        "sys.stdout.write(' ' + sys.stdin.read() + ' ' + repr(sorted(os.environ)))"],
                       stdin="#!/bin/sh\nthe script\n", job_env=env)
    assert result.ok, result.stderr
    sent = "".join(f"{name}={value}\0" for name, value in env.items()).encode()
    assert result.stdout.startswith(repr(sent))
    assert " #!/bin/sh\nthe script\n " in result.stdout  # the rest of stdin is the command's, whole
    assert "HPCB_PLANTED" not in result.stdout and "'SLURM_CONF'" in result.stdout
    assert LocalTransport().minimal_env["SLURM_CONF"] == "/from/the/operator"
    assert local.minimal_env["SLURM_CONF"] == "/c"
    assert result.argv[0] == sys.executable  # callers see the command they asked for
    (argv, process_env), = _Popen.seen
    assert argv[:3] == ["sh", "-c", JOB_ENV_READER]
    assert not any(SECRET in arg or "second line" in arg for arg in argv)
    assert SECRET not in process_env.values() and "HPCB_PLANTED" not in process_env


def test_the_reader_refuses_a_malformed_head() -> None:
    result = LocalTransport().run(["cat"], stdin="", job_env={})
    assert result.ok  # an empty environment is still a well-formed head
    bad = subprocess.run(["sh", "-c", JOB_ENV_READER, "sh", "cat"], input=b"x\n", capture_output=True)
    assert bad.returncode == 125


def test_job_env_input_round_trips_through_printf_b() -> None:
    env = {"A": AWKWARD, "B": "", "C": "\\\\\n\n"}
    for shell in ("sh", "bash"):
        out = subprocess.run([shell, "-c", JOB_ENV_READER, "sh", "sh", "-c", "cat <&3"],
                             input=job_env_input(env).encode(), capture_output=True, check=True).stdout
        assert out == "".join(f"{k}={v}\0" for k, v in env.items()).encode()


class _Channel:
    def __init__(self) -> None:
        self.sent = b""
        self.channel = self

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def shutdown_write(self) -> None:
        pass

    def recv_exit_status(self) -> int:
        return 0


class _Client:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.channel = _Channel()

    def get_transport(self):
        return self

    def is_active(self) -> bool:
        return True

    def exec_command(self, line, timeout=None):
        self.lines.append(line)
        return self.channel, None, None


def test_ssh_transport_sends_values_on_stdin_never_on_the_remote_command_line(monkeypatch, tmp_path) -> None:
    pytest.importorskip("paramiko")
    monkeypatch.setattr(transport_module, "_drain", lambda channel, timeout: (b"77\n", b""))
    known = tmp_path / "known_hosts"
    known.write_text("")
    ssh = SSHTransport("login", known_hosts_file=str(known), env={"SLURM_CONF": "/c"})
    client = _Client()
    ssh._client = client
    result = ssh.run(["sbatch", "--parsable", "--export-file=3"], stdin="#!/bin/sh\n", job_env={"TOKEN": SECRET})
    assert result.ok and result.argv == ("sbatch", "--parsable", "--export-file=3")
    (line,) = client.lines
    assert SECRET not in line and JOB_ENV_READER.split("\n")[0] in line
    assert client.channel.sent == f"1\nTOKEN={SECRET}\n#!/bin/sh\n".encode()


# --- Flux: the jobspec's environment is the job's whole environment ---------------------------------------


def test_flux_job_environment_is_the_jobspec_and_never_the_submitters(monkeypatch) -> None:
    monkeypatch.setenv("HPCB_PLANTED", PLANTED)
    target = cluster("flux", environment={"SITE": "1"})
    adapter = FluxAdapter(target, transport=(transport := recording()))
    plan = plan_for(target, {"TOKEN": SECRET})
    spec = json.loads(adapter.render(plan).main)
    environment = spec["attributes"]["system"]["environment"]
    assert "HPCB_PLANTED" not in environment and PLANTED not in json.dumps(spec)
    assert set(environment) == {"PATH", "SITE", "TOKEN", "HPCBRIDGE_JOB_UID", "HPCBRIDGE_JOB_NAME",
                                "HPCBRIDGE_JOB_NAMESPACE", "HPCBRIDGE_CLUSTER"}
    # `flux job submit` takes the jobspec on stdin as it is (it merges no environment): no value in argv
    adapter.submit(adapter.render(plan))
    (call,) = transport.calls
    assert call.argv[:3] == ("flux", "job", "submit") and call.job_env is None
    assert not any(SECRET in arg for arg in call.argv)
