"""The one composition of `inferd serve`: every part, built in dependency order.

`await build(settings)` opens the store and constructs each part once, each
from parts already built, so nothing is assigned after construction and no
callback points at something that does not exist yet:

    catalog, store -> admin keys, token verifier -> registry (rings a Wakeup)
    -> launcher -> endpoint series -> gateway state (traffic, connections,
    metrics; its metrics feed the series) -> load observations -> principal
    resolver, account service, usage meter, project quota cap, scale journal
    -> reconciler (ScaleSignals; reads endpoints from the store; capped by
    the quotas; journals each change of desired replicas) -> endpoint
    service (tells the reconciler; shows the registry's replicas) ->
    registered models -> project-aware endpoints, accounts, meter feed
    (registry -> meter), series sampler (registry, gateway state, service)
    -> endpoint directory -> gateway (asks the reconciler for capacity)

`Server.start()`/`stop()` run in the serving event loop (the app lifespan);
`inferd.server.app.create_app` only puts HTTP routes on a built server.

With a PostgreSQL store, the server is one instance of a cluster
(`ClusterMember`): it publishes its load and takes part in the leader
election, and runs the reconciler (and samples the replicas' GPU time for
usage) only while it leads; its registry follows the replicas in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from inferd.catalog import Catalog, load_catalog
from inferd.catalog.roots import ModelRoots
from inferd.control.accounts.endpoints import ProjectEndpoints
from inferd.control.accounts.meter_feed import MeterFeed
from inferd.control.accounts.metering import UsageMeter
from inferd.control.accounts.model import utc_now
from inferd.control.accounts.plane import Accounts, EndpointPrices, ProjectQuotaCap
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.service import AccountService
from inferd.control.launchers.inventory import detect_gpus, match_gpu_type
from inferd.control.launchers.local import LocalLauncher
from inferd.control.leader import LeaderInfo, PostgresElection
from inferd.control.load import STALE_AFTER_S, MergedLoad
from inferd.control.loadshare import max_age
from inferd.control.model import ReplicaRecord
from inferd.control.model_service import ModelService
from inferd.control.ports import Launcher, Store
from inferd.control.reconciler import Reconciler
from inferd.control.registry import Registry
from inferd.control.replica_mirror import ReplicaMirror
from inferd.control.scale_events import ScaleJournal
from inferd.control.series_feed import AnsweredRequests, SeriesSampler
from inferd.control.service import EndpointService
from inferd.control.signals import Wakeup
from inferd.control.stores import open_store
from inferd.control.timeseries import EndpointSeries
from inferd.control.tokens import TokenVerifier
from inferd.control.views import EndpointDirectory, ReplicaViews
from inferd.gateway.app import Gateway
from inferd.gateway.state import GatewayState
from inferd.replica.config import ModelSource, model_source
from inferd.server.auth import AdminAuth, provision_admin_key
from inferd.server.cluster import (
    ClusterDrain,
    ClusterLoadFeed,
    ClusterSignals,
    LeaderDutySet,
    LeaderFlag,
    LoadPublisher,
)
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
        )
    except (ConnectionError, RuntimeError) as exc:
        raise LauncherUnavailable(
            f"cannot reach the Ray cluster at {settings.ray_address}: {exc}"
        ) from None


def local_launcher(settings: Settings, catalog: Catalog) -> LocalLauncher:
    gpu_types = catalog.gpus.gpu_types
    gpus = [(gpu, match_gpu_type(gpu, gpu_types)) for gpu in detect_gpus()]
    for gpu, gpu_type in gpus:
        logger.info("GPU %d: %s -> %s", gpu.index, gpu.name, gpu_type or "(no catalog type)")
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


class ReplicaDuty:
    """What only one instance may do: adopt the replicas in the store that
    this launcher does not watch yet (all of them at a first start; a dead
    leader's, for its successor), then reconcile. Started at start-up by a
    single instance, on each election in a cluster."""

    def __init__(
        self,
        store: Store,
        launcher: Launcher,
        reconciler: Reconciler,
        service: EndpointService,
        meter_feed: MeterFeed,
        clustered: bool,
    ) -> None:
        self._store = store
        self._launcher = launcher
        self._reconciler = reconciler
        self._service = service
        # Replica-seconds are sampled where the replicas are reconciled: by
        # one instance, so that a cluster does not count them twice.
        self._meter_feed = meter_feed
        self._clustered = clustered

    async def start(self, term: int) -> None:
        # The leader's replica writes carry its term, so that they are
        # refused once another instance leads; a single instance has none.
        fence = term if self._clustered else None
        if self._clustered:
            await self._service.finish_pending_deletions()
        records = await self._store.list_replicas()
        # Those it watches already stay as they are (this instance led
        # before, lost the lead in a database outage, and leads again).
        watched = set(self._reconciler.running())
        records = [record for record in records if record.id not in watched]
        endpoints = await self._store.list_endpoints()
        adopted = set(await self._reconciler.adopt(records, endpoints))
        sweep = getattr(self._launcher, "sweep_orphans", None)
        if sweep is not None:  # a cluster may hold replicas the store never recorded
            await sweep(
                adopted | watched | await self._recorded_since(records), self._confirm(fence)
            )
        for record in records:
            if record.id not in adopted:
                await self._store.delete_replica(record.id, term=fence)
        if records:
            logger.info("adopted %d of %d replicas", len(adopted), len(records))
        self._reconciler.start(fence)
        self._meter_feed.start()

    async def _recorded_since(self, records: list[ReplicaRecord]) -> set[str]:
        """Replicas recorded after `records` was read: a successor's, should
        this instance have lost the lead meanwhile; never orphans."""
        seen = {record.id for record in records}
        return {r.id for r in await self._store.list_replicas() if r.id not in seen}

    def _confirm(self, fence: int | None) -> Callable[[], Awaitable[None]]:
        async def confirm() -> None:
            if fence is not None:
                await self._store.confirm_term(fence)

        return confirm

    async def stop(self) -> None:
        await self._meter_feed.stop()
        await self._reconciler.stop()


@dataclass
class ClusterMember:
    """This instance's part in a cluster of instances on one PostgreSQL."""

    instance_id: str
    election: PostgresElection
    publisher: LoadPublisher
    mirror: ReplicaMirror

    def health(self) -> dict[str, Any]:
        info: LeaderInfo | None = self.election.info
        leading = self.election.leading
        return {
            "instance": self.instance_id,
            "leader": {
                "instance": self.instance_id if leading else (info.holder if info else None),
                "term": info.term if info else None,
                "self": leading,
            },
        }


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
    reconciler: Reconciler
    service: EndpointService
    models: ModelService
    accounts: Accounts
    meter_feed: MeterFeed
    sampler: SeriesSampler
    gateway: Gateway
    replica_duty: ReplicaDuty
    # Plaintext of an admin key generated at the first start: print once.
    generated_admin_key: str | None = None
    # False: the management API alone (tests, benchmarks): no replica is
    # adopted, launched or stopped.
    run_replicas: bool = True
    cluster: ClusterMember | None = None
    _followers: list[asyncio.Task[None]] = field(default_factory=list)

    def health(self) -> dict[str, Any]:
        """More for `GET /healthz`: in a cluster, who answered and who leads."""
        return self.cluster.health() if self.cluster is not None else {}

    async def start(self) -> None:
        """In the serving event loop: follow the store, finish deletions a
        previous run left, adopt the replicas it left running, start
        reconciling (in a cluster: each time this instance is elected)."""
        self.start_following()
        await self.accounts.start()
        await self.gateway.startup()
        self.sampler.start()
        if self.cluster is not None:
            cluster = self.cluster
            cluster.publisher.start()
            self._followers.append(asyncio.ensure_future(cluster.mirror.follow()))
            cluster.election.start()
            return
        await self.service.finish_pending_deletions()
        if not self.run_replicas:
            return
        await self.replica_duty.start(0)

    async def stop(self) -> None:
        await self.sampler.stop()
        if self.cluster is not None:
            # Leader duties stop and the lock goes with the session: another
            # instance takes over at once and adopts the replicas, which keep
            # running (they are the cluster's, not this instance's).
            await self.cluster.election.stop()
            await self.cluster.publisher.stop()
            await self.gateway.shutdown()
            await self.accounts.stop()
            await self.stop_following()
            return
        # The reconciler, and the usage meter's replica-seconds up to now
        # (before the accounts' last flush).
        await self.replica_duty.stop()
        await self.gateway.shutdown()
        if self.run_replicas:
            # Embedded mode owns its replicas: a clean stop leaves none running.
            await self.launcher.shutdown(self.settings.replica_drain_timeout_seconds)
            for replica in self.registry.all():
                self.registry.remove(replica.replica_id)
                await self.store.delete_replica(replica.replica_id)
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
    if store is None:
        store = await asyncio.to_thread(open_store, settings.database_url)
    try:
        admin = await provision_admin_key(
            store, settings.admin_key_value(), rotate=rotate_admin_key
        )
        verifier = TokenVerifier(store)
        await verifier.load()
        wakeup = Wakeup()
        health = settings.registry
        registry = Registry(
            clock=clock,
            health_period_s=health.health_period_s,
            failure_periods=health.failure_periods,
            start_timeout_s=health.start_timeout_s,
            on_change=wakeup.ring,
        )
        launcher = launcher or configured_launcher(settings, catalog)
        gateway_knobs = settings.gateway
        # Per-minute figures of each endpoint, recorded by inferd itself.
        series = EndpointSeries()
        gateway_state = GatewayState(gateway_knobs, observers=[AnsweredRequests(series)])
        interval = settings.cluster_load_interval_seconds
        load = MergedLoad(
            gateway_state,
            registry,
            clock=clock,
            # Other instances' samples are re-published every interval.
            stale_after_s=max_age(interval) if settings.clustered else STALE_AFTER_S,
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
            records=store,
            endpoints=store.list_endpoints,
            models=CatalogModels(catalog),
            settings=settings.autoscale,
            wakeup=wakeup,
            clock=clock,
            journal=journal,
            replica_cap=ProjectQuotaCap(account_service, registry),
        )
        cluster = None
        signals: Any = reconciler
        drain: Any = reconciler
        flag = LeaderFlag()
        publisher = None
        if settings.clustered:
            publisher = _load_publisher(settings, gateway_state, clock)
            signals = ClusterSignals(reconciler, publisher)
            drain = ClusterDrain(
                reconciler,
                flag.leading,
                store,
                timeout_s=settings.replica_drain_timeout_seconds + 30,
            )
        service = EndpointService(
            store,
            catalog,
            verifier,
            public_url=settings.public_url,
            default_location=settings.default_location,
            max_replicas_cap=settings.max_replicas_cap,
            max_endpoints=settings.max_endpoints,
            runtime_of=ReplicaViews(registry, reconciler),
            drain=drain,
            signals=signals,
            capacity_of=launcher.capacity,
        )
        await service.load()
        # Registered models join the catalog before anything uses them.
        models = ModelService(
            store, catalog, service.rows, roots=ModelRoots.parse(settings.model_roots)
        )
        await models.load()
        accounts = Accounts(
            store,
            resolver,
            account_service,
            meter,
            ProjectEndpoints(service, account_service, meter, utc_now, models),
        )
        meter_feed = MeterFeed(meter, registry, EndpointPrices(service))
        sampler = SeriesSampler(series, registry, gateway_state, service.endpoint_ids)
        gateway = Gateway(
            EndpointDirectory(service, registry),
            verifier,
            gateway_knobs,
            clock=clock,
            signals=signals,
            state=gateway_state,
        )
        replica_duty = ReplicaDuty(
            store, launcher, reconciler, service, meter_feed, settings.clustered
        )
        if publisher is not None:
            cluster = _cluster_member(
                settings, store, registry, load, reconciler, publisher, flag, replica_duty, clock
            )
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
        reconciler=reconciler,
        service=service,
        models=models,
        accounts=accounts,
        meter_feed=meter_feed,
        sampler=sampler,
        gateway=gateway,
        generated_admin_key=admin.generated_key,
        run_replicas=run_replicas,
        replica_duty=replica_duty,
        cluster=cluster,
    )


def _load_publisher(
    settings: Settings, gateway_state: GatewayState, clock: Callable[[], float]
) -> LoadPublisher:
    return LoadPublisher(
        settings.database_url,
        settings.cluster_instance_id,
        lambda: [ep.snapshot() for ep in gateway_state.book.all()],
        settings.cluster_load_interval_seconds,
        clock,
    )


def _cluster_member(
    settings: Settings,
    store: Store,
    registry: Registry,
    load: MergedLoad,
    reconciler: Reconciler,
    publisher: LoadPublisher,
    flag: LeaderFlag,
    replica_duty: ReplicaDuty,
    clock: Callable[[], float],
) -> ClusterMember:
    url = settings.database_url
    instance_id = settings.cluster_instance_id
    interval = settings.cluster_load_interval_seconds
    feed = ClusterLoadFeed(url, instance_id, load.publish, reconciler.wake, interval, clock)
    # Started in this order on election, stopped in reverse when it ends.
    election = PostgresElection(url, instance_id, LeaderDutySet([flag, feed, replica_duty]))
    mirror = ReplicaMirror(
        store,
        registry,
        settings.health_period_seconds,
        heartbeats_needed=lambda: not flag.leading(),
        clock=clock,
    )
    return ClusterMember(instance_id, election, publisher, mirror)
