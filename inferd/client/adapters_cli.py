"""`inferd endpoints adapters add|list|remove|usage`: an endpoint's LoRA adapters
from a shell, and `inferd endpoints adapters build-tiny` for a random one of
tiny-chat to try them with."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
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
    parser = endpoints.add_parser("adapters", help="an endpoint's LoRA adapters")
    sub = parser.add_subparsers(dest="adapters_command", metavar="ACTION", required=True)

    def endpoint_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("endpoint", metavar="ID_OR_NAME")
        p.add_argument("--project", help="the project of a name in several of yours")

    add = sub.add_parser(
        "add", parents=[common], help="register an adapter (checked against the base model)"
    )
    endpoint_arg(add)
    add.add_argument("--name", required=True, help="what requests put in `model`")
    add.add_argument(
        "--source",
        required=True,
        help="a PEFT adapter: a directory on the server or a Hugging Face repository id",
    )
    add.set_defaults(func=command(_add))

    listing = sub.add_parser("list", parents=[common], help="list the endpoint's adapters")
    endpoint_arg(listing)
    listing.set_defaults(func=command(_list))

    remove = sub.add_parser("remove", parents=[common], help="remove an adapter")
    endpoint_arg(remove)
    remove.add_argument("name")
    remove.set_defaults(func=command(_remove))

    usage = sub.add_parser("usage", parents=[common], help="an adapter's requests and tokens")
    endpoint_arg(usage)
    usage.add_argument("name")
    usage.set_defaults(func=command(_usage))

    tiny = sub.add_parser(
        "build-tiny", help="build a random LoRA adapter of tiny-chat (needs peft); print its dir"
    )
    tiny.add_argument("--seed", type=int, default=1)
    tiny.add_argument("--rank", type=int, default=8)
    tiny.set_defaults(func=_build_tiny)


def _path(client: ManagementClient, args: argparse.Namespace) -> str:
    return f"/endpoints/{client.resolve(args.endpoint, args.project)}/adapters"


def _add(client: ManagementClient, args: argparse.Namespace) -> int:
    source = args.source
    if source.startswith((".", "~")) or Path(source).is_dir():
        source = str(Path(source).expanduser().resolve())  # the server reads absolute paths
    body = {"name": args.name, "source": source}
    adapter = client.call("POST", _path(client, args), json=body)
    if args.json:
        print(json.dumps(adapter, indent=2))
    else:
        print(f"adapter {adapter['name']} (rank {adapter['rank']}) from {adapter['source']}")
    return 0


def _list(client: ManagementClient, args: argparse.Namespace) -> int:
    adapters = client.call("GET", _path(client, args))["data"]
    if args.json:
        print(json.dumps({"data": adapters}, indent=2))
        return 0
    for a in adapters:
        print(f"{a['name']:<24} rank {a['rank']:<4} {a['source']}")
    return 0


def _remove(client: ManagementClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"{_path(client, args)}/{args.name}")
    print(f"adapter {args.name} removed")
    return 0


def _usage(client: ManagementClient, args: argparse.Namespace) -> int:
    rows = client.call("GET", f"{_path(client, args)}/{args.name}/usage")["data"]
    if args.json:
        print(json.dumps({"data": rows}, indent=2))
        return 0
    for r in rows:
        print(f"{r['hour']}  {r['requests']:>8} requests  {r['promptTokens']:>10} prompt  "
              f"{r['completionTokens']:>10} completion tokens")  # fmt: skip
    return 0


def _build_tiny(args: argparse.Namespace) -> int:
    from inferd.catalog.tiny import ensure_tiny_model
    from inferd.catalog.tiny_lora import ensure_tiny_lora

    print(ensure_tiny_lora(ensure_tiny_model("tiny-chat"), rank=args.rank, seed=args.seed))
    return 0
