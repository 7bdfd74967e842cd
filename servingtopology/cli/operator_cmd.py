"""`servingtopology operator`: runs the ServingTopology operator (the same code as `servingtopology-operator`).

Called by the CLI dispatcher (servingtopology/cli/main.py). Only parses flags and hands over to
servingtopology.operator.entry.main; imports kopf lazily so other subcommands do not pay for it.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    from servingtopology.operator.entry.main import add_arguments

    parser: argparse.ArgumentParser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator", description="Run the ServingTopology operator (kopf).")
    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from servingtopology.operator.entry.main import run as run_operator

    return run_operator(args)
