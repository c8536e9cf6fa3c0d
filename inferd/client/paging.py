"""Lists in the CLI: every page by default; with `--limit`, one page and
the command that fetches the next."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from inferd.client.api import ManagementClient


def page_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=int, help="show one page of at most this many (default: everything)"
    )
    parser.add_argument(
        "--continue", dest="cursor", metavar="CURSOR", help="the page after the one that printed it"
    )


def list_pages(
    client: ManagementClient,
    path: str,
    query: Mapping[str, str | None],
    args: argparse.Namespace,
) -> tuple[list[Any], str | None]:
    """The items asked for, and the cursor of the next page when only one was."""
    params = {k: v for k, v in query.items() if v is not None}
    if args.limit is None and args.cursor is None:
        return list(client.walk(path, params)), None
    if args.limit is not None:
        params["limit"] = str(args.limit)
    if args.cursor is not None:
        params["continue"] = args.cursor
    return client.page(path, params)


def more_hint(cursor: str | None) -> None:
    if cursor is not None:
        print(f"(more: repeat with --continue {cursor})", file=sys.stderr)
