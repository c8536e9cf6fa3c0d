"""The one `Settings` object of `inferd serve`, and how it is built.

Precedence, lowest first: built-in defaults < config file (`--config` or
`INFERD_CONFIG`, YAML, flat keys; `configs/server.yaml` documents every key)
< environment (`INFERD_<KEY>`) < command-line flags. The environment is an
injected mapping and is never read at import time, so tests build any
combination without touching `os.environ`.

A few values are derived when left unset, from the values around them:
`public_url` from host and port, `state_dir` from `XDG_DATA_HOME`/`HOME`,
`db_path` from `state_dir`, `database_url` from `db_path`, `models_dir`/`configs_dir`
from the source tree.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from inferd.catalog.roots import ModelRoots
from inferd.control.batches.model import BatchSettings
from inferd.control.replicas.autoscaler import (
    DOWNSCALE_DELAY_S,
    TARGET_CONCURRENCY,
    TARGET_ENGINE_WAITING,
    TARGET_KV_CACHE_USAGE,
    UPSCALE_DELAY_S,
)
from inferd.control.replicas.reconciler import ReconcilerSettings
from inferd.control.replicas.registry import RegistrySettings
from inferd.gateway.routing import Policy
from inferd.gateway.settings import GatewaySettings
from inferd.paths import default_configs_dir, default_models_dir
from inferd.replica.config import DEFAULT_DRAIN_TIMEOUT_S, ReplicaSettings
from inferd.tracing import TracingSettings

_GATEWAY = GatewaySettings()
_REGISTRY = RegistrySettings()
_AUTOSCALE = ReconcilerSettings()

ENV_PREFIX = "INFERD_"
CONFIG_ENV = "INFERD_CONFIG"

LogLevel = Literal["critical", "error", "warning", "info", "debug"]


class SettingsError(ValueError):
    """A setting has a bad value; the message names the key and where it came from."""


class Settings(BaseModel):
    """Resolved settings of one `inferd serve` process (frozen)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- HTTP listener -------------------------------------------------------
    host: str = Field("127.0.0.1", description="bind address (loopback by default)")
    port: int = Field(8080, ge=0, le=65535, description="TCP port")
    # Base of every endpoint's `url`; derived as http://host:port when unset.
    public_url: str = Field(description="base of endpoint URLs (default http://HOST:PORT)")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body")
    # nginx's default for client_header_timeout / client_body_timeout.
    request_timeout_seconds: float = Field(
        60.0, gt=0, description="time to receive a request's headers and body"
    )
    max_connections: int = Field(10_000, ge=1, description="open connections per process")
    log_level: LogLevel = Field("info", description="critical|error|warning|info|debug")

    # --- State ---------------------------------------------------------------
    state_dir: Path = Field(description="state directory (default ~/.local/share/inferd)")
    db_path: Path = Field(description="SQLite file (default STATE_DIR/inferd.db)")
    # Where the state lives: sqlite:///PATH (embedded) or postgresql://...
    database_url: str = Field(
        description="state database: postgresql://user@host/db (default sqlite:///DB_PATH)"
    )
    # Supplied by the operator; when unset, one is generated on first start,
    # printed once and stored only as a hash.
    admin_key: SecretStr | None = Field(
        None, description="management API key (prefer INFERD_ADMIN_KEY: flags show in ps)"
    )

    # --- Several instances over one PostgreSQL --------------------------------
    # Instances whose `database_url` is the same PostgreSQL form a cluster:
    # they elect one leader and share their load through it.
    # How this instance is named to the others (leader, load rows); unique.
    instance_id: str | None = Field(
        None, description="this instance's name in a cluster (default HOSTNAME:PORT)"
    )
    cluster_load_interval_seconds: float = Field(
        1.0, gt=0, le=10, description="how often an instance publishes its load"
    )
    # A replica reports to the instance that launched it; when that one is
    # gone (the next leader adopts the replica), to these.
    replica_report_fallback_urls: str = Field(
        "",
        description="comma-separated base URLs of the other instances or their load "
        "balancer, where replicas report when this instance is unreachable",
    )

    # --- Catalog -------------------------------------------------------------
    models_dir: Path = Field(description="model catalog directory")
    configs_dir: Path = Field(description="GPU types, locations and prices directory")
    # Project members register local directories as models only below these
    # (the operator registers any); Hugging Face sources need none.
    model_roots: str = Field(
        "",
        description="comma-separated directories project members may register models "
        "from: PATH for every project, PROJECT=PATH for one",
    )

    @field_validator("model_roots")
    @classmethod
    def _roots_are_absolute(cls, value: str) -> str:
        ModelRoots.parse(value)  # a relative root is refused at start, not at first use
        return value

    # One setting for both, so that a single machine is declared in one place:
    # where the local launcher's replicas run (its GPUs are offered there) and
    # the location of a create request that names none.
    default_location: str = Field(
        "local",
        description="this machine's location (local launcher) and the location of a "
        "request that names none, e.g. us-east",
    )

    # --- Endpoint limits -----------------------------------------------------
    max_replicas_cap: int = Field(8, ge=1, le=1024, description="highest maxReplicas allowed")
    max_endpoints: int = Field(10_000, ge=1, description="endpoints one server holds")

    # --- Gateway: holding requests while scaling from zero -------------------
    gateway_max_queued_per_endpoint: int = Field(
        _GATEWAY.max_held_requests,
        ge=0,
        description="requests held per endpoint while no replica is free (each keeps a socket)",
    )
    gateway_max_held_bytes_per_endpoint: int = Field(
        _GATEWAY.max_held_bytes_per_endpoint,
        ge=0,
        description="bytes of held requests (bodies plus a fixed cost each) per endpoint",
    )
    gateway_max_held_bytes: int = Field(
        _GATEWAY.max_held_bytes,
        ge=0,
        description="bytes of held requests (bodies plus a fixed cost each) in this instance",
    )
    gateway_max_in_flight_per_replica: int = Field(
        _GATEWAY.max_in_flight_per_replica,
        ge=1,
        description="requests forwarded to one replica at once; more are held",
    )
    gateway_hold_timeout_seconds: float = Field(
        _GATEWAY.max_hold_seconds,
        gt=0,
        description="longest a request is held waiting for a replica",
    )

    # --- Gateway: routing -----------------------------------------------------
    gateway_routing_policy: Literal["prefix", "least_loaded"] = Field(
        _GATEWAY.routing_policy.value,
        description="prefix: to the replica likely holding the prompt's KV cache, "
        "within a load bound; least_loaded: least in-flight work",
    )
    gateway_routing_load_factor: float = Field(
        _GATEWAY.routing_load_factor,
        ge=1,
        description="prefix routing's load bound, as a multiple of the mean replica load",
    )
    gateway_routing_min_load_bound: int = Field(
        _GATEWAY.routing_min_load_bound,
        ge=1,
        description="prefix routing's load bound is never below this many requests per replica",
    )
    gateway_routing_place_prefixes: bool = Field(
        _GATEWAY.routing_place_prefixes,
        description="prefix routing places each live prompt prefix on a replica by what "
        "each KV cache holds (false: by rendezvous hashing alone)",
    )
    gateway_prefix_block_bytes: int = Field(
        _GATEWAY.prefix_block_bytes, ge=16, description="prompt bytes per hashed block"
    )
    gateway_prefix_max_blocks: int = Field(
        _GATEWAY.prefix_max_blocks, ge=1, description="blocks hashed per prompt, at most"
    )
    gateway_prefix_table_entries: int = Field(
        _GATEWAY.prefix_table_entries,
        ge=1,
        description="prompt block hashes remembered per server (LRU, ~100 bytes each)",
    )
    gateway_fair_queuing: bool = Field(
        _GATEWAY.fair_queuing,
        description="release held requests by a weighted fair share between client tokens "
        "(off: first in, first out)",
    )
    gateway_batch_reserved_share: float = Field(
        _GATEWAY.batch_reserved_share,
        ge=0,
        lt=1,
        description="share of each replica's in-flight slots that batch-priority requests "
        "leave free for interactive ones (at least one slot when above 0)",
    )
    # --- Gateway: stream migration -------------------------------------------
    gateway_migration: bool = Field(
        _GATEWAY.migration,
        description="continue a stream on another replica when its replica is lost mid-answer",
    )
    gateway_max_migrations: int = Field(
        _GATEWAY.max_migrations, ge=0, description="migrations of one request, at most"
    )
    gateway_migration_off_endpoints: str = Field(
        "", description="comma-separated endpoint ids whose streams are never migrated"
    )

    # --- Registry and health ------------------------------------------------
    health_period_seconds: float = Field(
        _REGISTRY.health_period_s, gt=0, description="replica report period"
    )
    health_failure_periods: int = Field(
        _REGISTRY.failure_periods,
        ge=1,
        description="missed reports before a replica is unresponsive (routed around, probed)",
    )
    replica_dead_after_seconds: float = Field(
        _REGISTRY.dead_after_s,
        gt=0,
        description="silence (no report, answer or probe answer) before a replica whose "
        "process lives is taken for dead and replaced; 3x as long while it loads",
    )
    replica_silent_end_max_share: float = Field(
        _AUTOSCALE.silent_end_max_share,
        gt=0,
        le=1,
        description="most of an endpoint's replicas ended for silence per window (at least one, "
        "never the last ready one)",
    )
    replica_silent_end_window_seconds: float = Field(
        _AUTOSCALE.silent_end_window_s,
        gt=0,
        description="the window of replica_silent_end_max_share",
    )
    replica_start_timeout_seconds: float = Field(
        _REGISTRY.start_timeout_s,
        gt=0,
        description="longest a replica may take to become ready",
    )
    replica_drain_timeout_seconds: float = Field(
        DEFAULT_DRAIN_TIMEOUT_S,
        ge=0,
        description="longest a stopping replica drains in-flight work",
    )

    # --- Autoscaler ---------------------------------------------------------
    autoscale_target_concurrency: float = Field(
        TARGET_CONCURRENCY, gt=0, description="in-flight requests per replica to aim for"
    )
    autoscale_upscale_delay_seconds: float = Field(
        UPSCALE_DELAY_S, ge=0, description="sustained load before adding a replica"
    )
    autoscale_downscale_delay_seconds: float = Field(
        DOWNSCALE_DELAY_S, ge=0, description="sustained low load before removing a replica"
    )
    autoscale_target_kv_cache_usage: float = Field(
        TARGET_KV_CACHE_USAGE,
        ge=0,
        le=1,
        description="mean KV cache use per replica to aim for (0: not a signal)",
    )
    autoscale_target_engine_waiting: float = Field(
        TARGET_ENGINE_WAITING,
        ge=0,
        description="requests queued inside each replica's engine to aim for (0: not a signal)",
    )
    reconcile_period_seconds: float = Field(
        1.0, gt=0, description="how often desired replicas are applied"
    )

    # --- Batch API -----------------------------------------------------------------
    batch_max_file_bytes: int = Field(
        BatchSettings.max_file_bytes, ge=1024, description="largest batch input file"
    )
    batch_max_requests: int = Field(
        BatchSettings.max_requests, ge=1, description="most requests (lines) in one batch"
    )
    batch_storage_quota_bytes: int = Field(
        BatchSettings.project_quota_bytes,
        ge=0,
        description="batch files (inputs and results) a project may keep, in bytes",
    )
    batch_concurrency: int = Field(
        BatchSettings.concurrency,
        ge=1,
        le=1024,
        description="requests of one batch in flight at once (each behind interactive ones)",
    )
    batch_price_per_million_tokens: float = Field(
        BatchSettings.price_per_million_tokens,
        ge=0,
        description="list price of a million tokens, for the cost shown per batch",
    )
    batch_discount: float = Field(
        BatchSettings.discount,
        ge=0,
        le=1,
        description="share taken off the token price for batch requests (0.5: half price)",
    )

    @property
    def batches(self) -> BatchSettings:
        return BatchSettings(
            max_file_bytes=self.batch_max_file_bytes,
            max_requests=self.batch_max_requests,
            project_quota_bytes=self.batch_storage_quota_bytes,
            concurrency=self.batch_concurrency,
            price_per_million_tokens=self.batch_price_per_million_tokens,
            discount=self.batch_discount,
        )

    # --- Replicas (local launcher) --------------------------------------------
    replica_args: str = Field(
        "",
        description="extra `inferd replica` arguments for every replica, e.g. "
        "'--engine fake' or '--cpu-kv-cache-gib 2' (shell syntax); the defaults an "
        "endpoint's engineSettings override",
    )
    cpu_replica_slots: int = Field(
        4,
        ge=0,
        description="replicas this machine runs on its CPU (gpuType cpu); each slot's vLLM "
        "engine computes on its own share of the cores unless VLLM_CPU_OMP_THREADS_BIND is set",
    )
    # nvidia-smi's device names are matched to configs/gpus.yaml; a GPU whose
    # name matches no type (a workstation card, a new model) is declared here.
    gpu_types: str = Field(
        "",
        description="this machine's GPU types when detection matches none: one for all "
        "(L40S) or by index (0=H100-80GB,1=L4)",
    )
    replica_orphan_timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="a replica that cannot reach the control plane this long exits",
    )

    # --- Where replicas run -------------------------------------------------------
    launcher: Literal["local", "ray"] = Field(
        "local", description="local (processes on this machine) | ray (actors on a Ray cluster)"
    )
    ray_address: str | None = Field(
        None, description="Ray cluster to place replicas on (HOST:PORT of its head), for ray"
    )
    ray_namespace: str = Field(
        "inferd", description="Ray namespace of this control plane's replica actors"
    )
    ray_node_ip_address: str | None = Field(
        None, description="this machine's address as the Ray cluster sees it (default: detected)"
    )
    ray_placement: Literal["spread", "pack"] = Field(
        "spread",
        description="spread: an endpoint's replicas on different nodes (and failure domains) "
        "where there is room; pack: Ray's default, filling one node before the next",
    )

    # --- Traces (OpenTelemetry) -------------------------------------------------
    otlp_endpoint: str | None = Field(
        None,
        description="OTLP collector for request traces (http://HOST:4318 for HTTP, "
        "HOST:4317 for gRPC); unset: no tracing, at no cost",
    )
    otlp_protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf", description="how traces are sent to otlp_endpoint"
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="share of requests traced (a client's sampled traceparent is always followed)",
    )

    @property
    def tracing(self) -> TracingSettings:
        return TracingSettings(self.otlp_endpoint, self.otlp_protocol, self.trace_sample_ratio)

    def admin_key_value(self) -> str | None:
        return None if self.admin_key is None else self.admin_key.get_secret_value()

    # --- Sections: what each part is built with ---------------------------------
    # The keys above stay flat (they are the flags, environment variables and
    # config file keys); each part takes its section, and a knob's default is
    # defined once, by the part (the fields above take theirs from it).

    @property
    def gateway(self) -> GatewaySettings:
        return GatewaySettings(
            max_body_bytes=self.max_body_bytes,
            max_in_flight_per_replica=self.gateway_max_in_flight_per_replica,
            max_held_requests=self.gateway_max_queued_per_endpoint,
            max_held_bytes_per_endpoint=self.gateway_max_held_bytes_per_endpoint,
            max_held_bytes=self.gateway_max_held_bytes,
            max_hold_seconds=self.gateway_hold_timeout_seconds,
            routing_policy=Policy(self.gateway_routing_policy),
            routing_load_factor=self.gateway_routing_load_factor,
            routing_min_load_bound=self.gateway_routing_min_load_bound,
            routing_place_prefixes=self.gateway_routing_place_prefixes,
            prefix_block_bytes=self.gateway_prefix_block_bytes,
            prefix_max_blocks=self.gateway_prefix_max_blocks,
            prefix_table_entries=self.gateway_prefix_table_entries,
            fair_queuing=self.gateway_fair_queuing,
            batch_reserved_share=self.gateway_batch_reserved_share,
            migration=self.gateway_migration,
            max_migrations=self.gateway_max_migrations,
            migration_off_endpoints=frozenset(
                e.strip() for e in self.gateway_migration_off_endpoints.split(",") if e.strip()
            ),
        )

    @property
    def autoscale(self) -> ReconcilerSettings:
        return ReconcilerSettings(
            period_s=self.reconcile_period_seconds,
            drain_timeout_s=self.replica_drain_timeout_seconds,
            target_concurrency=self.autoscale_target_concurrency,
            upscale_delay_s=self.autoscale_upscale_delay_seconds,
            downscale_delay_s=self.autoscale_downscale_delay_seconds,
            target_kv_cache_usage=self.autoscale_target_kv_cache_usage or None,
            target_engine_waiting=self.autoscale_target_engine_waiting or None,
            silent_end_max_share=self.replica_silent_end_max_share,
            silent_end_window_s=self.replica_silent_end_window_seconds,
        )

    @property
    def registry(self) -> RegistrySettings:
        return RegistrySettings(
            health_period_s=self.health_period_seconds,
            failure_periods=self.health_failure_periods,
            start_timeout_s=self.replica_start_timeout_seconds,
            dead_after_s=self.replica_dead_after_seconds,
        )

    @property
    def clustered(self) -> bool:
        """Several instances share this database (PostgreSQL): one leads."""
        return self.database_url.partition(":")[0].lower() in ("postgresql", "postgres")

    @property
    def cluster_instance_id(self) -> str:
        return self.instance_id or f"{socket.gethostname()}:{self.port}"

    @property
    def registry_url(self) -> str:
        """Where replicas report: this server's listener, dialable."""
        return f"{_dialable(self.host, self.port)}/internal/registry"

    @property
    def replicas(self) -> ReplicaSettings:
        """What every launcher gives each replica (`launcher` names which one)."""
        return ReplicaSettings(
            registry_url=self.registry_url,
            registry_fallback_urls=tuple(
                base.strip().rstrip("/") + "/internal/registry"
                for base in self.replica_report_fallback_urls.split(",")
                if base.strip()
            ),
            report_interval_s=self.health_period_seconds,
            orphan_timeout_s=self.replica_orphan_timeout_seconds,
            drain_timeout_s=self.replica_drain_timeout_seconds,
            log_level=self.log_level,
            replica_args=self.replica_args,
            tracing=self.tracing,
        )


def _dialable(host: str, port: int | str) -> str:
    """http://HOST:PORT a client can dial (a wildcard bind address is not)."""
    dial = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in dial and not dial.startswith("["):
        dial = f"[{dial}]"
    return f"http://{dial}:{port}"


# Keys whose default is computed from other values (see `_derive`).
_DERIVED = ("public_url", "state_dir", "db_path", "database_url", "models_dir", "configs_dir")


def setting_keys() -> tuple[str, ...]:
    return tuple(Settings.model_fields)


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path} must be a mapping of setting keys to values")
    unknown = sorted(set(data) - set(setting_keys()))
    if unknown:
        raise SettingsError(f"config file {path}: unknown setting(s) {', '.join(unknown)}")
    # null in the file means "use the default" (the documented file lists
    # derived keys as null).
    return {k: v for k, v in data.items() if v is not None}


def _from_env(env: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for key in setting_keys():
        raw = env.get(env_name(key))
        if raw is not None and raw != "":
            values[key] = raw
    return values


def _derive(values: dict[str, Any], env: Mapping[str, str]) -> None:
    host = str(values.get("host", Settings.model_fields["host"].default))
    port = values.get("port", Settings.model_fields["port"].default)
    if "public_url" not in values:
        values["public_url"] = _dialable(host, port)
    values["public_url"] = str(values["public_url"]).rstrip("/")
    if "state_dir" not in values:
        values["state_dir"] = default_state_dir(env)
    values["state_dir"] = Path(values["state_dir"]).expanduser()
    if "db_path" not in values:
        values["db_path"] = Path(values["state_dir"]) / "inferd.db"
    if "database_url" not in values:
        values["database_url"] = f"sqlite:///{Path(values['db_path']).expanduser()}"
    values.setdefault("models_dir", default_models_dir())
    values.setdefault("configs_dir", default_configs_dir())


def default_state_dir(env: Mapping[str, str]) -> Path:
    """`$XDG_DATA_HOME/inferd`, else `~/.local/share/inferd` (HOME from `env`)."""
    xdg = env.get("XDG_DATA_HOME")
    if xdg:
        return Path(xdg) / "inferd"
    home = env.get("HOME")
    base = Path(home) if home else Path.home()
    return base / ".local" / "share" / "inferd"


def load_settings(
    *,
    env: Mapping[str, str] | None = None,
    config_path: Path | str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Build settings: defaults < config file < `env` < `overrides` (CLI flags).

    `overrides` entries whose value is None are ignored, so an argparse
    namespace with unset flags can be passed as is. The config file is
    `config_path`, else `INFERD_CONFIG` from `env`, else none.
    """
    env = {} if env is None else env
    sources: dict[str, str] = {}
    values: dict[str, Any] = {}

    path = config_path if config_path is not None else env.get(CONFIG_ENV) or None
    if path is not None:
        for key, value in read_config_file(Path(path)).items():
            values[key] = value
            sources[key] = f"config file {path}"
    for key, value in _from_env(env).items():
        values[key] = value
        sources[key] = f"environment {env_name(key)}"
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in Settings.model_fields:
            raise SettingsError(f"unknown setting {key!r}")
        values[key] = value
        sources[key] = f"flag --{key.replace('_', '-')}"

    try:
        _derive(values, env)
        return Settings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        key = str(first["loc"][0]) if first.get("loc") else "?"
        where = sources.get(key, "default")
        raise SettingsError(f"setting {key} (from {where}): {first['msg']}") from None
    except (TypeError, ValueError) as exc:
        raise SettingsError(str(exc)) from None


def documented_defaults() -> dict[str, Any]:
    """Static default of every key (None where the default is derived)."""
    out: dict[str, Any] = {}
    for key, field in Settings.model_fields.items():
        out[key] = None if key in _DERIVED or field.is_required() else field.default
    return out
