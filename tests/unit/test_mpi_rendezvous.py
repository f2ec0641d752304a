"""The address a framework is handed (a Slurm node's NodeAddr, not its name) and the bounded check that its
meeting point answers (bridge.mpi.rendezvous)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from bridge.envnames import TF_ROLES_ENV
from bridge.errors import InvalidSpec
from bridge.mpi import discovery, launchers, rendezvous
from bridge.mpi.bootstrap import child_env, launch_argv, run_child
from bridge.mpi.spec import LaunchSpec

SLURM_ENV = {"SLURM_JOB_ID": "17", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NODEID": "1"}

#: `scontrol show node --oneliner node1,node2` on a cluster whose nodes share one machine (slurm.conf
#: NodeName=node[1-2] NodeHostname=localhost NodeAddr=127.0.0.1), trimmed; a Reason with spaces on node2
SCONTROL = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Version=22.05.8 OS=Linux 6.1.0 #1 SMP State=IDLE Partitions=debug\n"
    "NodeName=node2 Arch=x86_64 CPUTot=2 NodeAddr=10.0.0.2 NodeHostName=node2 State=DOWN "
    "Reason=Not responding NodeAddr=bogus [root@2026-12-07T00:00:00]\n")


class Scontrol:
    """A recorded `scontrol`: what it was asked, what it answers."""

    def __init__(self, stdout: str = SCONTROL, returncode: int = 0, error: BaseException | None = None) -> None:
        self.stdout, self.returncode, self.error = stdout, returncode, error
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], **_kwargs: object) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        if self.error:
            raise self.error
        return subprocess.CompletedProcess(argv, self.returncode, self.stdout, "")


def spec(launcher: str = "torchrun", framework: str = "", source: str = "slurm",
         command: tuple[str, ...] = ("torchrun", "train.py")) -> LaunchSpec:
    return LaunchSpec(launcher, source, 1, command, framework=framework, rdzv_port=29500)


def slurm_topology() -> discovery.Topology:
    return discovery.discover("slurm", slots=1, nodes=2, env=SLURM_ENV)


def test_scontrols_node_lines_give_each_nodes_address() -> None:
    assert rendezvous.parse_node_addresses(SCONTROL) == {"node1": "127.0.0.1", "node2": "10.0.0.2"}
    assert rendezvous.parse_node_addresses("") == {}


def test_torchrun_on_slurm_meets_at_node_0s_address_not_its_name() -> None:
    scontrol = Scontrol()
    topology = rendezvous.with_addresses(spec(), slurm_topology(), SLURM_ENV, run=scontrol)
    assert scontrol.calls == [["scontrol", "show", "node", "--oneliner", "node1"]]  # node 0's only
    assert topology.hosts == ("node1", "node2") and topology.master == "127.0.0.1"
    env = child_env(spec(), {}, topology)  # Kubeflow style: the command runs torchrun, which reads PET_*
    assert env["PET_MASTER_ADDR"] == "127.0.0.1" and env["PET_NODE_RANK"] == "1"
    wrapped = spec(command=("python3", "train.py"))
    assert "--master-addr=127.0.0.1" in (launch_argv(wrapped, topology, "/nonexistent", None) or [])


@pytest.mark.parametrize(("framework", "variable", "expected"), [
    ("jax", "JAX_COORDINATOR_ADDRESS", "127.0.0.1:29500"), ("xgboost", "DMLC_TRACKER_URI", "127.0.0.1")])
def test_jax_coordinator_and_xgboost_tracker_get_the_address(framework: str, variable: str, expected: str) -> None:
    launch = spec("plain", framework, command=("python3", "train.py"))
    topology = rendezvous.with_addresses(launch, slurm_topology(), SLURM_ENV, run=Scontrol())
    # XGBoost's variables are each worker's (bootstrap.run_xgboost); JAX's the node's
    env = launchers.xgboost_env(topology, 29500, 0) if framework == "xgboost" else child_env(launch, {}, topology)
    assert env[variable] == expected


def test_tf_config_lists_every_nodes_address_from_one_query() -> None:
    scontrol = Scontrol()
    env = {**SLURM_ENV, TF_ROLES_ENV: "chief=1,worker=1"}
    launch = spec("plain", command=("python3", "train.py"))
    topology = rendezvous.with_addresses(launch, slurm_topology(), env, run=scontrol)
    assert scontrol.calls == [["scontrol", "show", "node", "--oneliner", "node1,node2"]]
    assert '"chief":["127.0.0.1:2223"],"worker":["10.0.0.2:2224"]' in launchers.tf_config("chief=1,worker=1",
                                                                                            topology, 2223)


@pytest.mark.parametrize("scontrol", [Scontrol(returncode=1), Scontrol(error=FileNotFoundError("scontrol")),
                                      Scontrol(stdout="no such node\n"),
                                      Scontrol(error=subprocess.TimeoutExpired("scontrol", 30))])
def test_without_an_answer_from_scontrol_the_names_stay(scontrol: Scontrol) -> None:
    topology = rendezvous.with_addresses(spec(), slurm_topology(), SLURM_ENV, run=scontrol)
    assert topology.master == "node1" and topology.addresses == ()


@pytest.mark.parametrize("launch", [spec("openmpi", command=("./a.out",)), spec("plain", command=("true",)),
                                    spec(source="jobset"), spec(source="flux"), spec(source="local")])
def test_mpi_hostfiles_and_other_backends_keep_their_names_and_ask_nothing(launch: LaunchSpec) -> None:
    scontrol = Scontrol()
    topology = discovery.Topology(("a.sub", "b.sub"), 1, 1)
    assert rendezvous.with_addresses(launch, topology, {}, run=scontrol) is topology
    assert scontrol.calls == []


def test_only_nodes_other_than_0_check_torchruns_master_or_jaxs_coordinator() -> None:
    topology = discovery.Topology(("node1", "node2"), 1, 1, ("10.0.0.1", "10.0.0.2"))
    point = rendezvous.meeting(spec(), topology, {})
    assert point == rendezvous.Meeting("10.0.0.1", 29500, rendezvous.DEFAULT_TIMEOUT, "torchrun master", 1)
    assert rendezvous.meeting(spec("plain", "jax", command=("python3",)), topology, {}).what == "JAX coordinator"
    assert rendezvous.meeting(spec(), topology._replace(rank=0), {}) is None
    # the XGBoost tracker counts any connection as a worker's: it is never probed
    assert rendezvous.meeting(spec("plain", "xgboost", command=("python3",)), topology, {}) is None
    assert rendezvous.meeting(spec(), topology, {rendezvous.RENDEZVOUS_TIMEOUT_ENV: "0"}) is None
    assert rendezvous.meeting(spec(), topology, {rendezvous.RENDEZVOUS_TIMEOUT_ENV: "7.5"}).timeout == 7.5


@pytest.mark.parametrize("value", ["soon", "-1", "inf", "nan"])
def test_a_bad_timeout_is_one_line_naming_the_variable(value: str) -> None:
    with pytest.raises(InvalidSpec, match=f"HPCBRIDGE_RENDEZVOUS_TIMEOUT.*{value}"):
        rendezvous.timeout_from({rendezvous.RENDEZVOUS_TIMEOUT_ENV: value})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.25)


def test_an_unanswered_meeting_gives_the_last_reason_once_the_bound_passes() -> None:
    clock = Clock()
    checks: list[float] = []

    def refused(_host: str, _port: int, timeout: float) -> str:
        checks.append(timeout)
        return "connection refused"

    point = rendezvous.Meeting("10.0.0.1", 29500, 5.0, "torchrun master", 1)
    assert rendezvous.await_meeting(point, lambda: False, refused, clock, clock.sleep) == "connection refused"
    assert 5.0 <= clock.now < 6.0 and all(0.1 <= timeout <= 2.0 for timeout in checks)
    assert point.failure("connection refused") == (
        "hpcbridge launch: node 1 cannot reach the rendezvous at 10.0.0.1:29500 (torchrun master on node 0): "
        "connection refused after 5 s (HPCBRIDGE_RENDEZVOUS_TIMEOUT)")


def test_an_answer_or_the_framework_ending_by_itself_ends_the_wait() -> None:
    clock = Clock()
    answers = iter(["connection refused", None])
    point = rendezvous.Meeting("10.0.0.1", 29500, 60.0, "torchrun master", 1)
    assert rendezvous.await_meeting(point, lambda: False, lambda *_: next(answers), clock, clock.sleep) is None
    assert rendezvous.await_meeting(point, lambda: True, lambda *_: "refused", clock, clock.sleep) is None


def test_the_probe_names_a_name_that_does_not_resolve_and_a_port_nobody_listens_on() -> None:
    assert rendezvous.probe("node1.invalid", 29500, 1.0) == "node1.invalid does not resolve"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert rendezvous.probe("127.0.0.1", port, 1.0) == "connection refused"  # bound, not listening
        server.listen()
        assert rendezvous.probe("127.0.0.1", port, 1.0) is None


def test_a_node_whose_meeting_never_answers_stops_its_framework_and_exits_1(capfd) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        point = rendezvous.Meeting("127.0.0.1", unused.getsockname()[1], 0.5, "JAX coordinator", 1)
        code = run_child([sys.executable, "-c", "import time; time.sleep(60)"], {}, point)
    assert code == 1
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines == [point.failure("connection refused")]


def test_a_framework_that_ends_first_keeps_its_own_code() -> None:
    point = rendezvous.Meeting("node1.invalid", 29500, 30.0, "torchrun master", 1)
    assert run_child([sys.executable, "-c", "raise SystemExit(3)"], {}, point) == 3


#: the Kubeflow SDK's CustomTrainer command on a torch runtime (kubeflow 0.5.0's TORCH_COMMAND, filled in)
SDK_COMMAND = ("bash", "-c", "\nread -r -d '' SCRIPT << EOM\n\ndef train():\n    print('hi')\n\ntrain()\n\nEOM\n"
                             "printf \"%s\" \"$SCRIPT\" > \"train.py\"\ntorchrun \"train.py\"")


@pytest.mark.parametrize(("command", "calls"), [
    (SDK_COMMAND, True), (("sh", "-c", "cd /w && torchrun --standalone t.py"), True),
    (("bash", "-ec", "OMP_NUM_THREADS=1 /opt/venv/bin/torchrun t.py"), True),
    (("sh", "-c", "if true; then exec torchrun t.py; fi"), True), (("torchrun", "t.py"), True),
    (("sh", "-c", "echo no torchrun here"), False), (("sh", "-c", "python3 torchrun.py"), False),
    (("sh", "-c", "torchrun_helper t.py"), False), (("python3", "-c", "torchrun t.py"), False),
    (("sh", "torchrun"), False), (("sh", "--c", "torchrun t.py"), False)])
def test_a_shell_script_that_runs_torchrun_is_kubeflow_style(command: tuple[str, ...], calls: bool) -> None:
    assert launchers.calls_torchrun(command) is calls


def test_the_sdks_command_runs_as_it_is_with_pet_variables_naming_node_0s_address() -> None:
    launch = spec(command=SDK_COMMAND)
    topology = rendezvous.with_addresses(launch, slurm_topology(), SLURM_ENV, run=Scontrol())
    assert launch_argv(launch, topology, "/nonexistent", None) == list(SDK_COMMAND)  # no torchrun around it
    env = child_env(launch, {}, topology)
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_MASTER_ADDR"]) == ("2", "1", "127.0.0.1")
