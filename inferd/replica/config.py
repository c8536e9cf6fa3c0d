"""What a replica is told to be, and the one mapping from a launch request to it.

`ReplicaSpec` is what the control plane decides (which endpoint, which model,
how many GPUs, where to report); `ReplicaSettings` is what every replica of
one control plane shares; `config_for(spec, settings)` is the pure mapping to
the replica's `ReplicaConfig`, and `to_argv(config)` the command line that
starts it. Every launcher (local processes, Ray actors) goes through these
two functions, so a replica is configured the same way wherever it runs.

The spec carries the resolved model (its source, kind and serving defaults):
a replica never reads the model catalog, so a node needs no catalog files.
Secrets never appear in argv: `to_argv` leaves `secret` out, and launchers
pass it in the environment (`SECRET_ENV`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferd.api.engine_settings import NO_ENGINE_SETTINGS, EngineSettings
from inferd.engines.base import EngineOptions, ServingDefaults
from inferd.engines.factory import ENGINE_NAMES
from inferd.http import DEFAULT_MAX_BODY_BYTES
from inferd.http_limits import DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT_S
from inferd.tracing import NO_TRACING, TracingSettings
from inferd.vocab import ModelKind

# Paths a replica answers without the gateway's call key (see replica.auth).
DEFAULT_OPEN_PATHS = ("/health", "/healthz", "/metrics")

if TYPE_CHECKING:
    from inferd.catalog.models import ModelSpec

SECRET_ENV = "INFERD_REPLICA_SECRET"
# Longest a replica drains in-flight work after a stop, unless told otherwise.
DEFAULT_DRAIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ModelSource:
    """A model as the catalog resolved it, before any weights are fetched: the
    replica materialises `source` (builds `builtin:NAME`, finds a local
    directory, or reads the Hugging Face cache) on its own machine."""

    name: str
    kind: ModelKind
    source: str  # HF repo id, builtin:NAME or a directory
    serving: ServingDefaults = field(default_factory=ServingDefaults)


def serving_defaults(spec: ModelSpec | None) -> ServingDefaults:
    """Serving defaults the catalog knows for a model (a chat model's vLLM
    parsers; an image model's steps, guidance and size limits)."""
    if spec is not None and spec.kind == ModelKind.CHAT:
        return ServingDefaults(
            tool_call_parser=spec.tool_call_parser, reasoning_parser=spec.reasoning_parser
        )
    if spec is None or spec.kind != ModelKind.IMAGE:
        return ServingDefaults()
    return ServingDefaults(
        default_steps=spec.default_steps,
        default_guidance_scale=spec.default_guidance_scale,
        max_n=spec.max_n,
        min_side=spec.min_side,
        max_side=spec.max_side,
        default_size=spec.default_size,
    )


def model_source(spec: ModelSpec) -> ModelSource:
    """A catalog entry as the replica needs it."""
    return ModelSource(spec.name, ModelKind(spec.kind), spec.source, serving_defaults(spec))


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica to launch, as the reconciler decides it."""

    replica_id: str
    endpoint_id: str
    model: ModelSource
    gpu_type: str  # "cpu" for a CPU replica
    gpu_count: int
    # The replica authenticates its reports with this, and the gateway
    # authenticates to the replica with it; it travels by environment only.
    secret: str = field(repr=False)
    location: str = "local"
    served_names: tuple[str, ...] = ()
    generation: int = 1
    # The endpoint's engine settings; its draft model (speculative decoding)
    # resolved like `model`, since a replica never reads the catalog.
    engine_settings: EngineSettings = NO_ENGINE_SETTINGS
    draft_model: ModelSource | None = None


@dataclass(frozen=True)
class ReplicaSettings:
    """What every replica of one control plane shares (the launcher section
    of the settings, plus where the registry listens)."""

    registry_url: str
    # Other control-plane instances (or their load balancer), where a
    # replica reports when the instance that launched it is gone.
    registry_fallback_urls: tuple[str, ...] = ()
    report_interval_s: float = 2.0
    orphan_timeout_s: float | None = 60.0
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    log_level: str = "info"
    cache_dir: Path | None = None
    # Extra `inferd replica` flags for every replica (operator's shell syntax),
    # e.g. "--engine fake" or "--cpu-kv-cache-gib 2".
    replica_args: str = ""
    # Where the replicas send request traces (off: nowhere).
    tracing: TracingSettings = NO_TRACING


@dataclass(frozen=True)
class ReplicaConfig:
    model: str
    served_names: tuple[str, ...] = ()
    engine: EngineOptions = field(default_factory=EngineOptions)
    # The resolved model; None: resolve `model` with the catalog (a replica
    # started by hand).
    model_source: str | None = None
    model_kind: ModelKind | None = None
    # Where the draft model of speculative decoding comes from (resolved as
    # `model_source` is); None: the settings name none, or a catalog name.
    draft_model_source: str | None = None
    host: str = "127.0.0.1"
    # Address the replica reports as its URL; None: the bind address.
    advertise_host: str | None = None
    port: int = 0
    port_file: Path | None = None
    registry_url: str | None = None
    # A replica outlives the instance that launched it (the next leader
    # adopts it) and keeps reporting, to these.
    registry_fallback_urls: tuple[str, ...] = ()
    replica_id: str = ""
    endpoint_id: str | None = None
    secret: str | None = field(default=None, repr=False)
    # Paths a replica with a secret answers without its call key (probes,
    # scrapers); every other call must come through the gateway.
    open_paths: tuple[str, ...] = DEFAULT_OPEN_PATHS
    report_interval: float = 2.0
    orphan_timeout: float | None = None
    # Faults injected into the heartbeats (tests of the registry's judgement only).
    report_fault_delay_s: float = 0.0
    report_fault_drop: float = 0.0
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT_S
    # How often a ready replica asks its engine whether it still serves.
    health_interval: float = 1.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    warmup: bool = True
    models_dir: Path | None = None
    cache_dir: Path | None = None
    log_level: str = "info"
    tracing: TracingSettings = NO_TRACING


def config_for(
    spec: ReplicaSpec,
    settings: ReplicaSettings,
    *,
    host: str = "127.0.0.1",
    advertise_host: str | None = None,
    gpu_ids: tuple[int, ...] = (),
) -> ReplicaConfig:
    """The replica's configuration for `spec` (pure: no I/O).

    `host` is where the replica binds and `advertise_host` what it reports
    (a launcher on another machine binds 0.0.0.0 and advertises the node's
    address). `gpu_ids` are the GPU indices as the replica will see them.
    The operator's `replica_args` apply after the control plane's own
    arguments, as they would on a command line, and the endpoint's engine
    settings over both: the server's are the defaults an endpoint overrides.
    """
    device = "cpu" if spec.gpu_type == "cpu" else "cuda"
    base = ReplicaConfig(
        model=spec.model.name,
        served_names=spec.served_names or (spec.model.name,),
        engine=EngineOptions(device=device, gpu_ids=gpu_ids, serving=spec.model.serving),
        model_source=spec.model.source,
        model_kind=spec.model.kind,
        host=host,
        advertise_host=advertise_host,
        registry_url=settings.registry_url,
        registry_fallback_urls=settings.registry_fallback_urls,
        replica_id=spec.replica_id,
        endpoint_id=spec.endpoint_id,
        report_interval=settings.report_interval_s,
        orphan_timeout=settings.orphan_timeout_s,
        drain_timeout=settings.drain_timeout_s,
        cache_dir=settings.cache_dir,
        log_level=settings.log_level,
        tracing=settings.tracing,
    )
    config = config_from_argv(to_argv(base) + shlex.split(settings.replica_args), env={})
    settings_in_force = config.engine.settings.overridden_by(spec.engine_settings)
    engine = replace(config.engine, settings=settings_in_force)
    return replace(
        config,
        engine=engine,
        draft_model_source=None if spec.draft_model is None else spec.draft_model.source,
        secret=spec.secret,
    )


def _serving_json(serving: ServingDefaults) -> str | None:
    given = serving.given()
    return json.dumps(given, sort_keys=True) if given else None


def serving_from_json(text: str | None) -> ServingDefaults:
    if not text:
        return ServingDefaults()
    data = json.loads(text)
    if not isinstance(data, Mapping):
        raise ValueError("--serving-defaults must be a JSON object")
    if "default_size" in data and data["default_size"] is not None:
        data = {**data, "default_size": tuple(data["default_size"])}
    return ServingDefaults(**data)


def to_argv(config: ReplicaConfig) -> list[str]:
    """`inferd replica` arguments that give back `config` (less its secret)."""
    e = config.engine
    argv = ["--model", config.model]
    for name in config.served_names:
        argv += ["--served-model-name", name]
    if config.model_source is not None:
        argv += ["--model-source", config.model_source]
    if config.model_kind is not None:
        argv += ["--model-kind", config.model_kind.value]
    serving = _serving_json(e.serving)
    if serving is not None:
        argv += ["--serving-defaults", serving]
    argv += ["--engine", e.engine, "--device", e.device, "--dtype", e.dtype]
    if e.gpu_ids:
        argv += ["--gpus", ",".join(str(i) for i in e.gpu_ids)]
    if e.max_model_len is not None:
        argv += ["--max-model-len", str(e.max_model_len)]
    argv += ["--cpu-kv-cache-gib", str(e.cpu_kv_cache_gib)]
    argv += ["--gpu-memory-utilization", str(e.gpu_memory_utilization)]
    if e.optimize:
        argv.append("--optimize")
    for key, value in e.extra.items():
        argv += ["--engine-arg", f"{key}={json.dumps(value)}"]
    if not e.settings.is_empty():
        # One typed document, not a flag per setting: the replica validates
        # it with the same model the API did.
        argv += ["--engine-settings", e.settings.to_json()]
    if config.draft_model_source is not None:
        argv += ["--draft-model-source", config.draft_model_source]
    argv += ["--host", config.host, "--port", str(config.port)]
    if config.advertise_host is not None:
        argv += ["--advertise-host", config.advertise_host]
    if config.port_file is not None:
        argv += ["--port-file", str(config.port_file)]
    if config.registry_url is not None:
        argv += ["--registry-url", config.registry_url]
    for url in config.registry_fallback_urls:
        argv += ["--registry-fallback-url", url]
    argv += ["--replica-id", config.replica_id]
    if config.endpoint_id is not None:
        argv += ["--endpoint-id", config.endpoint_id]
    if config.open_paths != DEFAULT_OPEN_PATHS:
        argv += ["--open-paths", ",".join(config.open_paths)]
    argv += ["--report-interval", str(config.report_interval)]
    if config.orphan_timeout is not None:
        argv += ["--orphan-timeout", str(config.orphan_timeout)]
    if config.report_fault_delay_s:
        argv += ["--report-fault-delay-s", str(config.report_fault_delay_s)]
    if config.report_fault_drop:
        argv += ["--report-fault-drop", str(config.report_fault_drop)]
    argv += ["--drain-timeout", str(config.drain_timeout)]
    argv += ["--health-interval", str(config.health_interval)]
    argv += ["--max-body-bytes", str(config.max_body_bytes)]
    argv += ["--request-timeout", str(config.request_timeout)]
    argv += ["--max-connections", str(config.max_connections)]
    if not config.warmup:
        argv.append("--no-warmup")
    if config.models_dir is not None:
        argv += ["--models-dir", str(config.models_dir)]
    if config.cache_dir is not None:
        argv += ["--cache-dir", str(config.cache_dir)]
    argv += ["--log-level", config.log_level]
    if config.tracing.enabled:
        argv += ["--otlp-endpoint", str(config.tracing.otlp_endpoint)]
        argv += ["--otlp-protocol", config.tracing.protocol]
        argv += ["--trace-sample-ratio", str(config.tracing.sample_ratio)]
    return argv


# -- the command line -----------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `inferd replica`. What a launcher passes to the replicas it
    runs (the resolved model, the registry, the secret's companions) is
    accepted but hidden from `--help`: a person starting a replica by hand
    never needs it."""
    internal = argparse.SUPPRESS
    parser.add_argument(
        "--model",
        required=True,
        help="catalog name (see `inferd models list`), local directory or Hugging Face repo id",
    )
    parser.add_argument(
        "--served-model-name",
        action="append",
        default=[],
        help="name clients use in 'model' (repeatable; the first is reported back)",
    )
    parser.add_argument("--model-source", default=None, help=internal)
    parser.add_argument(
        "--model-kind", choices=[k.value for k in ModelKind], default=None, help=internal
    )
    parser.add_argument("--serving-defaults", default=None, help=internal)
    parser.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default="auto",
        help="auto: diffusers for image models, vLLM for chat (transformers where vLLM "
        "is not installed)",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine-specific option; VALUE is parsed as JSON when it can be",
    )
    parser.add_argument(
        "--engine-settings",
        default=None,
        metavar="JSON",
        help="engine settings as the management API takes them (engineSettings), e.g. "
        '\'{"maxModelLen": 1024, "maxNumSeqs": 8}\'; they override --dtype, --max-model-len '
        "and --engine-arg",
    )
    parser.add_argument("--draft-model-source", default=None, help=internal)
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda where a GPU is visible, else cpu",
    )
    parser.add_argument("--gpus", default="", help="comma-separated GPU indices for this replica")
    parser.add_argument("--dtype", default="auto", help="weights' dtype (auto: the model's)")
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the model's)"
    )
    parser.add_argument(
        "--cpu-kv-cache-gib", type=int, default=1, help="KV cache size on a CPU (GiB)"
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="share of GPU memory vLLM may take (0-1)",
    )
    parser.add_argument(
        "--optimize",
        action="store_true",
        help="diffusers' fastest settings (fused QKV, channels-last, torch.compile); a "
        "long warm-up",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        help="vLLM tool parser (hermes, llama3_json, ...); default: the model's catalog entry",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        help="vLLM reasoning parser (deepseek_r1, qwen3, ...); default: the catalog entry",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback)")
    parser.add_argument("--advertise-host", default=None, help=internal)
    parser.add_argument("--port", type=int, default=0, help="TCP port (0 picks a free one)")
    parser.add_argument("--port-file", type=Path, default=None, help="write the bound port here")
    parser.add_argument("--registry-url", default=None, help=internal)
    parser.add_argument("--registry-fallback-url", action="append", default=[], help=internal)
    parser.add_argument("--replica-id", default="", help=internal)
    parser.add_argument("--endpoint-id", default=None, help=internal)
    parser.add_argument("--report-interval", type=float, default=2.0, help=internal)
    parser.add_argument("--orphan-timeout", type=float, default=None, help=internal)
    parser.add_argument("--report-fault-delay-s", type=float, default=0.0, help=internal)
    parser.add_argument("--report-fault-drop", type=float, default=0.0, help=internal)
    parser.add_argument(
        "--open-paths",
        default=",".join(DEFAULT_OPEN_PATHS),
        help="paths answered without the gateway's call key when the replica has a secret "
        "(comma-separated; empty: none)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=DEFAULT_DRAIN_TIMEOUT_S,
        help="seconds in-flight requests get to finish after SIGTERM",
    )
    parser.add_argument("--health-interval", type=float, default=1.0, help=internal)
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body (bytes)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds to receive a request's headers and body",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help="open connections at most; one more is refused with 503",
    )
    parser.add_argument(
        "--no-warmup", action="store_true", help="skip the warm-up request before ready"
    )
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="model catalog (default: models/catalog)"
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where tiny models are built (default: ~/.cache/inferd)",
    )
    parser.add_argument("--log-level", default="info", help="critical|error|warning|info|debug")
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OTLP collector for request traces (off when unset; inferd serve passes its own)",
    )
    parser.add_argument(
        "--otlp-protocol",
        default="http/protobuf",
        choices=["http/protobuf", "grpc"],
        help="how traces are sent to --otlp-endpoint",
    )
    parser.add_argument(
        "--trace-sample-ratio",
        type=float,
        default=1.0,
        help="share of requests traced (a caller's sampled traceparent is always followed)",
    )


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


def with_parsers(serving: ServingDefaults, args: argparse.Namespace) -> ServingDefaults:
    """The catalog's parser names, unless the command line names others."""
    return replace(
        serving,
        tool_call_parser=args.tool_call_parser or serving.tool_call_parser,
        reasoning_parser=args.reasoning_parser or serving.reasoning_parser,
    )


def config_from_args(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ReplicaConfig:
    env = os.environ if env is None else env
    gpu_ids = tuple(int(g) for g in args.gpus.split(",") if g.strip())
    try:
        serving = with_parsers(serving_from_json(args.serving_defaults), args)
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--serving-defaults: {exc}") from None
    try:
        engine_settings = EngineSettings.from_json(args.engine_settings)
    except ValueError as exc:
        raise SystemExit(f"--engine-settings: {exc}") from None
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
            settings=engine_settings,
        ),
        model_source=args.model_source,
        model_kind=None if args.model_kind is None else ModelKind(args.model_kind),
        draft_model_source=args.draft_model_source,
        host=args.host,
        advertise_host=args.advertise_host,
        port=args.port,
        port_file=args.port_file,
        registry_url=args.registry_url,
        registry_fallback_urls=tuple(args.registry_fallback_url),
        # A standalone replica (no control plane named it) still has an id
        # of its own: its log lines and metrics say which replica speaks.
        replica_id=args.replica_id or f"r-standalone-{secrets.token_hex(3)}",
        endpoint_id=args.endpoint_id,
        # Secrets travel by environment, never on a command line that `ps` shows.
        secret=env.get(SECRET_ENV),
        open_paths=tuple(p.strip() for p in args.open_paths.split(",") if p.strip()),
        report_interval=args.report_interval,
        orphan_timeout=args.orphan_timeout,
        report_fault_delay_s=args.report_fault_delay_s,
        report_fault_drop=args.report_fault_drop,
        drain_timeout=args.drain_timeout,
        health_interval=args.health_interval,
        max_body_bytes=args.max_body_bytes,
        request_timeout=args.request_timeout,
        max_connections=args.max_connections,
        warmup=not args.no_warmup,
        models_dir=args.models_dir,
        cache_dir=args.cache_dir,
        log_level=args.log_level,
        tracing=TracingSettings(args.otlp_endpoint, args.otlp_protocol, args.trace_sample_ratio),
    )


def config_from_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ReplicaConfig:
    parser = argparse.ArgumentParser(prog="python -m inferd.replica")
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)), env)
