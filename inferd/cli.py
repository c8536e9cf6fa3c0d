"""`inferd` command line: one subcommand per area, each registered by its module.

Subcommand modules are imported lazily by name so that `inferd endpoints list`
never pays for importing torch or vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from inferd import __version__

# (module, help). Each module exposes `register(subparsers)`, which adds its
# parser(s) and sets `func=` to a callable taking the parsed args and
# returning an exit status.
_SUBCOMMAND_MODULES: tuple[str, ...] = (
    "inferd.server.cli",  # serve
    "inferd.replica.cli",  # replica
    "inferd.client.cli",  # endpoints ...
    "inferd.client.accounts_cli",  # projects, members, keys, usage ...
    "inferd.client.batches_cli",  # batches ...
    "inferd.catalog.cli",  # recommend, models
    "inferd.node.cli",  # node start
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inferd", description="GPU model-serving runtime with an embedded control plane."
    )
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except BrokenPipeError:
        # `inferd endpoints list | head`: the reader left; not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
