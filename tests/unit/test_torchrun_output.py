"""torchrun's workers on one node share its stdout and stderr: through bridge.mpi.rankchunks each worker's output
comes out in whole lines tagged with its node and rank, as an MPI launcher's ranks do. A torchrun-like launcher
(several workers on one inherited pipe, RANK in each one's environment) stands in for torch, which the unit
tests do not need; tests/integration/local runs the real torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.mpi import bootstrap, discovery, rankchunks
from bridge.mpi.group import RankLines
from bridge.mpi.spec import LaunchSpec

#: what torchrun does with its workers' output by default: each one inherits its stdout and stderr
FAKE_TORCHRUN = """
import os, subprocess, sys
workers, command = int(sys.argv[1]), sys.argv[2:]
procs = [subprocess.Popen(command, env={**os.environ, "RANK": str(rank)}) for rank in range(workers)]
sys.exit(max(proc.wait() for proc in procs))
"""
#: each worker writes the first half of its line, waits until every worker has, then the rest: an unbuffered
#: print's text and newline, two writes, from two workers at once
HALVES = """
import os, sys, time
rank, turn = os.environ["RANK"], sys.argv[1]
os.write(1, f"rank {rank} A ".encode())
open(os.path.join(turn, rank), "w").close()
while len(os.listdir(turn)) < 2:
    time.sleep(0.01)
os.write(1, b"B\\n")
os.write(2, f"err {rank} ".encode() + b"x" * 9000 + b"\\n")
"""


def _label(rank: int) -> bytes:
    return f"<{rank}> ".encode()


def _spec(per_node: int = 2, command: tuple[str, ...] = ("python3", "train.py")) -> LaunchSpec:
    return LaunchSpec("torchrun", "local", per_node, command, nodes=1, node_rank=0)


def test_chunks_fit_one_pipe_write_and_tag_every_line() -> None:
    data = b"one\ntwo\n" + b"x" * 10000 + b"\nno newline"
    writes = rankchunks.chunks(rankchunks.chunk_tag(7), data, limit=4096)
    assert all(len(write) <= 4096 for write in writes)
    lines = RankLines(rankchunks.CHUNK_TAG, _label)
    assert b"".join(lines.feed(write) for write in writes) + lines.close() == (
        b"<7> one\n<7> two\n<7> " + b"x" * 10000 + b"\n<7> no newline\n")


def test_two_ranks_chunks_interleaved_come_out_as_each_ranks_lines() -> None:
    first, second = rankchunks.chunk_tag(0), rankchunks.chunk_tag(1)
    stream = b"".join([*rankchunks.chunks(first, b"rank 0 A "), *rankchunks.chunks(second, b"rank 1 A "),
                       *rankchunks.chunks(first, b"B\nnext"), *rankchunks.chunks(second, b"B\n")])
    lines = RankLines(rankchunks.CHUNK_TAG, _label, own=b"<node> ")
    out = b"".join(lines.feed(stream[i:i + 5]) for i in range(0, len(stream), 5))  # tags cut across reads too
    out += lines.feed(b"torchrun's own line\n") + lines.close()
    assert out == b"<0> rank 0 A B\n<1> rank 1 A B\n<node> torchrun's own line\n<0> next\n"


def test_only_torchrun_with_several_workers_per_node_is_wrapped(tmp_path: Path) -> None:
    topology = discovery.discover("local", slots=2, nodes=1, rank=0)
    wrapped = bootstrap.launch_argv(_spec(), topology, str(tmp_path), tag_output=True) or []
    assert wrapped[-5:] == [sys.executable, "-m", "bridge.mpi.rankchunks", "python3", "train.py"]
    assert "bridge.mpi.rankchunks" not in (bootstrap.launch_argv(_spec(), topology, str(tmp_path)) or [])
    one = discovery.discover("local", slots=1, nodes=2, rank=0)
    assert "bridge.mpi.rankchunks" not in (bootstrap.launch_argv(_spec(1), one, str(tmp_path), tag_output=True) or [])
    itself = _spec(command=("torchrun", "train.py"))  # Kubeflow style: the command runs torchrun
    assert bootstrap.launch_argv(itself, topology, str(tmp_path), tag_output=True) == ["torchrun", "train.py"]
    assert bootstrap.tags_output(_spec(), topology, {"HPCBRIDGE_TAG_OUTPUT": "1"})  # one node, two writers


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_torchrun_like_launchers_workers_lines_come_whole_and_tagged(wrapped: bool, tmp_path: Path,
                                                                       capfd: pytest.CaptureFixture[str]) -> None:
    turn = tmp_path / "turn"
    turn.mkdir()
    command = [sys.executable, "-c", HALVES, str(turn)]
    argv = [sys.executable, "-c", FAKE_TORCHRUN, "2", *(rankchunks.wrap(command) if wrapped else command)]
    code = bootstrap.run_tagged(_spec(), discovery.discover("local", slots=2, nodes=1, rank=0), argv,
                                dict(os.environ))
    captured = capfd.readouterr()
    assert code == 0
    out, err = captured.out.splitlines(), captured.err.splitlines()
    if not wrapped:  # what the workers' shared pipe gave before: halves of two lines glued together
        assert out[0] in ("[node-0] rank 0 A rank 1 A B", "[node-0] rank 1 A rank 0 A B")
        return
    assert sorted(out) == ["[node-0 rank-0] rank 0 A B", "[node-0 rank-1] rank 1 A B"]
    assert sorted(err) == [f"[node-0 rank-{rank}] err {rank} " + "x" * 9000 for rank in (0, 1)]


def test_the_wrapper_ends_as_its_command_did(tmp_path: Path) -> None:
    def wrapper(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(rankchunks.wrap(["sh", "-c", script]), capture_output=True, text=True, timeout=60,
                              env={**os.environ, "RANK": "3"})

    assert wrapper("echo out; exit 5").returncode == 5
    assert wrapper("echo out").stdout == "[\x1f3]out\n"
    assert wrapper("kill -TERM $$").returncode == -signal.SIGTERM
    missing = subprocess.run(rankchunks.wrap(["no-such-command-here"]), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 127 and "no-such-command-here" in missing.stderr


#: a torchrun that takes ``--nproc-per-node N [--no-python] SCRIPT|COMMAND…`` as the real one does, without torch:
#: its workers inherit its stdout and stderr
FAKE_TORCHRUN_ON_PATH = """
import os, subprocess, sys
args = sys.argv[1:]
workers = int(args[args.index("--nproc-per-node") + 1])
rest = args[args.index("--nproc-per-node") + 2:]
command = rest[1:] if rest[0] == "--no-python" else [sys.executable, "-u", *rest]
procs = [subprocess.Popen(command, env={**os.environ, "RANK": str(rank)}) for rank in range(workers)]
sys.exit(max(proc.wait() for proc in procs))
"""


def test_torchrun_args_get_the_workers_command_wrapped() -> None:
    pytest.importorskip("torch")
    assert rankchunks.wrapped_torchrun_args(["--nproc-per-node=2", "train.py", "--lr", "1"], "/py") == [
        "--nproc-per-node=2", "--no-python", *rankchunks.wrap(["/py", "-u", "train.py", "--lr", "1"])]
    assert rankchunks.wrapped_torchrun_args(["-m", "pkg.train", "-x"], "/py") == [
        "--no-python", *rankchunks.wrap(["/py", "-u", "-m", "pkg.train", "-x"])]
    assert rankchunks.wrapped_torchrun_args(["--no-python", "./run.sh", "a"], "/py") == [
        "--no-python", *rankchunks.wrap(["./run.sh", "a"])]
    assert rankchunks.wrapped_torchrun_args(["--run-path", "train.py"], "/py") is None  # in-process workers
    assert rankchunks.wrapped_torchrun_args(["--nnodes"], "/py") is None  # torchrun says what is wrong


@pytest.mark.parametrize("shim", [True, False])
def test_a_command_that_runs_torchrun_itself_gets_its_workers_lines_whole_and_tagged(
        shim: bool, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``bash -c "torchrun …"`` (the Kubeflow SDK's command): the launch cannot wrap the workers, so the torchrun
    the command finds first on PATH is the launch's, which runs the real one with them wrapped."""
    pytest.importorskip("torch")  # the shim reads torchrun's arguments with torchrun's own parser
    real = tmp_path / "real-bin"
    real.mkdir()
    (real / "torchrun").write_text(f"#!{sys.executable}\n{FAKE_TORCHRUN_ON_PATH}")
    (real / "torchrun").chmod(0o755)
    (tmp_path / "halves.py").write_text(HALVES)
    turn = tmp_path / "turn"
    turn.mkdir()
    spec = _spec(command=("bash", "-c", f"cd {tmp_path} && torchrun --nproc-per-node 2 halves.py {turn}"))
    topology = discovery.discover("local", slots=2, nodes=1, rank=0)
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = {**os.environ, "PATH": f"{real}:{os.environ['PATH']}"}
    if shim:
        env = bootstrap.with_torchrun_shim(spec, env, str(workdir))
    code = bootstrap.run_tagged(spec, topology, bootstrap.launch_argv(spec, topology, str(workdir), tag_output=True)
                                or [], env)
    captured = capfd.readouterr()
    assert code == 0, captured
    out, err = captured.out.splitlines(), captured.err.splitlines()
    if not shim:  # the old launch: both workers on torchrun's one pipe, halves of two lines glued together
        assert out[0] in ("[node-0 rank-0] rank 0 A rank 1 A B", "[node-0 rank-0] rank 1 A rank 0 A B",
                          "[node-0] rank 0 A rank 1 A B", "[node-0] rank 1 A rank 0 A B")
        return
    assert sorted(out) == ["[node-0 rank-0] rank 0 A B", "[node-0 rank-1] rank 1 A B"]
    assert sorted(err) == [f"[node-0 rank-{rank}] err {rank} " + "x" * 9000 for rank in (0, 1)]
