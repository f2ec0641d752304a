"""Output people read (issue 40): every line of a local job whole, tagged with the node and rank that wrote it,
stderr kept apart from stdout, a last line without its newline never glued to the next."""

from __future__ import annotations

import os
import subprocess

import pytest

from bridge.adapters.local.supervisor import OutputPump
from bridge.envnames import TAG_OUTPUT_ENV
from bridge.mpi import bootstrap, discovery, launchers
from bridge.mpi.group import HYDRA_TAG, OPENMPI_TAG, LineRelay, Lines, RankLines
from bridge.mpi.spec import LaunchSpec


def _rank(rank: int) -> bytes:
    return f"<{rank}> ".encode()


def test_openmpi_chunks_of_two_ranks_become_each_ranks_whole_lines() -> None:
    """What mpirun --tag-output writes when two unbuffered ranks print at once (the text and its newline are
    two writes): the halves of their lines interleave; a tag split across two reads still counts."""
    lines = RankLines(OPENMPI_TAG, _rank)
    out = lines.feed(b"[1,0]<stdout>:rank 0 A [1,1]<stdout>:rank 1 A [1,0]<stdout>:\n[1,2]<stdout>:two [1,1]<std")
    out += lines.feed(b"out>:\n[1,2]<stdout>:\nmpirun: its own line\n[1,3]<stdout>:no newline")
    assert out == b"<0> rank 0 A \n<1> rank 1 A \n<2> two \nmpirun: its own line\n"
    assert lines.close() == b"<3> no newline\n"


def test_hydra_tags_and_a_rank_printing_a_tag_shaped_text() -> None:
    lines = RankLines(HYDRA_TAG, _rank)
    out = lines.feed(b"[2] rank 2 A [1] rank 1 A [2] B\n[0] [1] is rank 0's text\n[0] tail 0[1] B\n")
    assert out == b"<2> rank 2 A B\n<0> [1] is rank 0's text\n<1> rank 1 A B\n"
    assert lines.close() == b"<0> tail 0\n"


def test_plain_lines_keep_a_last_line_without_newline_apart() -> None:
    lines = Lines(b"[node-1] ")
    assert lines.feed(b"a\nb") == b"[node-1] a\n" and lines.feed(b"c\n") == b"[node-1] bc\n"
    assert lines.feed(b"tail") == b"" and lines.close() == b"[node-1] tail\n" and lines.close() == b""


def test_each_pipe_of_a_relay_has_its_own_prefix(capfd) -> None:
    relay = LineRelay()
    first, second = relay.pipe(b"[a] "), relay.pipe(b"[b] ")
    procs = [subprocess.Popen(["sh", "-c", "printf one"], stdout=first[0], stderr=first[1]),
             subprocess.Popen(["sh", "-c", "echo two >&2"], stdout=second[0], stderr=second[1])]
    relay.started()
    assert [proc.wait() for proc in procs] == [0, 0]
    relay.finish(timeout=None)
    captured = capfd.readouterr()
    assert captured.out == "[a] one\n" and captured.err == "[b] two\n"


def _topology(nodes: int, slots: int) -> discovery.Topology:
    return discovery.discover("local", slots=slots, nodes=nodes, rank=0)


def test_mpi_launchers_tag_their_ranks_only_when_asked(tmp_path) -> None:
    spec = LaunchSpec("openmpi", "local", 2, ("python3", "x.py"), nodes=2, node_rank=0)
    topology = _topology(2, 2)
    assert "--tag-output" not in (bootstrap.launch_argv(spec, topology, str(tmp_path)) or [])
    assert "--tag-output" in (bootstrap.launch_argv(spec, topology, str(tmp_path), tag_output=True) or [])
    hydra = bootstrap.launch_argv(spec._replace(launcher="mpich"), topology, str(tmp_path), tag_output=True)
    assert hydra is not None and "-prepend-rank" in hydra
    assert "-prepend-rank" not in launchers.hydra_argv(topology, "hosts", ["x"], [])


@pytest.mark.parametrize(("launcher", "nodes", "per_node", "tagged"), [
    ("openmpi", 1, 2, True), ("openmpi", 1, 1, False), ("plain", 2, 1, True), ("plain", 1, 4, False),
    ("script", 2, 2, False), ("torchrun", 2, 1, True)])
def test_a_launch_tags_a_local_jobs_lines_where_several_processes_write(launcher, nodes, per_node, tagged) -> None:
    spec = LaunchSpec(launcher, "local", per_node, ("true",), nodes=nodes, node_rank=0)
    topology = _topology(nodes, per_node)
    assert bootstrap.tags_output(spec, topology, {TAG_OUTPUT_ENV: "1"}) is tagged
    assert bootstrap.tags_output(spec, topology, {}) is False  # off the local cluster: as before
    assert bootstrap.rank_label(3, 2) == b"[node-1 rank-3] "


def test_a_tagged_plain_node_relays_its_lines_whole_and_tagged(capfd) -> None:
    spec = LaunchSpec("plain", "local", 1, ("sh",), nodes=2, node_rank=1)
    topology = discovery.discover("local", slots=1, nodes=2, rank=1)
    code = bootstrap.run_tagged(spec, topology, ["sh", "-c", "printf 'a\\nb'; echo e >&2; exit 4"], dict(os.environ))
    captured = capfd.readouterr()
    assert code == 4 and captured.out == "[node-1] a\n[node-1] b\n" and captured.err == "[node-1] e\n"


def test_a_tagged_mpi_run_joins_each_ranks_chunks(capfd) -> None:
    """An "mpirun" that writes what Open MPI's --tag-output writes for two ranks printing at once."""
    spec = LaunchSpec("openmpi", "local", 2, ("x",), nodes=1, node_rank=0)
    script = "printf '[1,0]<stdout>:A [1,1]<stdout>:B [1,0]<stdout>:a\\n[1,1]<stdout>:b\\n'; printf '[1,1]<stderr>:oops' >&2"
    code = bootstrap.run_tagged(spec, _topology(1, 2), ["sh", "-c", script], dict(os.environ))
    captured = capfd.readouterr()
    assert code == 0
    assert captured.out == "[node-0 rank-0] A a\n[node-0 rank-1] B b\n"
    assert captured.err == "[node-0 rank-1] oops\n"


def test_a_pump_sends_stderr_apart_and_ends_a_last_line(tmp_path) -> None:
    out: list[str] = []
    err: list[str] = []
    proc = subprocess.Popen(["sh", "-c", "echo out; echo err >&2; printf 'no newline'"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    pump = OutputPump(proc, tmp_path / "node-0.log", out.append, err.append)
    proc.wait()
    pump.join(5)
    assert out == ["out\n", "no newline\n"] and err == ["err\n"]
    assert sorted((tmp_path / "node-0.log").read_text().splitlines()) == ["err", "no newline", "out"]


def test_xgboost_workers_wait_for_the_trackers_port_without_connecting() -> None:
    """The wait reads the kernel's tables: a probe connection would be a failed worker to the tracker."""
    import socket
    import time

    from bridge.mpi.spawn import Process

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    assert not bootstrap.listening(port)
    server.listen()
    try:
        assert bootstrap.listening(port)
        started = time.monotonic()
        bootstrap.wait_for_tracker(port, 30, None)
        assert time.monotonic() - started < 1
    finally:
        server.close()
    ended = Process(["true"])
    while not bootstrap.exited(ended):
        time.sleep(0.01)
    started = time.monotonic()
    bootstrap.wait_for_tracker(port, 30, ended)  # its owner ended: no tracker is coming
    assert time.monotonic() - started < 1
    assert ended.wait() == 0  # not reaped by the look
