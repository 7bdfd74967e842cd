"""`servingtopology` entry point: dispatches to one module per subcommand.

Each subcommand module exposes `add_parser(subparsers)` and `run(args) -> int`. Exit codes: 0 ok,
1 infeasible or failed check, 2 invalid input (the message names the field and the allowed values),
3 an internal error (a defect of ours, reported in one line with the traceback only under
SERVINGTOPOLOGY_DEBUG=1), so that scripts can tell "no layout" from "the tool broke".
A reader that closes the pipe early (`plan --json | head`) ends the command quietly, not with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser", "INTERNAL_ERROR"]

INTERNAL_ERROR = 3

# subcommand -> module under servingtopology.cli
COMMANDS = {
    "plan": "plan",
    "simulate": "simulate",
    "sweep": "sweep",
    "compare": "compare",
    "validate": "validate",
    "calibrate": "calibrate",
    "operator": "operator_cmd",
    "emulate": "emulate",
    "completion": "completion",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """The whole command line's parser (also what `completion` generates its scripts from), and the subcommand modules."""
    from servingtopology import __version__

    parser = argparse.ArgumentParser(prog="servingtopology", description="Plan and keep the serving topology of an LLM.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: dict[str, object] = {}
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(f"servingtopology.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"servingtopology.cli.{module_name}":
                raise
            continue
        module.add_parser(sub)
        modules[name] = module
    return parser, modules


def main(argv: Sequence[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        code = int(modules[args.command].run(args))  # type: ignore[attr-defined]
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away; point stdout at /dev/null so the interpreter's final flush stays silent.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI's boundary: anything a subcommand did not turn into 1 or 2 is our defect
        if os.environ.get("SERVINGTOPOLOGY_DEBUG") == "1":
            raise
        print(f"servingtopology {args.command}: internal error ({type(exc).__name__}: {exc}); "
              "rerun with SERVINGTOPOLOGY_DEBUG=1 for the traceback and report it", file=sys.stderr)
        return INTERNAL_ERROR
    return code


if __name__ == "__main__":
    sys.exit(main())
