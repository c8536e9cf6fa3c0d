"""`inferd endpoints tokens create|list|revoke`: an endpoint's named client
tokens from a shell (the owner's token stays `inferd endpoints token`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from inferd.client.api import ManagementClient

Action = Callable[[ManagementClient, argparse.Namespace], int]


def register(
    endpoints: argparse._SubParsersAction[Any],
    common: argparse.ArgumentParser,
    command: Callable[[Action], Callable[[argparse.Namespace], int]],
) -> None:
    """`command`: the endpoints CLI's wrapper (client from the flags, API
    errors reported)."""
    parser = endpoints.add_parser(
        "tokens", help="an endpoint's client tokens (named, each with its share and rate limit)"
    )
    sub = parser.add_subparsers(dest="tokens_command", metavar="ACTION", required=True)

    def endpoint_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("endpoint", metavar="ID_OR_NAME")
        p.add_argument("--project", help="the project of a name in several of yours")

    create = sub.add_parser("create", parents=[common], help="create one (shown once)")
    endpoint_arg(create)
    create.add_argument("name", help="who calls with it; names it in metrics")
    create.add_argument(
        "--weight", type=float, default=1.0, help="its share at capacity (the owner's is 1)"
    )
    create.add_argument(
        "--rate-limit", type=int, metavar="PER_MINUTE", help="requests a minute, at most"
    )
    create.set_defaults(func=command(_create))

    listing = sub.add_parser("list", parents=[common], help="list them (by hint)")
    endpoint_arg(listing)
    listing.set_defaults(func=command(_list))

    revoke = sub.add_parser("revoke", parents=[common], help="revoke one: it stops working")
    endpoint_arg(revoke)
    revoke.add_argument("name")
    revoke.set_defaults(func=command(_revoke))


def _path(client: ManagementClient, args: argparse.Namespace) -> str:
    return f"/endpoints/{client.resolve(args.endpoint, args.project)}/tokens"


def _create(client: ManagementClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"name": args.name, "weight": args.weight}
    if args.rate_limit is not None:
        body["requestsPerMinute"] = args.rate_limit
    created = client.call("POST", _path(client, args), json=body)
    if args.json:
        print(json.dumps(created, indent=2))
    else:
        # The token alone on stdout (`export T=$(inferd endpoints tokens create ...)`).
        print(created["token"])
        print(
            f"client token {created['name']} (weight {created['weight']:g}); shown only now",
            file=sys.stderr,
        )
    return 0


def _list(client: ManagementClient, args: argparse.Namespace) -> int:
    tokens = client.call("GET", _path(client, args))["data"]
    if args.json:
        print(json.dumps({"data": tokens}, indent=2))
        return 0
    for t in tokens:
        limit = f"{t['requestsPerMinute']}/min" if t["requestsPerMinute"] else "no limit"
        print(f"{t['name']:<24} {t['hint']:<16} weight {t['weight']:<6g} {limit:<12} "
              f"created {t['createdAt']}  last used {t['lastUsedAt'] or 'never'}")  # fmt: skip
    return 0


def _revoke(client: ManagementClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"{_path(client, args)}/{args.name}")
    print(f"client token {args.name} revoked")
    return 0
