"""`inferd endpoints create|list|get|update|delete|token`: the management API from a shell.

Readable tables by default, `--json` for scripts. Errors come from the API's
error body (message, field, code) on stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx

from inferd.client import adapters_cli, tokens_cli
from inferd.client.api import DEFAULT_API_URL, ApiError, ManagementClient
from inferd.client.paging import list_pages, more_hint, page_args

if TYPE_CHECKING:
    from inferd.catalog.registered import ProfilePoint

LIST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ID", "id"),
    ("NAME", "name"),
    ("MODEL", "modelName"),
    ("GPU", "_gpu"),
    ("LOCATION", "locationName"),
    ("REPLICAS", "_replicas"),
    ("STATUS", "status"),
    ("PRICE/H", "_price"),
)

DETAIL_FIELDS: tuple[str, ...] = (
    "id",
    "name",
    "modelName",
    "gpuType",
    "gpuCount",
    "locationName",
    "minReplicas",
    "maxReplicas",
    "currentReplicas",
    "scaleToZeroRetentionPeriodSeconds",
    "hourlyPrice",
    "status",
    "statusReason",
    "projectId",
    "engineSettings",
    "costSoFar",
    "url",
    "createdAt",
    "updatedAt",
)


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "endpoints", help="create, list, change and delete inference endpoints"
    )
    sub = parser.add_subparsers(dest="endpoints_command", metavar="ACTION", required=True)

    common = api_args()

    create = sub.add_parser("create", parents=[common], help="create an endpoint")
    create.add_argument("name")
    create.add_argument("--model", required=True, help="model name (see `inferd models`)")
    create.add_argument("--gpu-type", help="GPU type (default: the recommended one)")
    create.add_argument("--gpu-count", type=int, help="GPUs per replica (default: recommended)")
    create.add_argument("--location", help="location (default: the server's default)")
    create.add_argument(
        "--project", help="project (default: your only project; the operator's: default)"
    )
    _scaling_args(create)
    create.add_argument(
        "--wait",
        action="store_true",
        help="then follow the endpoint until a replica serves (progress on stderr)",
    )
    _wait_args(create)
    _env_args(create)
    create.add_argument(
        "--env",
        action="store_true",
        help='print only the export line, for eval "$(inferd endpoints create ... --env)"',
    )
    create.set_defaults(func=command(_create))

    wait = sub.add_parser(
        "wait",
        parents=[common],
        help="follow an endpoint until a replica serves: its stage and the time so far",
    )
    wait.add_argument("endpoint", metavar="ID_OR_NAME")
    wait.add_argument("--project", help="the project of a name in several of yours")
    _wait_args(wait)
    wait.set_defaults(func=command(_wait))

    env = sub.add_parser(
        "env",
        parents=[common],
        help="print `export URL=...` for an endpoint (with --new-token, TOKEN too)",
    )
    env.add_argument("endpoint", metavar="ID_OR_NAME")
    env.add_argument("--project", help="the project of a name in several of yours")
    _env_args(env)
    env.add_argument(
        "--new-token",
        action="store_true",
        help="issue a new access token and export it (the previous one stops working)",
    )
    env.set_defaults(func=command(_env))

    listing = sub.add_parser("list", parents=[common], help="list endpoints")
    listing.add_argument("--project", help="only this project's endpoints")
    listing.add_argument("--status", help="only endpoints in this status (e.g. running)")
    listing.add_argument("--model", help="only endpoints serving this model")
    listing.add_argument("--location", help="only endpoints in this location")
    listing.add_argument("--name-prefix", help="only endpoints whose name starts with this")
    page_args(listing)
    listing.set_defaults(func=command(_list))

    get = sub.add_parser("get", parents=[common], help="show one endpoint")
    get.add_argument("endpoint", metavar="ID_OR_NAME")
    get.add_argument("--project", help="the project of a name in several of yours")
    get.set_defaults(func=command(_get))

    update = sub.add_parser(
        "update", parents=[common], help="change scaling, GPU or engine settings"
    )
    update.add_argument("endpoint", metavar="ID_OR_NAME")
    update.add_argument("--project", help="the project of a name in several of yours")
    _scaling_args(update)
    update.add_argument("--gpu-type", help="new GPU type (replicas are replaced)")
    update.add_argument("--gpu-count", type=int, help="new GPUs per replica")
    update.set_defaults(func=command(_update))

    delete = sub.add_parser("delete", parents=[common], help="delete an endpoint")
    delete.add_argument("endpoint", metavar="ID_OR_NAME")
    delete.add_argument("--project", help="the project of a name in several of yours")
    delete.set_defaults(func=command(_delete))

    token = sub.add_parser(
        "token", parents=[common], help="issue a new access token (the old one stops working)"
    )
    token.add_argument("endpoint", metavar="ID_OR_NAME")
    token.add_argument("--project", help="the project of a name in several of yours")
    token.set_defaults(func=command(_token))

    adapters_cli.register(sub, common, command)
    tokens_cli.register(sub, common, command)

    bench = subparsers.add_parser(
        "bench",
        parents=[common],
        help="measure an endpoint at a few concurrencies and record the model's profile",
        description="Bounded load against a live endpoint: at each concurrency, that many "
        "clients send requests back to back until --requests have completed. Throughput, "
        "TTFT and TPOT (p95) are recorded as the profile of the endpoint's model on its GPU "
        "type and count; recommendations then use it ('measured on ...').",
    )
    bench.add_argument("endpoint", metavar="ID_OR_NAME")
    bench.add_argument("--token", help="the endpoint's access token (default: $INFERD_TOKEN)")
    bench.add_argument("--concurrency", default="1,4,16", help="levels (default 1,4,16)")
    bench.add_argument("--requests", type=int, default=32, help="requests per level")
    bench.add_argument("--prompt-tokens", type=int, default=256)
    bench.add_argument("--output-tokens", type=int, default=64)
    bench.add_argument("--image-size", default="", help="WxH for image endpoints")
    bench.add_argument("--no-record", action="store_true", help="measure only, store nothing")
    bench.set_defaults(func=command(_bench))


def api_args() -> argparse.ArgumentParser:
    """The flags every management API command takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api-url", help=f"management API base URL (default: $INFERD_API_URL or {DEFAULT_API_URL})"
    )
    add_key_args(common)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    common.add_argument("--timeout", type=float, default=30.0, help="seconds per API call")
    return common


def _scaling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-replicas", type=int, help="lower bound (0: scale to zero)")
    parser.add_argument("--max-replicas", type=int, help="upper bound")
    parser.add_argument(
        "--retention", type=int, metavar="SECONDS", help="idle seconds before scaling to zero"
    )
    parser.add_argument(
        "--engine-settings",
        type=_json_object,
        metavar="JSON",
        help='engine settings, e.g. \'{"maxModelLen": 8192, "kvCacheDtype": "fp8"}\' '
        "(an update merges them: null clears one; a change replaces the replicas)",
    )


def _wait_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-wait",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="give up (exit status 1) after this long (default 900)",
    )


def _env_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env-prefix",
        default="",
        type=_env_prefix,
        metavar="PREFIX",
        help="name the exported variables PREFIX+URL and PREFIX+TOKEN (e.g. IMAGE_)",
    )


def _env_prefix(text: str) -> str:
    if not (text + "URL").isidentifier() or not text.isascii():
        raise argparse.ArgumentTypeError("letters, digits and _ only, not first a digit")
    return text


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _scaling_body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for flag, field in (
        ("min_replicas", "minReplicas"),
        ("max_replicas", "maxReplicas"),
        ("retention", "scaleToZeroRetentionPeriodSeconds"),
        ("gpu_type", "gpuType"),
        ("gpu_count", "gpuCount"),
        ("engine_settings", "engineSettings"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            body[field] = value
    return body


def add_key_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--key",
        "--admin-key",
        dest="admin_key",
        help="your management key, or the operator key "
        "(default: $INFERD_API_KEY, else $INFERD_ADMIN_KEY)",
    )


def key_from(args: argparse.Namespace, env: Mapping[str, str]) -> str | None:
    key: str | None = args.admin_key or env.get("INFERD_API_KEY") or env.get("INFERD_ADMIN_KEY")
    return key


def client_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ManagementClient:
    env = os.environ if env is None else env
    api_url = args.api_url or env.get("INFERD_API_URL") or DEFAULT_API_URL
    return ManagementClient(api_url, key_from(args, env), timeout=args.timeout)


# --- actions (each returns the exit status) -----------------------------------------


def _create(client: ManagementClient, args: argparse.Namespace) -> int:
    body = {"name": args.name, "modelName": args.model, **_scaling_body(args)}
    if args.location:
        body["locationName"] = args.location
    if args.project:
        body["projectId"] = args.project
    record = client.create_endpoint(body)
    token = record["accessToken"]
    if args.env:
        # stdout is for `eval`; the rest goes to the terminal.
        print(export_line(record["url"], token, args.env_prefix))
        print(f"Created endpoint {record['name']} ({record['id']}); its access token is in "
              f"${args.env_prefix}TOKEN, shown nowhere else.", file=sys.stderr)  # fmt: skip
    elif args.json:
        _print_json(record)
    else:
        _print_detail(record)
        print()
        print("Access token (shown only this once; keep it secret):")
        print(f"  {token}")
        print()
        print("Use it from this shell:")
        print(f"  {export_line(record['url'], token, args.env_prefix)}")
        print()
        print("Try it:")
        print(f"  {try_it_command(record, args.env_prefix)}")
    if not args.wait:
        return 0
    if record["minReplicas"] == 0:
        print(f"--wait: {record['name']} is scaled to zero; its first request starts a replica "
              f"(follow it with `inferd endpoints wait {record['name']}`).",
              file=sys.stderr)  # fmt: skip
        return 0
    sys.stdout.flush()
    return _follow(client, record["id"], record["name"], args.max_wait)


def _wait(client: ManagementClient, args: argparse.Namespace) -> int:
    endpoint_id = client.resolve(args.endpoint, args.project)
    return _follow(client, endpoint_id, args.endpoint, args.max_wait)


def _follow(client: ManagementClient, endpoint_id: str, name: str, max_wait_s: float) -> int:
    from inferd.client.wait import Progress, wait_until_ready

    progress = Progress(sys.stderr, name)
    stage, elapsed = wait_until_ready(
        lambda: client.get_endpoint(endpoint_id), progress, max_wait_s=max_wait_s
    )
    if stage.done:
        print(f"{name} is ready ({elapsed:.0f} s).", file=sys.stderr)
        return 0
    if stage.final:
        print(f"error: {name} is {stage.name}: {stage.detail}", file=sys.stderr)
    else:
        print(f"error: {name} is not ready after {elapsed:.0f} s ({stage.name}); "
              f"`inferd endpoints get {name}` shows why", file=sys.stderr)  # fmt: skip
    return 1


def _env(client: ManagementClient, args: argparse.Namespace) -> int:
    endpoint_id = client.resolve(args.endpoint, args.project)
    record = client.get_endpoint(endpoint_id)
    token = client.new_access_token(endpoint_id) if args.new_token else None
    print(export_line(record["url"], token, args.env_prefix))
    return 0


def _env_names(prefix: str) -> tuple[str, str]:
    return f"{prefix}URL", f"{prefix}TOKEN"


def export_line(url: str, token: str | None, prefix: str = "") -> str:
    """`export URL=... TOKEN=...` under `prefix`, for a shell to paste or eval."""
    url_name, token_name = _env_names(prefix)
    line = f"export {url_name}={shlex.quote(url)}"
    return line if token is None else f"{line} {token_name}={shlex.quote(token)}"


def try_it_command(record: Mapping[str, Any], prefix: str = "") -> str:
    """The record's example with the variables exported just above (the
    token itself stays out of the shell's history)."""
    example: str = record["exampleCommand"]
    url_name, token_name = _env_names(prefix)
    return example.replace(record["url"], f"${url_name}").replace(
        "<ACCESS_TOKEN>", f"${token_name}"
    )


def _list(client: ManagementClient, args: argparse.Namespace) -> int:
    query = {"projectId": args.project, "status": args.status, "modelName": args.model,
             "locationName": args.location, "namePrefix": args.name_prefix}  # fmt: skip
    records, cursor = list_pages(client, "/endpoints", query, args)
    if args.json:
        _print_json({"data": records, **({"continue": cursor} if cursor else {})})
    else:
        print(format_table(records))
        more_hint(cursor)
    return 0


def _get(client: ManagementClient, args: argparse.Namespace) -> int:
    record = client.get_endpoint(client.resolve(args.endpoint, args.project))
    if args.json:
        _print_json(record)
    else:
        _print_detail(record)
        print(f"{'exampleCommand':<34} {record['exampleCommand']}")
    return 0


def _update(client: ManagementClient, args: argparse.Namespace) -> int:
    endpoint_id = client.resolve(args.endpoint, args.project)
    record = client.update_endpoint(endpoint_id, _scaling_body(args))
    if args.json:
        _print_json(record)
    else:
        _print_detail(record)
    return 0


def _delete(client: ManagementClient, args: argparse.Namespace) -> int:
    endpoint_id = client.resolve(args.endpoint, args.project)
    client.delete_endpoint(endpoint_id)
    if args.json:
        _print_json({"id": endpoint_id, "deleted": True})
    else:
        print(f"Deleted endpoint {endpoint_id}.")
    return 0


def _token(client: ManagementClient, args: argparse.Namespace) -> int:
    endpoint_id = client.resolve(args.endpoint, args.project)
    token = client.new_access_token(endpoint_id)
    if args.json:
        _print_json({"id": endpoint_id, "accessToken": token})
    else:
        print("New access token (shown only this once; the previous token no longer works):")
        print(f"  {token}")
    return 0


def _bench(client: ManagementClient, args: argparse.Namespace) -> int:
    from inferd.client.bench import BenchError, BenchPlan, profile_body, run_bench

    token = args.token or os.environ.get("INFERD_TOKEN")
    if not token:
        print("error: pass --token or set INFERD_TOKEN (the endpoint's access token)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        levels = tuple(int(c) for c in args.concurrency.split(","))
    except ValueError:
        print(f"error: --concurrency {args.concurrency!r}: integers, comma-separated",
              file=sys.stderr)  # fmt: skip
        return 2
    if not levels or min(levels) < 1 or args.requests < 1:
        print("error: concurrencies and --requests must be at least 1", file=sys.stderr)
        return 2
    record = client.get_endpoint(client.resolve(args.endpoint))
    context = client.get_model(record["modelName"])["architecture"].get("contextLength")
    if context and args.prompt_tokens + args.output_tokens > context:
        print(f"error: --prompt-tokens {args.prompt_tokens} + --output-tokens "
              f"{args.output_tokens} exceed {record['modelName']}'s context of {context} "
              "tokens", file=sys.stderr)  # fmt: skip
        return 2
    plan = BenchPlan(
        concurrencies=levels,
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        image_size=args.image_size,
        timeout_s=max(args.timeout, 60.0),
    )

    def progress(concurrency: int, point: ProfilePoint | None) -> None:
        # Each level as it ends (a level can take minutes): on stderr, so
        # that --json output stays one document.
        if point is None:
            print(f"concurrency {concurrency}: {plan.requests} requests ...", file=sys.stderr,
                  flush=True)  # fmt: skip
        else:
            print(f"concurrency {concurrency}: {_point_text(point)}", file=sys.stderr, flush=True)

    try:
        points = run_bench(record, token, plan, progress)
    except (BenchError, httpx.HTTPError) as exc:
        print(f"error: benchmark request failed: {exc}", file=sys.stderr)
        return 1
    body = profile_body(record, plan, points)
    if not args.no_record:
        body = client.record_profile(record["modelName"], body)
    if args.json:
        _print_json(body)
        return 0
    print(f"{record['modelName']} on {record['gpuCount']} x {record['gpuType']} "
          f"({record['name']}):")  # fmt: skip
    for p in points:
        print(f"  concurrency {p.concurrency:>3}: {_point_text(p)}")
    if not args.no_record:
        print("Recorded: recommendations for this model now use it on this GPU type and count.")
    return 0


def _point_text(p: ProfilePoint) -> str:
    if p.images_per_s:
        return (f"{p.images_per_s * 60:8.2f} images/min, p95 {p.seconds_per_image_p95:.2f} "
                f"s/image ({p.requests} requests)")  # fmt: skip
    return (f"{p.output_tokens_per_s:8.1f} tokens/s, TTFT p95 {p.ttft_p95_s * 1000:.0f} ms, "
            f"TPOT p95 {p.tpot_p95_s * 1000:.1f} ms ({p.requests} requests)")  # fmt: skip


Action = Callable[[ManagementClient, argparse.Namespace], int]


def command(action: Action) -> Callable[[argparse.Namespace], int]:
    """The argparse `func`: build the client, run the action, report API errors."""

    def run(args: argparse.Namespace) -> int:
        try:
            with client_from_args(args) as client:
                return action(client, args)
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr)
            if exc.status == 401 and not key_from(args, os.environ):
                print(
                    "hint: pass --key or set INFERD_API_KEY (your management key) or "
                    "INFERD_ADMIN_KEY (the operator key printed by the first `inferd serve`)",
                    file=sys.stderr,
                )
            return 1

    run.__name__ = action.__name__
    return run


# --- formatting ----------------------------------------------------------------------


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _cell(record: Mapping[str, Any], key: str) -> str:
    if key == "_gpu":
        return f"{record['gpuCount']} x {record['gpuType']}"
    if key == "_replicas":
        return f"{record['currentReplicas']} ({record['minReplicas']}-{record['maxReplicas']})"
    if key == "_price":
        return f"{record['hourlyPrice']:.2f} {record.get('currency', '')}".strip()
    value = record.get(key)
    return "" if value is None else str(value)


def _replica_line(replica: Mapping[str, Any], gpu_type: str) -> str:
    """`loading since 07:21:04Z (12 s), vllm, cpu: loading the model` - the
    status, since when, the engine and what it is doing."""
    gpus = replica["gpus"]
    hardware = "cpu" if gpu_type == "cpu" else f"{gpus} GPU{'' if gpus == 1 else 's'}"
    parts = [replica["status"]]
    since = replica.get("since")
    if since:
        parts.append(f"since {since}{_ago(since)}")
    details = [d for d in (replica.get("engine"), hardware) if d]
    line = f"{' '.join(parts)} ({', '.join(details)})"
    if replica.get("statusReason"):
        line += f": {replica['statusReason']}"
    return line


def _ago(since: str) -> str:
    try:
        then = datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return ""
    seconds = max(0, int((datetime.now(UTC) - then).total_seconds()))
    if seconds < 60:
        return f" ({seconds} s ago)"
    return f" ({seconds // 60} min {seconds % 60} s ago)"


def format_table(records: Sequence[Mapping[str, Any]]) -> str:
    if not records:
        return "No endpoints."
    rows = [[title for title, _ in LIST_COLUMNS]]
    rows += [[_cell(r, key) for _, key in LIST_COLUMNS] for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(LIST_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _print_detail(record: Mapping[str, Any]) -> None:
    currency = record.get("currency", "")
    for key in DETAIL_FIELDS:
        value = record.get(key)
        if key in ("hourlyPrice", "costSoFar") and value is not None:
            value = f"{value:.2f} {currency}".strip()
        if key == "costSoFar":
            value = f"{value} (this month)"
        if key == "statusReason" and value is None:
            continue
        if key == "engineSettings":
            value = json.dumps(value, separators=(", ", ": ")) if value else "server defaults"
        print(f"{key:<34} {'-' if value is None else value}")
    replicas = record.get("replicas") or []
    if not replicas:
        print(f"{'replicas':<34} none")
    for index, replica in enumerate(replicas):
        print(f"{'replicas' if index == 0 else '':<34} {_replica_line(replica, record['gpuType'])}")
