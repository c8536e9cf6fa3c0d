"""`inferd replica`: run one replica process (also `python -m inferd.replica`)."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferd.engines.base import EngineOptions
from inferd.engines.factory import ENGINE_NAMES
from inferd.http import DEFAULT_MAX_BODY_BYTES
from inferd.vocab import ModelKind

if TYPE_CHECKING:
    from inferd.replica.config import ReplicaConfig

# Mirrors inferd.replica.config (imported lazily: the CLI's import stays light).
_SECRET_ENV = "INFERD_REPLICA_SECRET"
_DEFAULT_DRAIN_TIMEOUT_S = 30.0


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
    parser.add_argument(
        "--model-source",
        default=None,
        help="the resolved model (HF repo id, builtin:NAME or a directory); with "
        "--model-kind, the catalog is not read",
    )
    parser.add_argument("--model-kind", choices=[k.value for k in ModelKind], default=None)
    parser.add_argument(
        "--serving-defaults", default=None, help="the catalog's serving defaults (JSON object)"
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
    parser.add_argument(
        "--advertise-host", default=None, help="address reported to the registry (default: --host)"
    )
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
    parser.add_argument("--drain-timeout", type=float, default=_DEFAULT_DRAIN_TIMEOUT_S)
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


def config_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ReplicaConfig:
    from inferd.replica.config import ReplicaConfig, serving_from_json

    env = os.environ if env is None else env
    gpu_ids = tuple(int(g) for g in args.gpus.split(",") if g.strip())
    try:
        serving = serving_from_json(args.serving_defaults)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--serving-defaults: {exc}") from None
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
            serving=serving,
            extra=parse_engine_args(args.engine_arg),
        ),
        model_source=args.model_source,
        model_kind=None if args.model_kind is None else ModelKind(args.model_kind),
        host=args.host,
        advertise_host=args.advertise_host,
        port=args.port,
        port_file=args.port_file,
        registry_url=args.registry_url,
        registry_fallback_urls=tuple(args.registry_fallback_url),
        replica_id=args.replica_id,
        endpoint_id=args.endpoint_id,
        # Secrets travel by environment, never on a command line that `ps` shows.
        secret=env.get(_SECRET_ENV),
        report_interval=args.report_interval,
        orphan_timeout=args.orphan_timeout,
        drain_timeout=args.drain_timeout,
        max_body_bytes=args.max_body_bytes,
        warmup=not args.no_warmup,
        models_dir=args.models_dir,
        cache_dir=args.cache_dir,
        log_level=args.log_level,
    )


def config_from_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ReplicaConfig:
    parser = argparse.ArgumentParser(prog="python -m inferd.replica")
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)), env)


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
