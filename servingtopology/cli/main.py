"""`servingtopology` entry point: dispatches to one module per subcommand.

Each subcommand module exposes `add_parser(subparsers)` and `run(args) -> int`. Exit codes: 0 ok,
1 infeasible or failed check, 2 invalid input (the message names the field and the allowed values).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# subcommand -> module under servingtopology.cli
COMMANDS = {
    "plan": "plan",
    "simulate": "simulate",
    "sweep": "sweep",
    "validate": "validate",
    "operator": "operator_cmd",
    "emulate": "emulate",
}


def _parser() -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(prog="servingtopology", description="Plan and keep the serving topology of an LLM.")
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
    parser, modules = _parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    code = int(modules[args.command].run(args))  # type: ignore[attr-defined]
    return code


if __name__ == "__main__":
    sys.exit(main())
