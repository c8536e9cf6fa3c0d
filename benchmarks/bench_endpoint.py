"""Measure a live endpoint at a few concurrencies and record its profile.

The script form of `inferd bench`: the same bounded load (each level stops
after `--requests` requests), printed as a table and written as JSON, and,
unless `--no-record`, posted to the server as the profile of the endpoint's
model on its GPU type and count, so that recommendations say "measured on"
instead of "estimated". Its reference is the recommender's own estimate for
the same model, GPU and lengths, printed beside each level.

    .venv/bin/python benchmarks/bench_endpoint.py ENDPOINT --api-url URL \
        --admin-key KEY --token TOKEN [--concurrency 1,4,16] [--requests 32]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from common import load_average, print_table, write_report

from inferd.catalog import load_catalog
from inferd.catalog.workload import ChatWorkload, chat_performance
from inferd.client.api import ManagementClient
from inferd.client.bench import BenchPlan, profile_body, run_bench


def estimate_row(record: dict[str, Any], plan: BenchPlan, concurrency: int) -> float | None:
    """The roofline's output tokens/s for the same setting (catalog models only)."""
    catalog = load_catalog()
    if record["modelName"] not in catalog.models or record["gpuType"] not in catalog.gpus.gpu_types:
        return None
    model = catalog.models.get(record["modelName"])
    if model.kind != "chat":
        return None
    gpu = catalog.gpus.gpu_types[record["gpuType"]]
    work = ChatWorkload(1, plan.prompt_tokens, plan.output_tokens)
    return chat_performance(model, gpu, record["gpuCount"], concurrency, work).throughput


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoint", metavar="ID_OR_NAME")
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--admin-key", required=True)
    parser.add_argument("--token", required=True, help="the endpoint's access token")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    plan = BenchPlan(
        concurrencies=tuple(int(c) for c in args.concurrency.split(",")),
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
    )
    with ManagementClient(args.api_url, args.admin_key, timeout=60) as client:
        record = client.get_endpoint(client.resolve(args.endpoint))
        points = run_bench(record, args.token, plan)
        body = profile_body(record, plan, points)
        if not args.no_record:
            client.record_profile(record["modelName"], body)
    rows = [
        {**p.to_dict(), "estimatedTokensPerS": estimate_row(record, plan, p.concurrency)}
        for p in points
    ]
    columns = ["concurrency", "requests", "outputTokensPerS", "estimatedTokensPerS",
               "ttftP95S", "tpotP95S", "imagesPerS", "secondsPerImageP95"]  # fmt: skip
    title = f"{record['modelName']} on {record['gpuCount']} x {record['gpuType']}"
    print_table(title, rows, columns)
    print(load_average())
    report = {"endpoint": record["name"], "profile": body, "rows": rows}
    write_report("bench_endpoint", report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
