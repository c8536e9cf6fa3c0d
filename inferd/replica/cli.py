"""`inferd replica`: run one replica process (also `python -m inferd.replica`)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from inferd.engines.base import EngineOptions
from inferd.engines.factory import ENGINE_NAMES
from inferd.http import DEFAULT_MAX_BODY_BYTES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="catalog name, local directory or HF repo id"
    )
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        help="name clients use in 'model' (repeatable; the first is reported back)",
    )
    parser.add_argument("--engine", choices=ENGINE_NAMES, default="auto")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific option; VALUE is parsed as JSON when it can be",
    )
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--gpus", default="", help="comma-separated GPU indices for this replica")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--cpu-kv-cache-gib", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--optimize", action="store_true", help="engine's fastest settings")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, default=None, help="write the bound port here")
    parser.add_argument("--registry-url", default=None)
    parser.add_argument(
        "--registry-fallback-url",
        action="append",
        default=[],
        help="where to report when the registry URL cannot be reached (repeatable)",
    )
    parser.add_argument("--replica-id", default="")
    parser.add_argument("--endpoint-id", default=None)
    parser.add_argument("--report-interval", type=float, default=2.0)
    parser.add_argument(
        "--orphan-timeout",
        type=float,
        default=None,
        help="drain and exit when the registry is unreachable this long (seconds)",
    )
    parser.add_argument("--drain-timeout", type=float, default=60.0)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--log-level", default="info")


def parse_engine_args(items: list[str]) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--engine-arg needs KEY=VALUE, got {item!r}")
        try:
            extra[key] = json.loads(value)
        except json.JSONDecodeError:
            extra[key] = value
    return extra


def config_from_args(args: argparse.Namespace) -> Any:
    from inferd.replica.server import ReplicaConfig

    gpu_ids = tuple(int(g) for g in args.gpus.split(",") if g.strip())
    return ReplicaConfig(
        model=args.model,
        served_names=tuple(args.served_model_name),
        engine=EngineOptions(
            engine=args.engine,
            device=args.device,
            gpu_ids=gpu_ids,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            cpu_kv_cache_gib=args.cpu_kv_cache_gib,
            gpu_memory_utilization=args.gpu_memory_utilization,
            optimize=args.optimize,
            extra=parse_engine_args(args.engine_arg),
        ),
        host=args.host,
        port=args.port,
        port_file=args.port_file,
        registry_url=args.registry_url,
        registry_fallback_urls=tuple(args.registry_fallback_url),
        replica_id=args.replica_id,
        endpoint_id=args.endpoint_id,
        # Secrets travel by environment, never on a command line that `ps` shows.
        secret=os.environ.get("INFERD_REPLICA_SECRET"),
        report_interval=args.report_interval,
        orphan_timeout=args.orphan_timeout,
        drain_timeout=args.drain_timeout,
        max_body_bytes=args.max_body_bytes,
        warmup=not args.no_warmup,
        models_dir=args.models_dir,
        cache_dir=args.cache_dir,
        log_level=args.log_level,
    )


def run(args: argparse.Namespace) -> int:
    from inferd.replica.server import run_replica

    return run_replica(config_from_args(args))


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    parser = subparsers.add_parser("replica", help="run one replica: load a model and serve it")
    add_arguments(parser)
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.replica")
    add_arguments(parser)
    return run(parser.parse_args(argv))
