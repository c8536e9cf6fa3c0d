"""`inferd replica`: run one replica process (also `python -m inferd.replica`).

The flags and their parsing live with the configuration they build
(`inferd.replica.config`), so that launchers and this command agree on them.
"""

from __future__ import annotations

import argparse
from typing import Any

from inferd.replica.config import add_arguments, config_from_args


def run(args: argparse.Namespace) -> int:
    from inferd.replica.server import run_replica

    return run_replica(config_from_args(args))


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "replica",
        help="run one replica: load a model and serve it",
        description="Load one model and serve it on its own, without the control plane: "
        "chat on /openai/v1/chat/completions, images on /v1/images/generations, "
        "status on /healthz.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.replica")
    add_arguments(parser)
    return run(parser.parse_args(argv))
