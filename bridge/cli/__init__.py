"""``hpcbridge``: the command line, a front end that parses arguments and calls bridge.service.

Start-up stays fast: only the api, plan and the chosen adapter are imported; Kubernetes, kopf, paramiko
and flux load inside the adapters that talk to them. argparse rather than typer: typer's import alone
costs more than the whole 150 ms start-up budget. Exit codes: 0 success, 1 backend failure, 2 invalid
input; ``submit`` to the local cluster exits with the job's own code.
"""


import os
import sys

from bridge.cli.arguments import check_leftovers, split_at_separator
from bridge.cli.parser import build_parser
from bridge.errors import BridgeError

__all__ = ["build_parser", "main"]


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
    if os.environ.get("HPCBRIDGE_DEBUG"):
        import logging

        logging.basicConfig(level=logging.DEBUG, format="hpcbridge: debug: %(message)s", stream=sys.stderr)
    try:
        return _run(sys.argv[1:] if argv is None else argv)
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

