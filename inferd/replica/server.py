"""The replica process: bind, serve, load, warm up, report, drain.

The HTTP server starts before the model loads so that `/health` answers
("loading", 503) and the registry hears about progress during a load that
can take minutes. SIGTERM drains: status `draining` (new requests get 503,
which the gateway retries elsewhere), in-flight requests finish, the engine
shuts down, status `stopped`, exit 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any, cast

import uvicorn
from starlette.types import ASGIApp

from inferd import tracing
from inferd.api.replica import ReplicaLoadReport, ReplicaReport, ReplicaUsageReport
from inferd.engines.base import (
    ChatMessage,
    Engine,
    ImageEngine,
    ImageRequest,
    PoolingEngine,
    SamplingOptions,
    ServingDefaults,
    TextEngine,
    TextRequest,
)
from inferd.engines.factory import choose_engine, create_engine
from inferd.http_limits import limited_protocol
from inferd.replica import groups
from inferd.replica.app import build_app
from inferd.replica.auth import RequireCallKey, call_key
from inferd.replica.chat import ServedModel
from inferd.replica.config import ReplicaConfig, serving_defaults
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.placed_prefixes import PlacedPrefixes, PlacedPrefixesApp
from inferd.replica.reporter import ReportFaults, StatusReporter
from inferd.replica.state import ReplicaState
from inferd.tracing import RequestIdFormatter
from inferd.vocab import ModelKind, ReplicaStatus

logger = logging.getLogger("inferd.replica")


class _DrainingServer(uvicorn.Server):
    """uvicorn, with the first SIGTERM/SIGINT turned into a drain request
    instead of an immediate shutdown (uvicorn would also re-raise the signal
    after serving, turning a clean drain into a non-zero exit)."""

    def __init__(self, config: uvicorn.Config, on_signal: Any) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._signalled = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._signalled:
            self.should_exit = True
            self.force_exit = True
            return
        self._signalled = True
        self._on_signal()


def bind_socket(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def warm_up(engine: Engine) -> None:
    """One real request through the engine before `ready`: first-call costs
    (kernel selection, allocator growth, lazy imports) are paid here, not by
    the first client."""
    if engine.kind.pooling:
        await cast(PoolingEngine, engine).warm_up()
    elif engine.kind is ModelKind.CHAT:
        text_engine = cast(TextEngine, engine)
        request = TextRequest(
            request_id=f"warmup-{os.getpid()}",
            messages=(ChatMessage(role="user", content="Hello"),),
            sampling=SamplingOptions(max_tokens=4, ignore_eos=True, temperature=0.0),
        )
        async for _ in text_engine.generate(request):
            pass
    else:
        image_engine = cast(ImageEngine, engine)
        width, height = image_engine.info.default_size
        await image_engine.generate(
            ImageRequest(
                request_id="warmup",
                prompt="warm-up",
                width=width,
                height=height,
                num_inference_steps=min(2, image_engine.info.default_steps),
            )
        )


class ReplicaProcess:
    def __init__(self, config: ReplicaConfig) -> None:
        self.config = config
        self.state = ReplicaState()
        self.url = ""
        self.started_at = time.time()
        self._drain_requested = asyncio.Event()
        self._model_name = config.served_names[0] if config.served_names else config.model
        self._reporter: StatusReporter | None = None
        self._engine: Engine | None = None
        self._metrics: ReplicaMetrics | None = None
        # Which engine serves the model (vLLM, or transformers where vLLM is
        # not installed, ...): reported, so that a fallback is seen.
        self._engine_name: str | None = None

    def _snapshot(self) -> ReplicaReport:
        load = self._engine.load() if self._engine is not None else None
        return ReplicaReport(
            replica_id=self.config.replica_id,
            endpoint_id=self.config.endpoint_id,
            status=self.state.status,
            reason=self.state.reason,
            engine=self._engine_name,
            url=self.url or None,
            seq=0,  # numbered by the reporter as it sends
            load=ReplicaLoadReport(
                in_flight=self.state.in_flight,
                running=load.running if load else 0,
                waiting=load.waiting if load else 0,
                kv_cache_usage=load.kv_cache_usage if load else None,
                kv_cache_tokens=load.kv_cache_tokens if load else None,
                prefix_cache_queries=load.prefix_cache_queries if load else 0,
                prefix_cache_hits=min(load.prefix_cache_hits, load.prefix_cache_queries)
                if load
                else 0,
                adapters=list(load.adapters) if load else [],
            ),
            # Cumulative since start: a lost report loses nothing.
            usage=ReplicaUsageReport(**self._metrics.usage()) if self._metrics else None,
        )

    def request_drain(self) -> None:
        self._drain_requested.set()

    async def run(self) -> int:
        config = self.config
        if config.registry_url:
            self._reporter = StatusReporter(
                config.registry_url,
                config.replica_id,
                config.secret,
                self._snapshot,
                on_orphaned=self.request_drain,
                interval=config.report_interval,
                orphan_timeout=config.orphan_timeout,
                fallback_urls=config.registry_fallback_urls,
                faults=ReportFaults(config.report_fault_delay_s, config.report_fault_drop),
            )
            self.state.on_change(self._reporter.notify)
            self._reporter.start()
        try:
            return await self._serve()
        finally:
            if self._reporter is not None:
                await self._reporter.close()

    async def _serve(self) -> int:
        config = self.config
        self.state.note(f"preparing {config.model}: building or downloading its weights")
        try:
            # In a thread: a build or a download takes minutes, and the
            # reporter keeps telling the registry this replica is alive.
            name, kind, path, defaults = await asyncio.to_thread(resolve, config)
            draft_path = await asyncio.to_thread(resolve_draft, config)
        except Exception as exc:
            self.state.set(ReplicaStatus.FAILED, f"model unavailable: {exc}")
            logger.error("cannot resolve model %r: %s", config.model, exc)
            return 1
        self._model_name = config.served_names[0] if config.served_names else name
        options = replace(
            config.engine,
            serving=with_parsers_given(defaults, config.engine.serving),
            draft_model_path=draft_path,
        )
        try:
            self._engine_name = choose_engine(kind, options.engine)
            # In a thread too: it imports the engine (vLLM: tens of seconds
            # on a busy machine), which would stop the reports meanwhile and
            # get this replica failed as silent while it starts.
            self._engine = await asyncio.to_thread(
                create_engine, self._model_name, kind, path, options
            )
        except ValueError as exc:  # an unknown engine or engine option
            self.state.set(ReplicaStatus.FAILED, f"bad engine settings: {exc}")
            logger.error("bad engine settings: %s", exc)
            return 1
        metrics = self._metrics = ReplicaMetrics(self._engine, self.state)
        served = ServedModel(self._model_name, frozenset(config.served_names) | {name})
        app: ASGIApp = build_app(
            self._engine,
            self.state,
            metrics,
            served,
            config.max_body_bytes,
            engine_name=self._engine_name,
        )
        app = PlacedPrefixesApp(app, PlacedPrefixes())
        if config.secret:
            app = RequireCallKey(app, call_key(config.secret), config.open_paths)
        sock = bind_socket(config.host, config.port)
        port = sock.getsockname()[1]
        self.url = f"http://{_url_host(config.advertise_host or config.host)}:{port}"
        server = _DrainingServer(
            uvicorn.Config(
                app,
                log_level=config.log_level,
                access_log=False,
                lifespan="off",
                timeout_keep_alive=30,
                http=limited_protocol(config.request_timeout, config.max_connections),
            ),
            on_signal=self.request_drain,
        )
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        if config.port_file is not None:
            config.port_file.write_text(f"{port}\n")
        logger.info(
            "replica %s serving %s with the %s engine on %s",
            config.replica_id,
            self._model_name,
            self._engine_name,
            self.url,
        )
        if options.engine == "auto" and self._engine_name == "transformers":
            logger.warning("vLLM is not installed: chat runs on the transformers engine")

        exit_code = 0
        self.state.set(
            ReplicaStatus.LOADING, f"loading {self._model_name} with the {self._engine_name} engine"
        )
        loading = asyncio.ensure_future(self._load())
        drain = asyncio.ensure_future(self._drain_requested.wait())
        await asyncio.wait({loading, drain, serving}, return_when=asyncio.FIRST_COMPLETED)
        if loading.done() and loading.exception() is None and not serving.done():
            self.state.set(ReplicaStatus.READY)
            logger.info("replica ready")
            watch = asyncio.ensure_future(watch_engine(self._engine, config.health_interval))
            await asyncio.wait({drain, serving, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                # The engine is gone: nothing in flight can finish. Report why,
                # and exit so that the launcher replaces this replica.
                reason = watch.result()
                logger.error("engine failed: %s", reason)
                self.state.set(ReplicaStatus.FAILED, f"engine failed: {reason}")
                exit_code = 1
            else:
                watch.cancel()
        elif loading.done() and loading.exception() is not None:
            error = loading.exception()
            logger.error("model load failed: %r", error)
            self.state.set(ReplicaStatus.FAILED, f"load failed: {type(error).__name__}: {error}")
            exit_code = 1
        else:
            # Drain requested (or the server died) while still loading:
            # let the load finish so the engine can be shut down cleanly.
            await asyncio.wait({loading}, timeout=config.drain_timeout)

        if self.state.status is not ReplicaStatus.FAILED:
            self.state.set(ReplicaStatus.DRAINING)
            idle = await self.state.wait_idle(config.drain_timeout)
            if not idle:
                logger.warning("drain timed out with %d in flight", self.state.in_flight)
        server.should_exit = True
        await serving
        drain.cancel()
        if loading.done() and loading.exception() is None:
            try:
                await asyncio.wait_for(self._engine.shutdown(), config.drain_timeout)
            except Exception as exc:  # a dead engine may not shut down cleanly
                logger.warning("engine shutdown: %r", exc)
        else:
            loading.cancel()
        if self.state.status is not ReplicaStatus.FAILED:
            self.state.set(ReplicaStatus.STOPPED)
        return exit_code

    async def _load(self) -> None:
        engine = self._engine
        assert engine is not None  # created before loading starts
        await engine.start()
        if self.config.warmup:
            self.state.note("warming up: one request through the engine")
            await warm_up(engine)


async def watch_engine(engine: Engine, interval: float) -> str:
    """Return (the reason) once the engine can no longer serve: vLLM's
    engine core gone, a worker thread of diffusers or transformers stopped,
    or a health check that does not answer within a few intervals."""
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.wait_for(engine.check_health(), timeout=max(10.0, 5 * interval))
        except TimeoutError:
            return "the engine did not answer its health check"
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"


def _url_host(host: str) -> str:
    # A wildcard bind address is not something the gateway can dial.
    dial = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"[{dial}]" if ":" in dial and not dial.startswith("[") else dial


def resolve(config: ReplicaConfig) -> tuple[str, ModelKind, Path, ServingDefaults]:
    """The model to load: the resolved one the launcher passed (no catalog
    read), else `config.model` looked up in the catalog (a replica started
    by hand)."""
    if config.model_source is not None and config.model_kind is not None:
        if config.engine.engine == "fake":
            return config.model, config.model_kind, Path("."), config.engine.serving
        from inferd.catalog.resolve import resolve_source

        path = resolve_source(config.model_source, config.model, config.cache_dir)
        return config.model, config.model_kind, path, config.engine.serving
    from inferd.catalog import load_catalog, resolve_model

    catalog = load_catalog(models_dir=config.models_dir)
    if config.engine.engine == "fake":
        # The fake engine loads nothing: take the kind from the catalog (or
        # `--engine-arg kind=image`) and never build or download weights.
        kind = config.model_kind or config.engine.extra.get("kind")
        if kind is None and config.model in catalog.models:
            kind = catalog.models.get(config.model).kind
        return config.model, ModelKind(kind or "chat"), Path("."), config.engine.serving
    resolved = resolve_model(config.model, catalog.models, cache_dir=config.cache_dir)
    return (
        resolved.name,
        ModelKind(resolved.kind),
        resolved.path,
        serving_defaults(resolved.spec),
    )


def resolve_draft(config: ReplicaConfig) -> Path | None:
    """The draft model of speculative decoding, on this machine: from the
    source the launcher passed, else the settings' catalog name (a replica
    started by hand); None when the settings name no draft."""
    speculative = config.engine.settings.speculativeDecoding
    if speculative is None or config.engine.engine == "fake":
        return None
    from inferd.catalog.resolve import resolve_model, resolve_source

    if config.draft_model_source is not None:
        return resolve_source(config.draft_model_source, speculative.draftModel, config.cache_dir)
    from inferd.catalog import load_catalog

    catalog = load_catalog(models_dir=config.models_dir)
    return resolve_model(speculative.draftModel, catalog.models, cache_dir=config.cache_dir).path


def with_parsers_given(defaults: ServingDefaults, given: ServingDefaults) -> ServingDefaults:
    """The catalog's serving defaults, with the parsers the command line named."""
    return replace(
        defaults,
        tool_call_parser=given.tool_call_parser or defaults.tool_call_parser,
        reasoning_parser=given.reasoning_parser or defaults.reasoning_parser,
    )


def run_replica(config: ReplicaConfig) -> int:
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Lines logged while a request is answered name its request id.
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RequestIdFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    tracing.configure(config.tracing, "inferd-replica")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per heartbeat otherwise
    # A replica is its own process group leader's child; make sure a SIGTERM
    # from the launcher reaches our handler, not a default inherited ignore.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Before the engine starts any process: whatever it starts dies with us.
    groups.start_reaper()
    mark = groups.mark_group(config.replica_id or f"pid-{os.getpid()}")
    process = ReplicaProcess(config)
    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(process.run())
        return uvloop.run(process.run())
    finally:
        if mark is not None:
            mark.unlink(missing_ok=True)
