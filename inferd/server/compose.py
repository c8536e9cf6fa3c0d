"""The one composition of `inferd serve`: every part, built in dependency order.

`await build(settings)` opens the store and constructs each part once, each
from parts already built, so nothing is assigned after construction and no
callback points at something that does not exist yet:

    catalog, store -> admin keys, token verifier -> registry (rings a Wakeup)
    -> launcher -> endpoint series -> gateway state (traffic, connections,
    metrics; its metrics feed the series) -> load observations -> principal
    resolver, account service, usage meter, project quota cap, scale journal
    -> reconciler (ScaleSignals; reads endpoints from the store; capped by
    the quotas; journals each change of desired replicas) -> the endpoints'
    copy -> registered models (refused deletion while the copy has a user)
    -> project guard -> endpoint reads and commands (project checks, quotas, audit;
    tells the reconciler; shows the registry's replicas) -> accounts (usage
    reads), meter feed (registry -> meter), series sampler (registry,
    gateway state, service) -> endpoint directory -> gateway (asks the
    reconciler for capacity) -> batch runner (a leader duty; its requests
    through the gateway, in-process) -> batch service (tells the runner)

`Server.start()`/`stop()` run in the serving event loop (the app lifespan),
in one order for both run modes; `inferd.server.app.create_app` only puts
HTTP routes on a built server.

The one choice between run modes is the `Coordination` adapter
(`inferd.control.cluster`): a single instance is a cluster of one (`Solo`:
it leads at once); with a PostgreSQL store, instances elect one leader
(`Postgres`). Either way the reconciler (and the usage meter's
replica-seconds) run only while this instance leads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from inferd import tracing
from inferd.catalog import Catalog, load_catalog
from inferd.catalog.roots import ModelRoots
from inferd.control.accounts.meter_feed import MeterFeed
from inferd.control.accounts.metering import UsageMeter
from inferd.control.accounts.model import utc_now
from inferd.control.accounts.plane import Accounts, EndpointPrices, ProjectQuotaCap
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.project_deletion import ProjectDeletion
from inferd.control.accounts.project_guard import ProjectGuard
from inferd.control.accounts.service import AccountService
from inferd.control.accounts.usage_reads import UsageReads
from inferd.control.batches.runner import BatchRunner
from inferd.control.batches.service import BatchService
from inferd.control.cluster.duties import (
    LeaderDrain,
    LeaderDutySet,
    LeaderFlag,
    ReplicaDuty,
    Signals,
)
from inferd.control.cluster.loadshare import max_age
from inferd.control.cluster.ports import Coordination
from inferd.control.cluster.postgres import Postgres
from inferd.control.cluster.solo import Solo
from inferd.control.endpoints.adapters import AdapterService
from inferd.control.endpoints.cache import EndpointCache
from inferd.control.endpoints.catch_up import EndpointCatchUp
from inferd.control.endpoints.client_tokens import ClientTokenService
from inferd.control.endpoints.endpoint_rows import FollowedEndpoints
from inferd.control.endpoints.reads import EndpointReads
from inferd.control.endpoints.service import EndpointCommands
from inferd.control.endpoints.tokens import TokenVerifier
from inferd.control.endpoints.views import EndpointDirectory, ReplicaViews
from inferd.control.launchers.inventory import (
    detect_gpus,
    match_gpu_type,
    parse_declared_gpu_types,
)
from inferd.control.launchers.local import LocalLauncher
from inferd.control.metrics.plane import EndpointTokens, StoreProbe
from inferd.control.metrics.series_feed import AnsweredRequests, SeriesSampler
from inferd.control.metrics.timeseries import EndpointSeries
from inferd.control.model_service import ModelService
from inferd.control.ports import Launcher, Store
from inferd.control.recommendations import RecommendationService
from inferd.control.replicas.load import MergedLoad
from inferd.control.replicas.reconciler import Reconciler
from inferd.control.replicas.registry import Registry
from inferd.control.replicas.replica_mirror import ReplicaMirror
from inferd.control.replicas.scale_events import ScaleJournal
from inferd.control.signals import Wakeup
from inferd.control.stores import open_store
from inferd.gateway.app import Gateway
from inferd.gateway.caller import InProcessCaller
from inferd.gateway.state import GatewayState
from inferd.replica.config import ModelSource, model_source
from inferd.server.auth import AdminAuth, provision_admin_key
from inferd.server.batch_executor import GatewayExecutor
from inferd.settings import Settings

logger = logging.getLogger(__name__)


class LauncherUnavailable(RuntimeError):
    """The chosen launcher cannot start (a missing extra, a missing setting,
    an unreachable cluster)."""


def configured_launcher(settings: Settings, catalog: Catalog) -> Launcher:
    if settings.launcher == "ray":
        return ray_launcher(settings)
    return local_launcher(settings, catalog)


def ray_launcher(settings: Settings) -> Launcher:
    """Imports Ray: only when it was chosen."""
    try:
        from inferd.control.launchers.ray_launcher import RayLauncher
    except ImportError as exc:
        raise LauncherUnavailable(
            f"--launcher ray needs Ray (pip install 'inferd[ray]'): {exc}"
        ) from None
    if not settings.ray_address:
        raise LauncherUnavailable("--launcher ray needs --ray-address HOST:PORT (the head's GCS)")
    try:
        return RayLauncher(
            address=settings.ray_address,
            namespace=settings.ray_namespace,
            settings=settings.replicas,
            node_ip_address=settings.ray_node_ip_address,
            spread=settings.ray_placement == "spread",
        )
    except (ConnectionError, RuntimeError) as exc:
        raise LauncherUnavailable(
            f"cannot reach the Ray cluster at {settings.ray_address}: {exc}"
        ) from None


def local_launcher(settings: Settings, catalog: Catalog) -> LocalLauncher:
    gpu_types = catalog.gpus.gpu_types
    try:
        declared = parse_declared_gpu_types(settings.gpu_types, gpu_types)
    except ValueError as exc:
        raise LauncherUnavailable(f"--gpu-types: {exc}") from None
    gpus = [
        (gpu, declared.get(gpu.index, declared.get(-1)) or match_gpu_type(gpu, gpu_types))
        for gpu in detect_gpus()
    ]
    for gpu, gpu_type in gpus:
        logger.info(
            "GPU %d: %s -> %s",
            gpu.index,
            gpu.name,
            gpu_type or "(no catalog type: declare one with --gpu-types)",
        )
    return LocalLauncher(
        settings=settings.replicas,
        log_dir=settings.state_dir / "logs",
        gpus=gpus,
        cpu_slots=settings.cpu_replica_slots,
        location=settings.default_location,
    )


class CatalogModels:
    """A catalog model name, resolved for a replica (no weights fetched)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def __call__(self, name: str) -> ModelSource:
        return model_source(self._catalog.models.get(name))


Hook = Callable[[], Awaitable[None]]


@dataclass
class Server:
    settings: Settings
    catalog: Catalog
    store: Store
    admin: AdminAuth
    verifier: TokenVerifier
    registry: Registry
    launcher: Launcher
    series: EndpointSeries
    gateway_state: GatewayState
    journal: ScaleJournal
    endpoint_rows: FollowedEndpoints
    reconciler: Reconciler
    # The endpoints: reads (this instance's copy, records, pages) and commands.
    service: EndpointReads
    endpoint_commands: EndpointCommands
    adapters: AdapterService
    client_tokens: ClientTokenService
    models: ModelService
    accounts: Accounts
    meter_feed: MeterFeed
    sampler: SeriesSampler
    gateway: Gateway
    replica_duty: ReplicaDuty
    # Started each time this instance leads: the flag, then the replicas.
    leader_duties: LeaderDutySet
    coordination: Coordination
    # The Batch API: what its routes call, and the leader duty that runs batches.
    batches: BatchService
    batch_runner: BatchRunner
    project_deletion: ProjectDeletion
    recommendations: RecommendationService
    # Follows the replicas other instances record (None: nobody else does).
    mirror: ReplicaMirror | None = None
    # The control plane's own figures on /metrics (tokens per endpoint, the store's answer).
    tokens: EndpointTokens | None = None
    store_probe: StoreProbe | None = None
    # Plaintext of an admin key generated at the first start: print once.
    generated_admin_key: str | None = None
    # False: the management API alone (tests, benchmarks): no replica is
    # adopted, launched or stopped.
    run_replicas: bool = True
    _followers: list[asyncio.Task[None]] = field(default_factory=list)

    def health(self) -> dict[str, Any]:
        """More for `GET /healthz`: in a cluster, who answered and who leads."""
        return self.coordination.health()

    async def start(self) -> None:
        """In the serving event loop: follow the store, then serve, then
        join the coordination, which starts the leader duties (finish
        deletions a previous leader left, adopt the replicas it left
        running, reconcile) whenever this instance leads: at once alone."""
        self.start_following()
        await self.accounts.start()
        await self.gateway.startup()
        self.sampler.start()
        if self.store_probe is not None:
            self.store_probe.start()
        if self.mirror is not None:
            self._followers.append(asyncio.ensure_future(self.mirror.follow()))
        self._followers.append(asyncio.ensure_future(self.registry.write_rows()))
        await self.coordination.start(self.leader_duties)

    async def stop(self) -> None:
        """The reverse. Leaving the coordination stops the leader duties
        (the reconciler, and the usage meter's replica-seconds up to now,
        before the accounts' last flush); in a cluster the lock goes with
        the session and another instance adopts the replicas, which keep
        running. A cluster of one ends with its instance: a clean stop
        leaves no replica running."""
        await self.sampler.stop()
        if self.store_probe is not None:
            await self.store_probe.stop()
        await self.coordination.stop()
        await self.gateway.shutdown()
        if self.coordination.ends_with_instance:
            await self.replica_duty.end_replicas(self.settings.replica_drain_timeout_seconds)
        await self.accounts.stop()
        await self.stop_following()

    def start_following(self) -> None:
        """Keep the service, token and admin-key copies fresh from the
        store's change feed. Each subscribes, then reloads, so nothing
        committed since they were loaded is missed."""

        async def run(name: str, follow: Callable[[Any], Awaitable[None]], reload: Hook) -> None:
            feed = self.store.changes()
            try:
                await reload()
                await follow(feed)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("%s stopped following the store's changes", name)

        self._followers = [
            asyncio.ensure_future(run("service", self.service.follow, self.service.load)),
            asyncio.ensure_future(run("adapters", self.adapters.follow, self.adapters.load)),
            asyncio.ensure_future(
                run("reconciler's endpoints", self.endpoint_rows.follow, self.endpoint_rows.load)
            ),
            asyncio.ensure_future(run("token cache", self.verifier.follow, self.verifier.load)),
            asyncio.ensure_future(run("admin keys", self.admin.follow, _nothing)),
            asyncio.ensure_future(run("registered models", self.models.follow, self.models.load)),
            asyncio.ensure_future(run("accounts", self.accounts.follow, self.accounts.reload)),
        ]

    async def stop_following(self) -> None:
        for task in self._followers:
            task.cancel()
        for task in self._followers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._followers = []

    async def close(self) -> None:
        await self.stop_following()
        await self.store.close()


async def _nothing() -> None:
    return None


async def build(
    settings: Settings,
    *,
    store: Store | None = None,
    launcher: Launcher | None = None,
    catalog: Catalog | None = None,
    clock: Callable[[], float] = time.monotonic,
    rotate_admin_key: bool = False,
    run_replicas: bool = True,
) -> Server:
    """Every part of the server, in dependency order. `store`, `launcher`,
    `catalog`: given ones replace the configured ones (tests, embedding).
    Raises `StoreError`, `StoreUnavailable` (database unreachable),
    `AdminKeyError`, `CatalogError`, `LauncherUnavailable`."""
    if catalog is None:
        catalog = load_catalog(settings.models_dir, settings.configs_dir)
    if settings.tracing.enabled or tracing.tracer().enabled:
        # Before the gateway is built: it takes the process's tracer.
        tracing.configure(settings.tracing, "inferd-gateway")
    if store is None:
        store = await asyncio.to_thread(open_store, settings.database_url)
    try:
        admin = await provision_admin_key(
            store, settings.admin_key_value(), rotate=rotate_admin_key
        )
        verifier = TokenVerifier(store)
        await verifier.load()
        wakeup = Wakeup()
        # The reconciler's endpoints, followed from the store (each change
        # rings the reconciler for that endpoint).
        endpoint_rows = FollowedEndpoints(store, wakeup.ring)
        await endpoint_rows.load()
        health = settings.registry
        registry = Registry(
            clock=clock,
            health_period_s=health.health_period_s,
            failure_periods=health.failure_periods,
            start_timeout_s=health.start_timeout_s,
            dead_after_s=health.dead_after_s,
            on_change=wakeup.ring,
            # The one writer of replica rows.
            rows=store,
        )
        launcher = launcher or configured_launcher(settings, catalog)
        gateway_knobs = settings.gateway
        # Per-minute figures of each endpoint, recorded by inferd itself.
        series = EndpointSeries()
        gateway_state = GatewayState(gateway_knobs, observers=[AnsweredRequests(series)])
        load = MergedLoad(
            gateway_state,
            registry,
            clock=clock,
            # Other instances' samples (a cluster's) are re-published every interval.
            stale_after_s=max_age(settings.cluster_load_interval_seconds),
        )
        resolver = PrincipalResolver(store, admin.auth.is_valid)
        account_service = AccountService(store, resolver, utc_now)
        meter = UsageMeter()
        journal = ScaleJournal()
        reconciler = Reconciler(
            registry=registry,
            launcher=launcher,
            load=load,
            aborter=gateway_state,
            endpoints=endpoint_rows,
            models=CatalogModels(catalog),
            settings=settings.autoscale,
            wakeup=wakeup,
            clock=clock,
            journal=journal,
            replica_cap=ProjectQuotaCap(account_service, registry),
        )
        coordination = coordination_for(settings, store, gateway_state, load, reconciler, clock)
        flag = LeaderFlag()
        signals = Signals(reconciler, coordination)
        drain = LeaderDrain(
            reconciler, flag, store, timeout_s=settings.replica_drain_timeout_seconds + 30
        )
        endpoint_cache = EndpointCache(store)
        await endpoint_cache.load()
        # Registered models join the catalog before anything uses them.
        models = ModelService(
            store,
            catalog,
            endpoint_cache.rows,
            roots=ModelRoots.parse(settings.model_roots),
            projects=account_service,
        )
        await models.load()
        # One guard for creates and project deletions: its lock is shared.
        guard = ProjectGuard(store)
        service = EndpointReads(
            store,
            endpoint_cache,
            catalog,
            meter,
            public_url=settings.public_url,
            runtime_of=ReplicaViews(registry, reconciler),
        )
        endpoint_commands = EndpointCommands(
            service,
            store,
            endpoint_cache,
            catalog,
            verifier,
            account_service,
            guard,
            models,
            default_location=settings.default_location,
            max_replicas_cap=settings.max_replicas_cap,
            max_endpoints=settings.max_endpoints,
            drain=drain,
            signals=signals,
        )
        accounts = Accounts(
            store,
            resolver,
            account_service,
            meter,
            UsageReads(service, account_service, meter),
            adapter_usage_store=store,
            token_uses=verifier,
        )
        adapters = AdapterService(
            store,
            service,
            lambda name: catalog.models.get(name).source,
            account_service,
            accounts.adapters,
            roots=ModelRoots.parse(settings.model_roots),
        )
        await adapters.load()
        client_tokens = ClientTokenService(store, service, verifier, account_service)
        meter_feed = MeterFeed(meter, registry, EndpointPrices(service), adapters=accounts.adapters)
        sampler = SeriesSampler(series, registry, gateway_state, service.endpoint_ids)
        gateway = Gateway(
            EndpointDirectory(service, registry, reconciler, adapters),
            verifier,
            gateway_knobs,
            clock=clock,
            signals=signals,
            state=gateway_state,
            on_migration=journal.record_migration,
            shared_limits=store,
            catch_up=EndpointCatchUp([verifier, endpoint_cache]),
        )
        # Batches run on the leader, each request through this gateway.
        batch_runner = BatchRunner(
            store, GatewayExecutor(InProcessCaller(gateway)), settings.batches, utc_now
        )
        batches = BatchService(
            store, service.find, settings.batches, utc_now, wake=batch_runner.wake
        )
        replica_duty = ReplicaDuty(
            store, registry, launcher, reconciler, endpoint_commands, meter_feed, run_replicas
        )
        mirror = None
        if not coordination.ends_with_instance:
            mirror = ReplicaMirror(store, registry)
    except BaseException:
        await store.close()
        raise
    return Server(
        settings=settings,
        catalog=catalog,
        store=store,
        admin=admin.auth,
        verifier=verifier,
        registry=registry,
        launcher=launcher,
        series=series,
        gateway_state=gateway_state,
        journal=journal,
        endpoint_rows=endpoint_rows,
        reconciler=reconciler,
        service=service,
        endpoint_commands=endpoint_commands,
        adapters=adapters,
        client_tokens=client_tokens,
        models=models,
        accounts=accounts,
        meter_feed=meter_feed,
        sampler=sampler,
        gateway=gateway,
        generated_admin_key=admin.generated_key,
        run_replicas=run_replicas,
        replica_duty=replica_duty,
        leader_duties=LeaderDutySet([flag, replica_duty, batch_runner]),
        batches=batches,
        batch_runner=batch_runner,
        project_deletion=ProjectDeletion(account_service, guard, models.of_project),
        recommendations=RecommendationService(
            catalog, models, endpoint_commands.check_engine_settings, launcher.capacity
        ),
        coordination=coordination,
        mirror=mirror,
        tokens=EndpointTokens(registry),
        store_probe=StoreProbe(store.schema_version),
    )


def coordination_for(
    settings: Settings,
    store: Store,
    gateway_state: GatewayState,
    load: MergedLoad,
    reconciler: Reconciler,
    clock: Callable[[], float],
) -> Coordination:
    """The one difference between the run modes."""
    if not settings.clustered:
        return Solo(settings.cluster_instance_id, on_wake=reconciler.wake)
    return Postgres(
        settings.database_url,
        settings.cluster_instance_id,
        traffic=lambda: [ep.snapshot() for ep in gateway_state.book.all()],
        on_remote_load=load.publish,
        on_wake=reconciler.wake,
        # No claim before the store's own pool answers (after an outage).
        ready=store.schema_version,
        interval_s=settings.cluster_load_interval_seconds,
        clock=clock,
    )
