"""One torchrun worker's command with its output in tagged, atomic chunks: ``python -m bridge.mpi.rankchunks CMD…``.

torchrun's workers on a node inherit its stdout and stderr, so they all write into one pipe, and a line written in
parts (an unbuffered print writes its newline apart) or longer than one atomic pipe write comes out torn, glued to
another worker's. Here the command writes into pipes of its own; what it writes goes on in chunks that each fit one
atomic write (PIPE_BUF), each after ``[\\x1f<RANK>]`` (torchrun's global rank), and the node's launch joins each
rank's chunks into whole lines (``group.RankLines`` with ``CHUNK_TAG``). The tag's unit separator is a control
character no text a program prints holds.

The command stays in this process's group: torchrun ends a worker by signalling its group, which reaches both.
The signals are noted here, not forwarded (the command has them already), so that this relay outlives the command
and carries its last lines; the command's exit, or the signal that ended it, becomes this process's own.

A command that runs torchrun itself (the Kubeflow SDK's ``bash -c "torchrun …"``, a script calling torchrun) is
launched as it is, so the launch cannot wrap the workers; instead it puts a ``torchrun`` of its own first on the
command's PATH (write_torchrun_shim): ``python -m bridge.mpi.rankchunks --torchrun SHIM_DIR ARG…`` reads the
arguments with torchrun's own parser and runs the real torchrun with ``--no-python`` and the worker's command
wrapped here, as the launch does with its own torchrun.
"""

from __future__ import annotations

import os
import select
import signal
import sys
from collections.abc import Sequence

from bridge.mpi.exits import FORWARDED

#: the tag before each chunk a rank writes; group 1 is the rank
CHUNK_TAG = rb"\[\x1f(\d+)\]"
#: the wrapper's argv before the command: torchrun runs it with --no-python
MODULE = "bridge.mpi.rankchunks"


def wrap(command: Sequence[str], python: str | None = None) -> list[str]:
    """*command* run through this module by *python* (default: this one)."""
    return [python or sys.executable, "-m", MODULE, *command]


def chunk_tag(rank: int) -> bytes:
    return b"[\x1f%d]" % rank


def chunks(tag: bytes, data: bytes, limit: int = select.PIPE_BUF) -> list[bytes]:
    """*data* as writes of at most *limit* bytes (one atomic pipe write each) in which every line, and every
    piece of a line too long for one write, starts with *tag*: the reader takes untagged text after a newline
    for torchrun's own."""
    size = limit - len(tag)
    *whole, rest = data.split(b"\n")
    lines = [line + b"\n" for line in whole] + ([rest] if rest else [])
    pieces = [tag + line[start:start + size] for line in lines for start in range(0, len(line), size)]
    writes: list[bytes] = []
    for piece in pieces:
        if writes and len(writes[-1]) + len(piece) <= limit:
            writes[-1] += piece
        else:
            writes.append(piece)
    return writes


def relay(sources: dict[int, int], tag: bytes) -> None:
    """Copy each source fd to its target fd (*sources*: source → target) in tagged chunks, until every source
    ends."""
    import selectors

    selector = selectors.DefaultSelector()
    for source, target in sources.items():
        selector.register(source, selectors.EVENT_READ, target)
    while selector.get_map():
        for key, _ in selector.select():
            data = os.read(key.fd, 65536)
            if not data:
                selector.unregister(key.fd)
                os.close(key.fd)
                continue
            for piece in chunks(tag, data):
                _write_whole(key.data, piece)


def _write_whole(fd: int, piece: bytes) -> None:
    try:
        os.write(fd, piece)  # a pipe write of at most PIPE_BUF bytes is whole, or fails
    except BrokenPipeError:
        pass  # nobody reads our output any more: the command's exit still counts


def _noted(_signum: int, _frame: object) -> None:
    """The group's signal reached the command too; this relay goes on until the command ends."""


def run(command: Sequence[str], rank: int) -> int:
    """Run *command* with its output relayed in chunks tagged with *rank*; its shell-style exit code."""
    from bridge.mpi.exits import shell_code
    from bridge.mpi.spawn import Process

    previous = {sig: signal.signal(sig, _noted) for sig in FORWARDED}
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    try:
        proc = Process(command, dict(os.environ), outputs=(out_write, err_write))
    except (FileNotFoundError, PermissionError) as error:
        print(f"hpcbridge: {command[0]}: {error.strerror}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126
    finally:
        os.close(out_write)
        os.close(err_write)
    relay({out_read: sys.stdout.fileno(), err_read: sys.stderr.fileno()}, chunk_tag(rank))
    returncode = proc.wait()
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    return shell_code(returncode)


def write_torchrun_shim(directory: str, python: str) -> str:
    """A ``torchrun`` executable in *directory*/torchrun-bin (the launch's private workdir) that runs the real one
    with its workers wrapped here; the folder's path, to go first on the command's PATH."""
    from bridge.shell import quote

    shims = os.path.join(directory, "torchrun-bin")
    os.mkdir(shims, 0o700)
    path = os.path.join(shims, "torchrun")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f'#!/bin/sh\nexec {quote(python)} -m {MODULE} --torchrun {quote(shims)} "$@"\n')
    os.chmod(path, 0o700)
    return shims


def torchrun_python(torchrun: Sequence[str]) -> str:
    """The Python torchrun runs its workers with (its own): the interpreter its script's ``#!`` names, else
    ours."""
    if len(torchrun) > 1:  # python -m torch.distributed.run
        return torchrun[0]
    try:
        with open(torchrun[0], "rb") as handle:
            first = handle.readline(4096)
    except OSError:
        return sys.executable
    words = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    return words[0] if len(words) == 1 and "python" in os.path.basename(words[0]) else sys.executable


def wrapped_torchrun_args(args: Sequence[str], python: str) -> list[str] | None:
    """torchrun's *args* with the worker's command run through this module (``--no-python`` and the command as
    torchrun would have run it, by *python*); None where they are not a job to wrap (no torch here to read them
    with, ``--help``, a mistake torchrun should report itself, ``--run-path``'s in-process workers)."""
    try:
        from torch.distributed.run import get_args_parser
    except ImportError:
        return None
    try:
        parsed = get_args_parser().parse_args(list(args))
    except SystemExit:
        return None
    rest = list(parsed.training_script_args)
    index = len(args) - len(rest) - 1
    if parsed.run_path or index < 0 or args[index] != parsed.training_script:
        return None
    if parsed.no_python:
        worker = [parsed.training_script, *rest]
    else:
        worker = [python, "-u", *(["-m"] if parsed.module else []), parsed.training_script, *rest]
    options = [arg for arg in args[:index] if arg not in ("-m", "--module", "--no-python", "--no_python")]
    return [*options, "--no-python", *wrap(worker)]


def run_torchrun(shim_dir: str, args: Sequence[str]) -> int:
    """The shim's work: the real torchrun (PATH without the shim) with its workers wrapped where it can be."""
    from bridge.mpi.launchers import find_torchrun

    path = [entry for entry in os.environ.get("PATH", "").split(os.pathsep) if entry != shim_dir]
    os.environ["PATH"] = os.pathsep.join(path)  # the workers and anything torchrun starts see no shim
    torchrun = find_torchrun()
    wrapped = wrapped_torchrun_args(args, torchrun_python(torchrun))
    argv = [*torchrun, *(wrapped if wrapped is not None else args)]
    try:
        os.execvp(argv[0], argv)
    except OSError as error:
        print(f"hpcbridge: {argv[0]}: {error.strerror}", file=sys.stderr)
    return 127


def main(argv: Sequence[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--torchrun":
        return run_torchrun(argv[1], argv[2:])
    if not argv:
        print(f"usage: python -m {MODULE} COMMAND [ARG…] | --torchrun SHIM_DIR [TORCHRUN_ARG…]", file=sys.stderr)
        return 2
    from bridge.mpi.exits import ending_signal

    code = run(argv, int(os.environ.get("RANK", "0")))
    ended_by = ending_signal(code)
    if ended_by in FORWARDED:
        # ended as the command was: torchrun reads a worker's signal from how it ended
        signal.signal(ended_by, signal.SIG_DFL)
        os.kill(os.getpid(), ended_by)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
