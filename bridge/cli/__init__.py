"""``hpcbridge``: the command line, a front end that parses arguments and calls bridge.service.

Start-up stays fast: only the api, plan and the chosen adapter are imported; Kubernetes, kopf, paramiko
and flux load inside the adapters that talk to them; only the parser of the command given is built, and
``launch``, which every node of an allocation starts at once, loads neither pydantic nor YAML. argparse
rather than typer: typer's import alone costs more than the whole 100 ms start-up budget. Exit codes: 0
success, 1 backend failure, 2 invalid input; ``submit`` to the local cluster exits with the job's own code.
"""


import os
import sys

from bridge.cli.arguments import check_leftovers, split_at_separator
from bridge.cli.parser import build_parser
from bridge.errors import BridgeError

__all__ = ["build_parser", "main"]

#: commands that only read files and print: run as the process's entry point, they end it without the
#: interpreter's teardown (freeing every module and model class loaded, ~40 ms of CPU, a sixth of a cold
#: render); they start no thread, child process or temporary file that the teardown would see to
QUICK_EXIT = ("render", "validate", "convert")


def _run(argv: list[str]) -> int:
    parser = build_parser(argv[0] if argv else None)
    if not argv:  # bare `hpcbridge`: what it takes, and exit 2 as for any other missing argument
        sys.stderr.write(parser.format_usage() + "hpcbridge: error: name a command (`hpcbridge --help` lists them)\n")
        return 2
    ours, after_separator = split_at_separator(argv)
    args, extra = parser.parse_known_args(ours)
    check_leftovers(parser, args, extra)
    args.sbatch_flags = extra + after_separator
    code: int = args.func(args)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run a command; *argv* None means the process's own arguments (the console script, ``python -m bridge``)
    and, for the QUICK_EXIT commands, that the process ends here."""
    code = _main(sys.argv[1:] if argv is None else argv)
    if argv is None and sys.argv[1:2] and sys.argv[1] in QUICK_EXIT:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BrokenPipeError:  # the reader went away (`| head`): as a BrokenPipeError in the command
            code = 1
        os._exit(code)
    return code


def _main(argv: list[str]) -> int:
    if os.environ.get("HPCBRIDGE_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="hpcbridge: debug: %(message)s", stream=sys.stderr)
    try:
        return _run(argv)
    except BridgeError as exc:
        print(f"hpcbridge: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line for the user, the traceback on request
        if os.environ.get("HPCBRIDGE_DEBUG"):
            raise
        text = " ".join(str(exc).split())[:200]
        print(f"hpcbridge: internal error: {type(exc).__name__}: {text} (a bug; HPCBRIDGE_DEBUG=1 shows where)",
              file=sys.stderr)
        return 1

