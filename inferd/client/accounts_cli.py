"""`inferd projects|members|keys|usage ...`: the accounts API from a shell.

Same conventions as `inferd endpoints`: tables by default, `--json` for
scripts, the API's error on stderr with exit status 1; a user's management
key (`--key`, `$INFERD_API_KEY`) or the operator key works for every command.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inferd.client import cli as endpoints_cli
from inferd.client.api import DEFAULT_API_URL, ApiError, ManagementClient

Action = Callable[[ManagementClient, argparse.Namespace], int]


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api-url", help=f"management API base URL (default: $INFERD_API_URL or {DEFAULT_API_URL})"
    )
    endpoints_cli.add_key_args(common)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per API call")
    return common


def _command(action: Action) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            with endpoints_cli.client_from_args(args) as client:
                return action(client, args)
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if exc.status == 401 and not endpoints_cli.key_from(args, os.environ):
                print("hint: pass --key or set INFERD_API_KEY", file=sys.stderr)
            return 1

    run.__name__ = action.__name__
    return run


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    common = _common()
    _register_projects(subparsers, common)
    _register_members(subparsers, common)
    _register_keys(subparsers, common)
    _register_usage(subparsers, common)


def _sub(
    subparsers: argparse._SubParsersAction[Any], name: str, help: str
) -> argparse._SubParsersAction[Any]:
    parser = subparsers.add_parser(name, help=help)
    return parser.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)


def _register_projects(
    subparsers: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    sub = _sub(subparsers, "projects", "list, create and inspect projects; set quotas")
    sub.add_parser("list", parents=[common], help="your projects").set_defaults(
        func=_command(_projects_list)
    )
    get = sub.add_parser("get", parents=[common], help="a project with its quota")
    get.add_argument("project")
    get.set_defaults(func=_command(_projects_get))
    create = sub.add_parser("create", parents=[common], help="create a project (operator)")
    create.add_argument("project")
    create.set_defaults(func=_command(_projects_create))
    delete = sub.add_parser("delete", parents=[common], help="delete an empty project (operator)")
    delete.add_argument("project")
    delete.set_defaults(func=_command(_projects_delete))
    quota = sub.add_parser(
        "quota",
        parents=[common],
        help="set a project's quota (its admins, within the operator's limit)",
    )
    quota.add_argument("project")
    quota.add_argument(
        "--limit",
        action="store_true",
        help="set the operator's limit over the project's quota instead (operator)",
    )
    quota.add_argument("--endpoints", type=int, help="most endpoints (omitted: unlimited)")
    quota.add_argument("--replicas", type=int, help="most replicas in total (omitted: unlimited)")
    quota.add_argument("--gpus", action="append", default=[], metavar="TYPE=N",
                       help="most GPUs of a type held together (repeatable)")  # fmt: skip
    quota.set_defaults(func=_command(_projects_quota))
    audit = sub.add_parser("audit", parents=[common], help="the project's audit log (admins)")
    audit.add_argument("project")
    audit.add_argument("--from", dest="since", help="RFC 3339 time")
    audit.add_argument("--to", dest="until", help="RFC 3339 time")
    audit.add_argument(
        "--action", action="append", default=[], help="only this action (repeatable)"
    )
    audit.set_defaults(func=_command(_projects_audit))


def _register_members(
    subparsers: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    sub = _sub(subparsers, "members", "a project's members and their roles")
    listing = sub.add_parser("list", parents=[common], help="members of a project")
    listing.add_argument("project")
    listing.set_defaults(func=_command(_members_list))
    for name, help in (("add", "add a member (a new user gets a first key, printed once)"),
                       ("set", "change a member's role")):  # fmt: skip
        parser = sub.add_parser(name, parents=[common], help=help)
        parser.add_argument("project")
        parser.add_argument("user")
        parser.add_argument("--role", required=True, choices=["admin", "developer", "viewer"])
        parser.set_defaults(func=_command(_members_put))
    remove = sub.add_parser("remove", parents=[common], help="remove a member")
    remove.add_argument("project")
    remove.add_argument("user")
    remove.set_defaults(func=_command(_members_remove))


def _register_keys(
    subparsers: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    sub = _sub(subparsers, "keys", "management keys: create (shown once), list, revoke")
    for name, help in (("list", "a user's keys (prefix and last 4 only)"),
                       ("create", "create a key, printed once"),
                       ("revoke", "revoke a key (fails from the next request on)")):  # fmt: skip
        parser = sub.add_parser(name, parents=[common], help=help)
        if name == "revoke":
            parser.add_argument("key_id", metavar="KEY_ID")
        if name == "create":
            parser.add_argument("--name", required=True, help="what the key is for")
            parser.add_argument(
                "--key-project",
                dest="key_project",
                help="the one project the key acts in (default: all of the user's, for "
                "yourself or the operator; the project you administer, for a member)",
            )
        parser.add_argument("--user", help="whose keys (default: yours)")
        parser.set_defaults(func=_command({"list": _keys_list, "create": _keys_create,
                                           "revoke": _keys_revoke}[name]))  # fmt: skip


def _register_usage(
    subparsers: argparse._SubParsersAction[Any], common: argparse.ArgumentParser
) -> None:
    sub = _sub(subparsers, "usage", "usage and cost per hour")
    for name, help in (("endpoint", "an endpoint's usage"), ("project", "a project's usage")):
        parser = sub.add_parser(name, parents=[common], help=help)
        parser.add_argument("target", metavar="ID_OR_NAME" if name == "endpoint" else "PROJECT")
        parser.add_argument("--from", dest="since", help="RFC 3339 time (default: everything)")
        parser.add_argument("--to", dest="until", help="RFC 3339 time")
        if name == "endpoint":
            parser.add_argument("--project", help="the project of a name in several of yours")
        parser.set_defaults(func=_command(_usage), usage_of=name)


# --- actions ----------------------------------------------------------------------------


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], empty: str) -> str:
    if not rows:
        return empty
    cells = [[title for title, _ in columns]]
    cells += [["" if r.get(k) is None else str(r.get(k)) for _, k in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _show(args: argparse.Namespace, value: Any, text: str) -> int:
    if args.json:
        _print_json(value)
    else:
        print(text)
    return 0


def _quota_text(quota: Mapping[str, Any]) -> str:
    def limit(value: Any) -> str:
        return "unlimited" if value is None else str(value)

    parts = [f"endpoints {limit(quota['endpoints'])}", f"replicas {limit(quota['replicas'])}"]
    parts += [f"{t} GPUs {n}" for t, n in sorted(quota["gpus"].items())]
    return ", ".join(parts)


def _projects_list(client: ManagementClient, args: argparse.Namespace) -> int:
    data = client.call("GET", "/projects")["data"]
    rows = [{**p, "quotaText": _quota_text(p["quotaInForce"])} for p in data]
    cols = (("PROJECT", "id"), ("ROLE", "role"), ("QUOTA", "quotaText"), ("CREATED", "createdAt"))
    return _show(args, {"data": data}, table(rows, cols, "No projects."))


def _projects_get(client: ManagementClient, args: argparse.Namespace) -> int:
    p = client.call("GET", f"/projects/{args.project}")
    role = p["role"] or "operator"
    text = (
        f"project  {p['id']}\nrole     {role}\n"
        f"quota    {_quota_text(p['quotaInForce'])} (in force)\n"
        f"  own    {_quota_text(p['quota'])} (set by its admins)\n"
        f"  limit  {_quota_text(p['quotaLimit'])} (set by the operator)"
    )
    return _show(args, p, text)


def _projects_create(client: ManagementClient, args: argparse.Namespace) -> int:
    p = client.call("POST", "/projects", json={"id": args.project})
    return _show(args, p, f"Created project {p['id']}.")


def _projects_delete(client: ManagementClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/projects/{args.project}")
    print(f"Deleted project {args.project}.")
    return 0


def _projects_quota(client: ManagementClient, args: argparse.Namespace) -> int:
    gpus: dict[str, int] = {}
    for item in args.gpus:
        gpu_type, _, count = item.partition("=")
        if not count.isdigit():
            raise ApiError(f"--gpus wants TYPE=N, got '{item}'", param="gpus")
        gpus[gpu_type] = int(count)
    body = {"endpoints": args.endpoints, "replicas": args.replicas, "gpus": gpus}
    if args.limit:
        p = client.call("PUT", f"/projects/{args.project}/quota-limit", json=body)
        return _show(args, p, f"Quota limit of {p['id']}: {_quota_text(p['quotaLimit'])}")
    p = client.call("PUT", f"/projects/{args.project}/quota", json=body)
    return _show(args, p, f"Quota of {p['id']}: {_quota_text(p['quota'])}")


def _projects_audit(client: ManagementClient, args: argparse.Namespace) -> int:
    params: list[tuple[str, str]] = [("action", a) for a in args.action]
    params += [(k, v) for k, v in (("from", args.since), ("to", args.until)) if v]
    data = list(client.walk(f"/projects/{args.project}/audit", params))
    cols = (("AT", "at"), ("ACTOR", "actor"), ("ACTION", "action"), ("TARGET", "target"))
    return _show(args, {"data": data}, table(data, cols, "No entries."))


def _members_list(client: ManagementClient, args: argparse.Namespace) -> int:
    data = list(client.walk(f"/projects/{args.project}/members"))
    cols = (("USER", "userId"), ("ROLE", "role"), ("SINCE", "createdAt"))
    return _show(args, {"data": data}, table(data, cols, "No members."))


def _members_put(client: ManagementClient, args: argparse.Namespace) -> int:
    body = client.call(
        "PUT", f"/projects/{args.project}/members/{args.user}", json={"role": args.role}
    )
    # A project admin's new user is the project's own: `<project>:<name>`.
    text = f"{body['member']['userId']} is {args.role} in {args.project}."
    if body["createdKey"]:
        text += (f"\nNew user; their management key (shown only this once):\n"
                 f"  {body['createdKey']['key']}")  # fmt: skip
    return _show(args, body, text)


def _members_remove(client: ManagementClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/projects/{args.project}/members/{args.user}")
    return _show(args, {"removed": args.user}, f"Removed {args.user} from {args.project}.")


def _user(client: ManagementClient, args: argparse.Namespace) -> str:
    if args.user:
        return str(args.user)
    me = client.call("GET", "/whoami")
    if me["operator"]:
        raise ApiError(
            "the operator key has no keys of its own: name a user (--user)", param="user"
        )
    return str(me["id"])


_KEY_COLUMNS = (("ID", "id"), ("NAME", "name"), ("KEY", "hint"), ("PROJECT", "projectId"),
                ("CREATED", "createdAt"), ("LAST USED", "lastUsedAt"),
                ("REVOKED", "revokedAt"))  # fmt: skip


def _keys_list(client: ManagementClient, args: argparse.Namespace) -> int:
    data = list(client.walk(f"/users/{_user(client, args)}/keys"))
    return _show(args, {"data": data}, table(data, _KEY_COLUMNS, "No keys."))


def _keys_create(client: ManagementClient, args: argparse.Namespace) -> int:
    body = {"name": args.name}
    if args.key_project:
        body["projectId"] = args.key_project
    key = client.call("POST", f"/users/{_user(client, args)}/keys", json=body)
    text = f"Key {key['id']} ({key['name']}), shown only this once:\n  {key['key']}"
    return _show(args, key, text)


def _keys_revoke(client: ManagementClient, args: argparse.Namespace) -> int:
    client.call("DELETE", f"/users/{_user(client, args)}/keys/{args.key_id}")
    return _show(args, {"revoked": args.key_id}, f"Revoked key {args.key_id}.")


_USAGE_COLUMNS = (("HOUR", "hour"), ("ENDPOINT", "endpoint"), ("GPU", "gpu"),
                  ("REPLICA-S", "replicaSeconds"), ("REQUESTS", "requests"),
                  ("PROMPT", "promptTokens"), ("COMPLETION", "completionTokens"),
                  ("IMAGES", "images"), ("COST", "cost"))  # fmt: skip


def _usage(client: ManagementClient, args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("from", args.since), ("to", args.until)) if v}
    if args.usage_of == "endpoint":
        path = f"/endpoints/{client.resolve(args.target, args.project)}/usage"
    else:
        path = f"/projects/{args.target}/usage"
    body = client.call("GET", path, params=params)
    # Every page's rows; the totals (the whole window's) are on each page.
    while "continue" in body:
        more = client.call("GET", path, params={**params, "continue": body.pop("continue")})
        body = {**more, "data": body["data"] + more["data"]}
    # Endpoints by name where they still exist (a deleted one keeps its id).
    names = {e["id"]: e["name"] for e in client.list_endpoints(
        None if args.usage_of == "endpoint" else args.target)}  # fmt: skip
    rows = [
        {**r, "gpu": f"{r['gpuCount']} x {r['gpuType']}",
         "endpoint": names.get(r["endpointId"], r["endpointId"])}
        for r in body["data"]
    ]  # fmt: skip
    t = body["totals"]
    text = table(rows, _USAGE_COLUMNS, "No usage recorded.") + (
        f"\ntotal: {t['replicaSeconds']} replica-seconds, {t['requests']} requests, "
        f"{t['promptTokens']}+{t['completionTokens']} tokens, {t['images']} images, "
        f"{t['cost']} {body['currency']}"
    )
    return _show(args, body, text)
