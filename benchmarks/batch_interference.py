"""Interactive latency with and without a batch running on the same endpoint.

    .venv/bin/python benchmarks/batch_interference.py [--duration-s 20 --rate 10
        --batch-requests 2000 --in-flight 4 --reserved-shares 0,0.25,0.5]

One `inferd serve` (a real process) with a chat endpoint of tiny-chat on the
FAKE engine (`--engine fake`, 10 ms a token: the gateway, hold and batch
runner are real, the model is not), one replica, whose in-flight bound
(`gateway_max_in_flight_per_replica`) is set to `--in-flight` so that the
endpoint has a known capacity: in-flight / request time. Interactive load is
an open loop at `--rate` requests a second (about half that capacity by
default), 16 tokens each, for `--duration-s`: first alone, then while a
batch of `--batch-requests` requests of the same shape runs (created just
before the second phase). Figures: interactive p50/p99/max latency in each
phase, and the batch's requests finished during the second phase.
Goal (the issue's): interactive p99 with the batch within 1.2x of without.

The whole is run once per `--reserved-shares` value (each a fresh server
with `gateway_batch_reserved_share` set to it: the share of the replica's
slots that batch requests leave free for interactive ones; 0 is the gateway
before that rule, batch requests filling every slot), side by side in one
table. The goal is judged for each share.

The batch goes at the lowest priority only where the gateway's hold applies
it (`inferd.priority` on the scope, `x-inferd-priority`): this benchmark
measures whatever the tree it runs from does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import load_average, percentile, print_table, write_report
from results_format import goal, table

from inferd.gateway.settings import GatewaySettings
from inferd.testing import ServeHandle, open_loop

TOKEN_DELAY_S = 0.01
MAX_TOKENS = 16


def chat(n: int) -> dict[str, Any]:
    return {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": f"question {n}"}],
        "max_tokens": MAX_TOKENS,
    }


def batch_file(n: int) -> bytes:
    rows = (
        {"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat(i)}
        for i in range(n)
    )
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def latency_row(phase: str, results: list[tuple[float, int, float]]) -> dict[str, Any]:
    ok = [latency for _, status, latency in results if status == 200]
    return {
        "phase": phase,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "p50_ms": _ms(percentile(ok, 50)),
        "p99_ms": _ms(percentile(ok, 99)),
        "max_ms": _ms(max(ok) if ok else None),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def finished(client: httpx.Client, base: str, batch_id: str) -> int:
    counts = client.get(f"{base}/batches/{batch_id}").json()["request_counts"]
    return int(counts["completed"]) + int(counts["failed"])


def run_once(args: argparse.Namespace, share: float) -> tuple[list[Any], list[Any], float]:
    """Interactive latency alone, then beside a batch, on a fresh server
    whose batch requests leave `share` of the replica's slots free."""
    serve = ServeHandle(
        Path(tempfile.mkdtemp(prefix="inferd-batch-bench-")),
        settings={
            "replica_args": f"--engine fake --engine-arg token_delay_s={TOKEN_DELAY_S} --no-warmup",
            "gateway_max_in_flight_per_replica": str(args.in_flight),
            "gateway_batch_reserved_share": str(share),
            "batch_concurrency": str(args.batch_concurrency),
        },
    ).start()
    try:
        record = serve.create_endpoint(
            name="bench", modelName="tiny-chat", minReplicas=1, maxReplicas=1
        )
        serve.wait_record(record["id"], lambda r: r["status"] == "running", timeout=120)
        url, token = record["url"], record["accessToken"]
        target = f"{url}/openai/v1/chat/completions"
        asyncio.run(open_loop([target], token, chat(0), rate=args.rate, duration=3))  # warm
        alone = asyncio.run(
            open_loop([target], token, chat(0), rate=args.rate, duration=args.duration_s)
        )
        base = f"{url}/openai/v1"
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            uploaded = client.post(
                f"{base}/files",
                files={"file": ("b.jsonl", batch_file(args.batch_requests))},
                data={"purpose": "batch"},
            ).json()
            batch = client.post(
                f"{base}/batches",
                json={
                    "input_file_id": uploaded["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            ).json()
            time.sleep(2)  # the batch is running before the interactive load starts
            before = finished(client, base, batch["id"])
            started = time.monotonic()
            beside = asyncio.run(
                open_loop([target], token, chat(0), rate=args.rate, duration=args.duration_s)
            )
            batch_done = finished(client, base, batch["id"]) - before
            batch_rate = batch_done / (time.monotonic() - started)
            client.post(f"{base}/batches/{batch['id']}/cancel")
    finally:
        serve.stop()
        serve.cleanup()
    return alone, beside, batch_rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=10.0, help="interactive requests/s")
    parser.add_argument("--batch-requests", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=4, help="the replica's in-flight bound")
    parser.add_argument("--batch-concurrency", type=int, default=8)
    parser.add_argument(
        "--reserved-shares",
        default="0,0.25,0.5",
        help="gateway_batch_reserved_share values, each run in turn (comma-separated)",
    )
    args = parser.parse_args()
    shares = [float(x) for x in args.reserved_shares.split(",")]
    default = GatewaySettings().batch_reserved_share

    rows, batch_rows, ratios = [], [], {}
    for share in shares:
        alone, beside, batch_rate = run_once(args, share)
        pair = [latency_row("interactive alone", alone), latency_row("interactive + batch", beside)]
        for row in pair:
            row["reserved_share"] = share
        rows += pair
        p99_alone, p99_beside = pair[0]["p99_ms"], pair[1]["p99_ms"]
        ratios[share] = (
            None if not p99_alone or p99_beside is None else round(p99_beside / p99_alone, 2)
        )
        batch_rows.append(
            {
                "reserved_share": share,
                "p99_ratio": ratios[share],
                "requests_per_s_beside_interactive": round(batch_rate, 1),
                "endpoint_capacity_per_s": round(capacity_of(args), 1),
            }
        )
    capacity = capacity_of(args)
    columns = ["reserved_share", "phase", "requests", "errors", "p50_ms", "p99_ms", "max_ms"]
    print_table("Interactive latency (fake engine)", rows, columns)
    batch_columns = ["reserved_share", "p99_ratio", "requests_per_s_beside_interactive",
                     "endpoint_capacity_per_s"]  # fmt: skip
    print_table("Batch", batch_rows, batch_columns)
    print(load_average())
    write_report(
        "batch_interference",
        {
            "title": "Batch API: interactive latency beside a running batch (fake engine)",
            "workload": f"tiny-chat on the fake engine ({TOKEN_DELAY_S * 1000:.0f} ms/token, "
            f"{MAX_TOKENS} tokens), 1 replica bound to {args.in_flight} in flight "
            f"(capacity ~{capacity:.0f} req/s); interactive open loop {args.rate}/s for "
            f"{args.duration_s} s per phase; batch of {args.batch_requests}, "
            f"concurrency {args.batch_concurrency}; once per reserved share "
            f"({args.reserved_shares}; 0: batch requests may fill every slot, as before the "
            f"rule; the default is {default})",
            "tables": [
                table("Interactive latency", columns, rows),
                table("Batch beside the interactive load", batch_columns, batch_rows),
            ],
            "goals": [
                goal(
                    f"interactive p99 with a batch running / without (reserved share {share}"
                    + (", the default)" if share == default else ")"),
                    "<= 1.2x",
                    r,
                    None if r is None else r <= 1.2,
                    ""
                    if r is None or r <= 1.2
                    else "batch requests fill every slot: an interactive request waits for one "
                    "to end"
                    if share == 0
                    else "interactive requests arriving together past the reserved slots wait "
                    "for a slot to end; on 2 shared cores the batch's CPU also slows them",
                )
                for share, r in ratios.items()
            ],
            "notes": [
                "Fake engine: the gateway, its hold queue and the batch runner are real; the "
                "model is not, so the figures measure queueing, not inference (but the server, "
                "the replica and the load generator share the machine's CPUs).",
                f"Scaled down to the shared machine: phases of {args.duration_s} s (the batch "
                "runs through the second and is cancelled after it, unfinished); one p99 is "
                f"about the second-worst of {int(args.rate * args.duration_s)} requests, so it "
                "moves from run to run.",
            ],
        },
    )


def capacity_of(args: argparse.Namespace) -> float:
    return float(args.in_flight / (MAX_TOKENS * TOKEN_DELAY_S))


if __name__ == "__main__":
    main()
