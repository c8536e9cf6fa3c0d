"""Placeholder: this area's subcommands are registered here once written."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    return None
