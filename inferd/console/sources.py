"""What the console reads and calls: the same service layer as the REST API.

`ConsoleSources` is filled in from the built server (see
`inferd.server.console`); the console never calls its own JSON API over
HTTP. Endpoint reads and writes go through the one endpoint service
(project and role checks, quotas, audit), exactly as the management routes
do. The serving parts (scale journal, series, replicas,
logs) default to empty, so the console's own tests can build it alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from inferd.api.engine_settings import EngineSettings
from inferd.catalog import Catalog, recommend
from inferd.catalog.capacity_fit import Totals, held_to_capacity
from inferd.catalog.models import ModelSpec
from inferd.catalog.recommend import POOLING_KINDS, GpuOption, Recommendation
from inferd.catalog.workload import (
    ChatWorkload,
    ImageWorkload,
    Workload,
    WorkloadOption,
    WorkloadRecommendation,
    recommend_for_workload,
)
from inferd.control.accounts.roles import Action, Principal
from inferd.control.accounts.service import AccountService
from inferd.control.accounts.usage_reads import UsageReads
from inferd.control.batches.model import Batch
from inferd.control.endpoints.client_tokens import ClientTokenService
from inferd.control.endpoints.reads import EndpointReads
from inferd.control.endpoints.service import EndpointCommands
from inferd.control.metrics.timeseries import EndpointSeries
from inferd.control.model import Endpoint as EndpointRow
from inferd.control.replicas.scale_events import ScaleEvent
from inferd.vocab import ModelKind


@dataclass(frozen=True)
class ReplicaLine:
    """A replica as the endpoint page lists it."""

    replica_id: str
    status: str
    since: str
    reason: str | None
    node: str | None = None  # where it runs, as its launcher names it
    # What the engine last reported: its queue, KV cache use, and the prompt
    # tokens looked up in / found in its prefix cache since it started.
    waiting: int = 0
    kv_cache_usage: float | None = None
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    # Since when it has not been heard to serve (routed around while
    # another replica is ready); None while it is.
    unresponsive_since: str | None = None

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        if not self.prefix_cache_queries:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries


def _no_replicas(endpoint_id: str) -> Sequence[ReplicaLine]:
    return ()


@dataclass(frozen=True)
class AdapterLine:
    """A LoRA adapter as the endpoint page lists it."""

    name: str
    rank: int
    source: str
    # The replicas whose engines hold it now (as they last reported).
    held_by: tuple[str, ...] = ()
    # Requests it answered since this instance started (its hourly usage is
    # in the API's /adapters/{name}/usage).
    requests: int = 0


def _no_adapters(endpoint_id: str) -> Sequence[AdapterLine]:
    return ()


def _no_events(endpoint_id: str) -> Sequence[ScaleEvent]:
    return ()


async def _no_log(replica_id: str, max_bytes: int) -> str | None:
    return None


# Batches an endpoint's page lists, newest first.
BATCHES_SHOWN = 20


async def _no_machines() -> Totals:
    return {}


@dataclass(frozen=True)
class RejectedGroup:
    """Options rejected for the same reasons: one line of the table (a
    catalog has dozens rejected for one reason), as `inferd recommend`
    prints them."""

    reasons: str
    options: tuple[AnyOption, ...]

    @property
    def shapes(self) -> str:
        """The options by location: "us-east 1 x L4, 2 x L4; eu-west 1 x L4"."""
        by_location: dict[str, list[str]] = {}
        for o in self.options:
            by_location.setdefault(o.location, []).append(f"{o.gpu_count} x {o.gpu_type}")
        return "; ".join(f"{loc} {', '.join(shapes)}" for loc, shapes in by_location.items())


def rejected_groups(rejected: Sequence[AnyOption]) -> list[RejectedGroup]:
    groups: dict[str, list[AnyOption]] = {}
    for option in rejected:
        groups.setdefault("; ".join(option.reasons), []).append(option)
    return [RejectedGroup(reasons, tuple(options)) for reasons, options in groups.items()]


# The load the create form sizes for until it asks for one: a modest chat
# service, or an image a minute. Stated on the page.
CONSOLE_CHAT_WORKLOAD = ChatWorkload(1.0, 1000, 200)
CONSOLE_IMAGE_WORKLOAD = ImageWorkload(1.0)
AnyRecommendation = Recommendation | WorkloadRecommendation
# (model, workload, location, engine settings) -> the recommendation
# service's answer (`RecommendationService.estimate`; workload None: the
# fixed-concurrency ranking).
Recommender = Callable[[str, Workload | None, str, EngineSettings | None], AnyRecommendation]
AnyOption = GpuOption | WorkloadOption


@dataclass
class ConsoleSources:
    endpoints: EndpointReads
    usage: UsageReads
    accounts: AccountService
    catalog: Catalog
    # "Bearer <key>" -> who it is (raises Unauthorized): the API's resolver.
    resolve: Callable[[str], Awaitable[Principal]]
    public_url: str
    # Cost of an endpoint so far (this month), as the API's `costSoFar`.
    cost_so_far: Callable[[str], float]
    # The project a registered model belongs to (None: global or catalog).
    model_owner: Callable[[str], str | None]
    # The endpoint writes (None: a console that only reads, as its own
    # unit tests build it).
    endpoint_commands: EndpointCommands | None = None
    # Where a new endpoint goes when the form names no location.
    default_location: str = "local"
    series: EndpointSeries = field(default_factory=EndpointSeries)
    scale_events: Callable[[str], Sequence[ScaleEvent]] = _no_events
    replicas: Callable[[str], Sequence[ReplicaLine]] = _no_replicas
    adapters: Callable[[str], Sequence[AdapterLine]] = _no_adapters
    # An endpoint's client tokens (None: a console without them).
    client_tokens: ClientTokenService | None = None
    # An endpoint's newest batches (`BATCHES_SHOWN`), as the Batch API's
    # list reads them (None: a console without the Batch API).
    batches: Callable[[str], Awaitable[Sequence[Batch]]] | None = None
    # The end of a replica's log, read through its launcher (None: none).
    replica_log: Callable[[str, int], Awaitable[str | None]] = _no_log
    # The API's recommendation service (measured profiles, engine settings);
    # None: the recommender on the catalog alone (the console's own tests).
    recommender: Recommender | None = None
    # (location, GPU type) -> CPU replica slots or GPUs of the machines the
    # launcher places replicas on, in all (the API's recommendations are
    # held to them); empty: no machines known.
    capacity: Callable[[], Awaitable[Totals]] = _no_machines

    def recommendation(
        self, model_name: str, location: str, engine_settings: EngineSettings | None = None
    ) -> AnyRecommendation:
        """What the API answers for the model at the console's workload,
        sized with `engine_settings` (an endpoint's own). Embedders and
        cross-encoders have no chat or image workload: their options are the
        fixed-concurrency ranking the API gives without one."""
        model = self.catalog.models.get(model_name)
        work: Workload | None = None
        if model.kind not in POOLING_KINDS:
            image = model.kind == ModelKind.IMAGE
            work = CONSOLE_IMAGE_WORKLOAD if image else CONSOLE_CHAT_WORKLOAD
        if self.recommender is not None:
            return self.recommender(model_name, work, location, engine_settings)
        if work is None:
            return recommend(model, self.catalog.gpus, location, engine_settings=engine_settings)
        return recommend_for_workload(
            model, self.catalog.gpus, work, location, engine_settings=engine_settings
        )

    def placeable(
        self,
        model_name: str,
        location: str,
        totals: Totals,
        engine_settings: EngineSettings | None = None,
    ) -> AnyRecommendation:
        """`recommendation`, held to the machines replicas are placed on as
        the API's answer is (`totals`: `capacity()`): an option needing more
        CPU replica slots or GPUs than a known location holds is rejected,
        saying what it needs and what there is."""
        rec = self.recommendation(model_name, location, engine_settings)
        return held_to_capacity(rec, totals)

    def models_for(self, principal: Principal) -> list[ModelSpec]:
        """The models the principal may know of: global and catalog ones and
        those of its projects (never another project's)."""
        return [
            m
            for m in self.catalog.models.all()
            if (owner := self.model_owner(m.name)) is None or principal.sees(owner)
        ]

    def option(self, row: EndpointRow) -> AnyOption | None:
        """The recommender's estimate for an endpoint's own GPU choice, under
        its own engine settings."""
        if row.model_name not in self.catalog.models:
            return None
        rec = self.recommendation(row.model_name, row.location_name, row.engine_settings)
        for opt in (*rec.options, *rec.rejected):
            if (opt.gpu_type, opt.gpu_count) == (row.gpu_type, row.gpu_count):
                return opt
        return None

    def commands(self) -> EndpointCommands:
        if self.endpoint_commands is None:
            raise RuntimeError("this console was built without endpoint writes")
        return self.endpoint_commands

    async def projects(self, principal: Principal) -> list[str]:
        return [p.id for p in await self.accounts.projects(principal)]

    async def writable_projects(self, principal: Principal) -> list[str]:
        return [p for p in await self.projects(principal) if principal.may(Action.WRITE, p)]
