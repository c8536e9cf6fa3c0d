"""`inferd batches create|list|get|cancel|results`: the Batch API of one
endpoint from a shell, with its token (as the `openai` client uses it).

The endpoint's URL and token come from `--url`/`--token`, else from the
variables `inferd endpoints create --env` exports (`$URL`, `$TOKEN`, or
`$INFERD_URL`, `$INFERD_TOKEN`). `--wait` and `--watch` draw a progress bar
until the batch ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from inferd.client.api import ApiError

FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
BAR_WIDTH = 30


class BatchClient:
    def __init__(self, url: str, token: str, *, timeout: float = 60.0) -> None:
        self.base = url.rstrip("/") + "/openai/v1"
        self._http = httpx.Client(
            base_url=self.base, timeout=timeout, headers={"Authorization": f"Bearer {token}"}
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the endpoint at {self.base}: {exc}") from None
        if resp.is_success:
            return resp
        try:
            err = resp.json().get("error")
        except (ValueError, AttributeError):
            err = None
        if isinstance(err, dict):
            raise ApiError(str(err.get("message")), status=resp.status_code,
                           param=err.get("param"), code=err.get("code"))  # fmt: skip
        raise ApiError(f"unexpected answer: {resp.text[:200]}", status=resp.status_code)

    def upload(self, path: Path) -> dict[str, Any]:
        with path.open("rb") as content:
            files = {"file": (path.name, content, "application/jsonl")}
            result: dict[str, Any] = self._call(
                "POST", "/files", files=files, data={"purpose": "batch"}
            ).json()
        return result

    def create(
        self,
        file_id: str,
        endpoint: str,
        metadata: Mapping[str, str],
        capacity: str | None = None,
    ) -> dict[str, Any]:
        """`capacity`: inferd's field (None: the server's default, `wake`)."""
        body: dict[str, Any] = {
            "input_file_id": file_id,
            "endpoint": endpoint,
            "completion_window": "24h",
        }
        if metadata:
            body["metadata"] = dict(metadata)
        if capacity is not None:
            body["capacity"] = capacity
        result: dict[str, Any] = self._call("POST", "/batches", json=body).json()
        return result

    def get(self, batch_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/batches/{batch_id}").json()
        return result

    def list(self, limit: int) -> list[dict[str, Any]]:
        return list(self._call("GET", "/batches", params={"limit": limit}).json()["data"])

    def cancel(self, batch_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/batches/{batch_id}/cancel").json()
        return result

    def content(self, file_id: str) -> bytes:
        return self._call("GET", f"/files/{file_id}/content").content


def progress_line(batch: Mapping[str, Any], now: float, width: int = BAR_WIDTH) -> str:
    """`[#########.....]  45/100 done, 2 failed, in_progress, ~30 s left`."""
    counts = batch.get("request_counts") or {}
    total = int(counts.get("total") or 0)
    done, failed = int(counts.get("completed") or 0), int(counts.get("failed") or 0)
    share = (done + failed) / total if total else 0.0
    filled = round(share * width)
    line = f"[{'#' * filled}{'.' * (width - filled)}] {done + failed:>{len(str(total))}}/{total}"
    line += f" done ({failed} failed), {batch.get('status')}"
    estimate = batch.get("estimated_completion_at")
    if batch.get("status") not in FINAL and estimate:
        line += f", ~{max(0, round(estimate - now))} s left"
    return line


def watch(
    client: BatchClient,
    batch_id: str,
    out: Any = sys.stderr,
    interval: float = 1.0,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """Draw the batch's progress until it ends; the batch as it ended."""
    redraw = getattr(out, "isatty", lambda: False)()
    last = ""
    while True:
        batch = client.get(batch_id)
        line = progress_line(batch, clock())
        if line != last:
            out.write(("\r" + line) if redraw else (line + "\n"))
            out.flush()
            last = line
        if batch["status"] in FINAL:
            if redraw:
                out.write("\n")
            return batch
        sleep(interval)


def _when(epoch: int | None) -> str:
    if not epoch:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _show(batch: Mapping[str, Any]) -> None:
    counts = batch.get("request_counts") or {}
    usage = batch.get("usage") or {}
    rows = [
        ("id", batch["id"]),
        ("status", batch["status"]),
        ("endpoint", batch["endpoint"]),
        ("capacity", batch.get("capacity", "-")),
        ("requests", f"{counts.get('total')} total, {counts.get('completed')} completed, "
                     f"{counts.get('failed')} failed"),
        ("tokens", f"{usage.get('input_tokens', 0)} in, {usage.get('output_tokens', 0)} out"),
        ("cost", batch.get("cost")),
        ("created", _when(batch.get("created_at"))),
        ("expires", _when(batch.get("expires_at"))),
        ("estimated end", _when(batch.get("estimated_completion_at"))),
        ("input file", batch["input_file_id"]),
        ("output file", batch.get("output_file_id") or "-"),
        ("error file", batch.get("error_file_id") or "-"),
    ]  # fmt: skip
    for name, value in rows:
        print(f"{name + ':':<15} {value}")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser(
        "batches", help="run files of requests on an endpoint's idle capacity (Batch API)"
    )
    sub = parser.add_subparsers(dest="batches_command", metavar="ACTION", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="the endpoint's URL (default: $INFERD_URL, else $URL)")
    common.add_argument(
        "--token", help="the endpoint's access token (default: $INFERD_TOKEN, else $TOKEN)"
    )
    common.add_argument("--json", action="store_true", help="print JSON")

    create = sub.add_parser("create", parents=[common], help="upload a JSONL file and run it")
    create.add_argument("file", type=Path, help="JSONL, one request a line (OpenAI's shape)")
    create.add_argument(
        "--endpoint",
        default="/v1/chat/completions",
        choices=["/v1/chat/completions", "/v1/completions", "/v1/embeddings"],
        help="the route every line is for",
    )
    create.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    create.add_argument(
        "--capacity",
        choices=["wake", "running"],
        help="wake (default): the batch may wake the endpoint at zero and keep a replica up "
        "while it runs; running: it runs only while a replica is up for other reasons",
    )
    create.add_argument("--wait", action="store_true", help="show progress until it ends")
    create.set_defaults(func=_command(_create))

    listing = sub.add_parser("list", parents=[common], help="the endpoint's batches, newest first")
    listing.add_argument("--limit", type=int, default=20)
    listing.set_defaults(func=_command(_list))

    get = sub.add_parser("get", parents=[common], help="one batch, with its progress")
    get.add_argument("batch_id")
    get.add_argument("--watch", action="store_true", help="show progress until it ends")
    get.set_defaults(func=_command(_get))

    cancel = sub.add_parser("cancel", parents=[common], help="stop a batch; keep its results")
    cancel.add_argument("batch_id")
    cancel.set_defaults(func=_command(_cancel))

    results = sub.add_parser("results", parents=[common], help="print a batch's output file")
    results.add_argument("batch_id")
    results.add_argument("--errors", action="store_true", help="the error file instead")
    results.add_argument("-o", "--output", type=Path, help="write to this file")
    results.set_defaults(func=_command(_results))


Action = Callable[[BatchClient, argparse.Namespace], int]


def _command(action: Action) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        env = os.environ
        url = args.url or env.get("INFERD_URL") or env.get("URL")
        token = args.token or env.get("INFERD_TOKEN") or env.get("TOKEN")
        if not url or not token:
            print("error: pass --url and --token, or set URL and TOKEN (`eval \"$(inferd "
                  "endpoints create ... --env)\"` exports them)", file=sys.stderr)  # fmt: skip
            return 2
        client = BatchClient(url, token)
        try:
            return action(client, args)
        except ApiError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()

    run.__name__ = action.__name__
    return run


def _create(client: BatchClient, args: argparse.Namespace) -> int:
    metadata = {}
    for pair in args.metadata:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"error: --metadata {pair!r}: KEY=VALUE", file=sys.stderr)
            return 2
        metadata[key] = value
    try:
        uploaded = client.upload(args.file)
    except OSError as exc:
        print(f"error: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    batch = client.create(uploaded["id"], args.endpoint, metadata, args.capacity)
    if args.wait:
        batch = watch(client, batch["id"])
    _print(batch, args)
    return 0 if batch["status"] not in ("failed", "expired") else 1


def _print(batch: Mapping[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(batch, indent=2))
    else:
        _show(batch)


def _list(client: BatchClient, args: argparse.Namespace) -> int:
    batches = client.list(args.limit)
    if args.json:
        print(json.dumps(batches, indent=2))
        return 0
    now = time.time()
    print(f"{'ID':<32} {'CREATED':<19}  PROGRESS")
    for batch in batches:
        print(f"{batch['id']:<32} {_when(batch['created_at']):<19}  "
              f"{progress_line(batch, now, width=20)}")  # fmt: skip
    return 0


def _get(client: BatchClient, args: argparse.Namespace) -> int:
    batch = watch(client, args.batch_id) if args.watch else client.get(args.batch_id)
    if not args.watch and not args.json:
        print(progress_line(batch, time.time()))
    _print(batch, args)
    return 0


def _cancel(client: BatchClient, args: argparse.Namespace) -> int:
    _print(client.cancel(args.batch_id), args)
    return 0


def _results(client: BatchClient, args: argparse.Namespace) -> int:
    batch = client.get(args.batch_id)
    file_id = batch.get("error_file_id" if args.errors else "output_file_id")
    if not file_id:
        which = "error" if args.errors else "output"
        print(f"batch {args.batch_id} has no {which} file ({batch['status']})", file=sys.stderr)
        return 1
    content = client.content(file_id)
    if args.output is not None:
        args.output.write_bytes(content)
    else:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
    return 0
