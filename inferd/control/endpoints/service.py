"""The endpoint service: create, read, change and delete endpoints, re-issue
their access tokens, as a principal may.

Every operation checks who may act on which project's endpoints: another
project's endpoint is answered exactly like one that does not exist (404,
same message); a role that may not act gets 403. A create or change is
authorized, placed once (catalog and recommender), checked against the
project's quota on that placement, written (the endpoint row and its token in
one transaction), signalled to the reconciler and audited. The HTTP routes and
the console both call this service.

Reads are served from this instance's copy (`EndpointCache`). The record, with
its project and cost so far, is built once per change and rendered once; a
write returns only after the commit is durable, and a database that is away
makes writes answer 503 while reads go on from memory.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from inferd.api.engine_settings import NO_ENGINE_SETTINGS, EngineSettings
from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.catalog import Catalog
from inferd.catalog.models import ModelSpec
from inferd.control.accounts.metering import UsageMeter
from inferd.control.accounts.model import DEFAULT_PROJECT, AuditAction
from inferd.control.accounts.project_guard import ProjectGuard
from inferd.control.accounts.quota import EndpointShape
from inferd.control.accounts.roles import Action, Principal, authorize, project_to_write
from inferd.control.accounts.service import AccountService
from inferd.control.endpoints.cache import EndpointCache
from inferd.control.endpoints.checks import check_scaling, model_not_usable, name_taken, not_found
from inferd.control.endpoints.engine_checks import check_engine_settings, check_engine_settings_on
from inferd.control.endpoints.placement import Placement, placement_for_change, resolve_placement
from inferd.control.endpoints.records import (
    DEFAULT_IMAGE_SIZE,
    EndpointRuntime,
    build_record,
    derive_status,
)
from inferd.control.endpoints.tokens import TokenVerifier, hash_token, new_endpoint_token
from inferd.control.model import (
    Change,
    DuplicateName,
    Endpoint,
    EndpointChanges,
    EndpointGone,
    StoreUnavailable,
    utc_now,
)
from inferd.control.paging import EndpointFilter, Page
from inferd.control.ports import Capacity, EndpointStore, TokenStore
from inferd.errors import BadRequest, Conflict, NotFound
from inferd.vocab import ModelKind

logger = logging.getLogger(__name__)

# What the service learns from the serving side, given at construction: the
# replicas of an endpoint (for its record), and the drain that must finish
# before a deleted endpoint's row goes.
RuntimeOf = Callable[[str], EndpointRuntime]

# A status filter is applied to records, not in the store (status is derived
# from the replicas): one page reads at most this many store rows per item
# asked for before it answers, possibly short, with a cursor to go on from.
STATUS_SCAN_FACTOR = 10


class Drain(Protocol):
    async def drain_endpoint(self, endpoint_id: str) -> None: ...


class EndpointSignals(Protocol):
    """`ScaleSignals.endpoint_changed`: the reconciler acts at once."""

    def endpoint_changed(self, endpoint_id: str) -> None: ...


class ModelOwners(Protocol):
    """Which models an endpoint of a project may serve (`ModelService`)."""

    def usable_in(self, name: str, project_id: str) -> bool: ...


class NoReplicas:
    """The serving side of a control plane that runs no replicas (the
    management API alone): no replicas to show, none to drain, nobody to tell."""

    def __call__(self, endpoint_id: str) -> EndpointRuntime:
        return EndpointRuntime()

    async def drain_endpoint(self, endpoint_id: str) -> None:
        return None

    def endpoint_changed(self, endpoint_id: str) -> None:
        return None

    async def capacity(self) -> Capacity:
        return Capacity()


NO_REPLICAS = NoReplicas()


def render_json(value: Any) -> bytes:
    """The bytes Starlette's JSONResponse would send for `value`."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class ServiceStore(EndpointStore, TokenStore, Protocol):
    """What the service writes to: endpoints and their tokens."""


def _settings_after(row: Endpoint, req: UpdateEndpointRequest) -> EngineSettings:
    if req.engineSettings is None:
        return row.engine_settings
    return row.engine_settings.merged(req.engineSettings)


class EndpointService:
    def __init__(
        self,
        store: ServiceStore,
        cache: EndpointCache,
        catalog: Catalog,
        verifier: TokenVerifier,
        accounts: AccountService,
        guard: ProjectGuard,
        meter: UsageMeter,
        models: ModelOwners,
        *,
        public_url: str,
        default_location: str,
        max_replicas_cap: int,
        max_endpoints: int = 10_000,
        runtime_of: RuntimeOf = NO_REPLICAS,
        drain: Drain = NO_REPLICAS,
        signals: EndpointSignals = NO_REPLICAS,
        capacity_of: Callable[[], Awaitable[Capacity]] = NO_REPLICAS.capacity,
        clock: Callable[[], datetime] = utc_now,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        """`runtime_of`, `drain`, `signals`, `capacity_of`: the serving side (the
        registry's replicas, the reconciler, the launcher's live capacity by
        location and GPU type); left out, the service runs no replicas."""
        self._store = store
        self._cache = cache
        self.catalog = catalog
        self.verifier = verifier
        self._accounts = accounts
        self._guard = guard
        self._meter = meter
        self._models = models
        self.public_url = public_url
        self.default_location = default_location
        self.max_replicas_cap = max_replicas_cap
        self.max_endpoints = max_endpoints
        self.runtime_of = runtime_of
        self._drain = drain
        self._signals = signals
        self.capacity_of = capacity_of
        self._clock = clock
        self._new_id = new_id

    # --- the copy ------------------------------------------------------------------------

    async def load(self) -> None:
        await self._cache.load()

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        await self._cache.follow(feed)

    def rows(self) -> list[Endpoint]:
        return self._cache.rows()

    def endpoint_ids(self) -> list[str]:
        return self._cache.endpoint_ids()

    def find(self, endpoint_id: str) -> Endpoint | None:
        return self._cache.find(endpoint_id)

    def find_by_name(self, name: str, project_id: str = DEFAULT_PROJECT) -> Endpoint | None:
        return self._cache.find_by_name(project_id, name)

    def row(self, endpoint_id: str) -> Endpoint:
        row = self._cache.find(endpoint_id)
        if row is None:
            raise not_found(endpoint_id)
        return row

    # --- access ----------------------------------------------------------------------------

    def endpoint(self, principal: Principal, endpoint_id: str, action: Action) -> Endpoint:
        """The endpoint, if `principal` may do `action` on it."""
        row = self.row(endpoint_id)
        authorize(principal, row.project_id, action, hidden=not_found(endpoint_id))
        return row

    def visible(self, principal: Principal, project_id: str | None = None) -> list[Endpoint]:
        return [
            r
            for r in self._cache.rows()
            if principal.sees(r.project_id) and (project_id is None or r.project_id == project_id)
        ]

    # --- records ---------------------------------------------------------------------------

    def _image_size(self, row: Endpoint) -> str:
        # The model's own default size, so the example works as pasted; a
        # model gone from the catalog since creation falls back to 1024x1024.
        if row.model_kind == ModelKind.IMAGE and row.model_name in self.catalog.models:
            size = self.catalog.models.get(row.model_name).default_size
            if size is not None:
                return f"{size[0]}x{size[1]}"
        return DEFAULT_IMAGE_SIZE

    def _cost(self, row: Endpoint) -> float:
        return round(self._meter.cost_so_far(row.id), 6)

    def _build(self, row: Endpoint, runtime: EndpointRuntime, cost: float) -> dict[str, Any]:
        return build_record(
            row,
            self.public_url,
            runtime.replicas,
            image_size=self._image_size(row),
            waiting_for=runtime.waiting_for,
            last_failure=runtime.last_failure,
            replacing=runtime.replacing,
            cost_so_far=cost,
        )

    def record_of(self, row: Endpoint) -> dict[str, Any]:
        return self._build(row, self.runtime_of(row.id), self._cost(row))

    def record(self, endpoint_id: str) -> dict[str, Any]:
        return self.record_of(self.row(endpoint_id))

    def record_json(self, row: Endpoint) -> bytes:
        """The record of `row` as JSON bytes, rendered once for everything it
        is computed from: the row object (frozen, replaced on every change),
        the replicas' views (frozen, compared by value) and the cost so far."""
        runtime, cost = self.runtime_of(row.id), self._cost(row)
        key = (row, runtime, cost)
        data = self._cache.rendered(row.id, key)
        if data is None:
            data = render_json(self._build(row, runtime, cost))
            self._cache.keep_rendered(row.id, key, data)
        return data

    def status_of(self, row: Endpoint) -> str:
        """The record's `status` (the list's status filter), without building it."""
        runtime = self.runtime_of(row.id)
        derived = derive_status(row, runtime.replicas, runtime.waiting_for, runtime.replacing)
        return derived.status.value

    # --- reads -----------------------------------------------------------------------------

    def get_json(self, principal: Principal, endpoint_id: str) -> bytes:
        return self.record_json(self.endpoint(principal, endpoint_id, Action.READ))

    async def visible_page(
        self,
        principal: Principal,
        where: EndpointFilter,
        after: int | None,
        limit: int,
        keep: Callable[[Endpoint], bool] | None = None,
    ) -> Page[Endpoint]:
        """One page of the endpoints `principal` sees, in the store's keyset
        order, and where the next page starts (None: the end). `where` selects
        in the store, narrowed to the principal's projects; `keep`, a condition
        the store cannot apply (the derived status), is applied to the rows
        read, reading at most STATUS_SCAN_FACTOR pages' worth: a page may then
        hold fewer than `limit` and still not be the last."""
        if not principal.operator:
            seen = frozenset(principal.roles)
            scope = seen if where.project_ids is None else seen & where.project_ids
            where = replace(where, project_ids=scope)
        rows: list[Endpoint] = []
        budget = limit * STATUS_SCAN_FACTOR
        while True:
            page = await self.page(where, after, limit - len(rows))
            budget -= len(page.items)
            rows.extend(row for row in page.items if keep is None or keep(row))
            after = page.after
            if after is None or len(rows) >= limit or budget <= 0:
                return Page(rows, after)

    async def page_json(
        self,
        principal: Principal,
        where: EndpointFilter,
        status: str | None,
        after: int | None,
        limit: int,
    ) -> tuple[bytes, int | None]:
        """One page of the endpoints `principal` sees (JSON records, without
        the list's envelope) and where the next page starts (None: the end)."""

        def in_status(row: Endpoint) -> bool:
            return self.status_of(row) == status

        page = await self.visible_page(
            principal, where, after, limit, None if status is None else in_status
        )
        return b",".join(self.record_json(row) for row in page.items), page.after

    async def page(self, where: EndpointFilter, after: int | None, limit: int) -> Page[Endpoint]:
        """A page of endpoints: which ones, from the store's keyset; their
        rows from this copy (as `record` answers them), or from the store for
        one this copy has not heard of yet (another instance's create)."""
        try:
            page = await self._store.page_endpoint_ids(where, after, limit)
        except StoreUnavailable:
            return self._page_from_copy(where, after, limit)
        rows: list[Endpoint] = []
        for endpoint_id in page.items:
            row = self._cache.find(endpoint_id) or await self._store.get_endpoint(endpoint_id)
            if row is not None:  # None: deleted since the page was read
                rows.append(row)
        return Page(rows, page.after)

    def _page_from_copy(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[Endpoint]:
        """While the store is down, reads go on from this instance's copy (as
        `record` does), as long as the answer is one whole list: a cursor is
        a store position, which the copy does not know."""
        matching = [row for row in self._cache.rows() if where.matches(row)]
        if after is not None or len(matching) > limit:
            raise StoreUnavailable(
                "The database is unreachable: only a list that fits one page can be answered "
                "from this instance's copy meanwhile."
            )
        return Page(matching, None)

    # --- writes ----------------------------------------------------------------------------

    def _model_or_none(self, name: str) -> ModelSpec | None:
        return self.catalog.models.get(name) if name in self.catalog.models else None

    def check_engine_settings(self, model_name: str, settings: EngineSettings) -> None:
        """400 naming the setting the model cannot run with (an unknown model
        is left to placement, which names `modelName`)."""
        model = self._model_or_none(model_name)
        if model is not None:
            check_engine_settings(settings, model, self._model_or_none)

    def _place(
        self,
        model_name: str,
        location: str,
        gpu_type: str | None,
        gpu_count: int | None,
        engine_settings: EngineSettings | None = None,
    ) -> Placement:
        return resolve_placement(
            self.catalog,
            model_name=model_name,
            location_name=location,
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            engine_settings=engine_settings,
        )

    def _fits_with(self, row: Endpoint, engine_settings: EngineSettings) -> None:
        """New settings on the endpoint's GPUs: a 400 naming them if the
        model, as the engine would hold it, no longer fits."""
        try:
            self._place(
                row.model_name, row.location_name, row.gpu_type, row.gpu_count, engine_settings
            )
        except BadRequest as exc:
            if exc.code != "model_does_not_fit":
                raise
            raise BadRequest(
                f"With these engine settings: {exc.message}", param="engineSettings", code=exc.code
            ) from None

    def _check_draft(self, settings: EngineSettings | None, project_id: str) -> None:
        """A draft model is a use of a model, as `modelName` is: another
        project's is answered as unknown."""
        speculative = None if settings is None else settings.speculativeDecoding
        if speculative is not None and not self._models.usable_in(
            speculative.draftModel, project_id
        ):
            error = model_not_usable(speculative.draftModel, project_id)
            error.param = "engineSettings.speculativeDecoding.draftModel"
            raise error

    async def create(
        self, principal: Principal, req: CreateEndpointRequest, project_id: str | None
    ) -> tuple[dict[str, Any], str]:
        """The record and the plaintext token (which is never stored)."""
        project_id = project_to_write(principal, project_id)
        await self._accounts.project(principal, project_id)
        authorize(
            principal,
            project_id,
            Action.WRITE,
            hidden=NotFound(
                f"No project '{project_id}'.", param="projectId", code="project_not_found"
            ),
        )
        if not self._models.usable_in(req.modelName, project_id):
            raise model_not_usable(req.modelName, project_id)
        self._check_draft(req.engineSettings, project_id)
        location = req.locationName or self.default_location
        placement = self._place(
            req.modelName, location, req.gpuType, req.gpuCount, req.engineSettings
        )
        max_replicas = req.maxReplicas if req.maxReplicas is not None else max(1, req.minReplicas)
        shape = EndpointShape("", placement.gpu_type, placement.gpu_count, req.minReplicas)
        async with self._guard.exclusive(project_id):
            await self._guard.check_quota(project_id, shape, max_replicas, new_endpoint=True)
            check_scaling(req.minReplicas, max_replicas, self.max_replicas_cap)
            engine_settings = req.engineSettings or NO_ENGINE_SETTINGS
            self.check_engine_settings(req.modelName, engine_settings)
            check_engine_settings_on(engine_settings, placement.gpu_type)
            row, token = await self._insert(
                req, project_id, placement, max_replicas, engine_settings
            )
        self._signals.endpoint_changed(row.id)
        logger.info("created endpoint %s (%s) for %s", row.id, row.name, row.model_name)
        await self._accounts.audit_event(
            principal, AuditAction.ENDPOINT_CREATE, project_id, f"endpoint:{row.id}",
            name=req.name, modelName=row.model_name, gpuType=row.gpu_type,
            minReplicas=row.min_replicas, maxReplicas=row.max_replicas,
        )  # fmt: skip
        return self.record_of(row), token

    async def _insert(
        self,
        req: CreateEndpointRequest,
        project_id: str,
        placement: Placement,
        max_replicas: int,
        engine_settings: EngineSettings,
    ) -> tuple[Endpoint, str]:
        async with self._cache.lock:
            if self._cache.find_by_name(project_id, req.name) is not None:
                raise name_taken(req.name, project_id)
            if len(self._cache) >= self.max_endpoints:
                raise Conflict(
                    f"This server holds at most {self.max_endpoints} endpoints.",
                    code="endpoint_limit_reached",
                )
            now = self._clock()
            row = Endpoint(
                id=self._new_id(),
                name=req.name,
                model_name=placement.model_name,
                model_kind=placement.model_kind,
                gpu_type=placement.gpu_type,
                gpu_count=placement.gpu_count,
                location_name=placement.location,
                min_replicas=req.minReplicas,
                max_replicas=max_replicas,
                retention_seconds=req.scaleToZeroRetentionPeriodSeconds,
                hourly_price=placement.hourly_price,
                currency=placement.currency,
                created_at=now,
                updated_at=now,
                project_id=project_id,
                engine_settings=engine_settings,
            )
            token = new_endpoint_token()
            digest = hash_token(token)
            try:
                await self._store.insert_endpoint(row, digest)
            except DuplicateName:
                raise name_taken(req.name, project_id) from None
            self._cache.put(row)
            self.verifier.set_active(row.id, digest)
        return row, token

    async def update(
        self, principal: Principal, endpoint_id: str, req: UpdateEndpointRequest
    ) -> dict[str, Any]:
        project_id = self.endpoint(principal, endpoint_id, Action.WRITE).project_id
        self._check_draft(req.engineSettings, project_id)
        async with self._guard.exclusive(project_id):
            # Read again under the lock: the change applies to the row as it is.
            row = self.row(endpoint_id)
            placement = placement_for_change(
                self.catalog, row, req.gpuType, req.gpuCount, _settings_after(row, req)
            )
            now = row if placement is None else placement
            min_replicas = row.min_replicas if req.minReplicas is None else req.minReplicas
            max_replicas = row.max_replicas if req.maxReplicas is None else req.maxReplicas
            shape = EndpointShape(row.id, now.gpu_type, now.gpu_count, min_replicas)
            await self._guard.check_quota(project_id, shape, max_replicas, new_endpoint=False)
            row = await self._change(endpoint_id, req, placement)
        changed = req.model_dump(exclude_none=True)
        if req.engineSettings is not None:
            # As asked: a null clears a setting, and the audit says so.
            changed["engineSettings"] = req.engineSettings.model_dump(exclude_unset=True)
        await self._accounts.audit_event(
            principal, AuditAction.ENDPOINT_UPDATE, project_id, f"endpoint:{row.id}", **changed
        )
        return self.record_of(row)

    async def _change(
        self, endpoint_id: str, req: UpdateEndpointRequest, placement: Placement | None
    ) -> Endpoint:
        async with self._cache.lock:
            row = self._writable(endpoint_id)
            min_replicas = row.min_replicas if req.minReplicas is None else req.minReplicas
            max_replicas = row.max_replicas if req.maxReplicas is None else req.maxReplicas
            check_scaling(min_replicas, max_replicas, self.max_replicas_cap)
            wanted: dict[str, Any] = {"min_replicas": min_replicas, "max_replicas": max_replicas}
            if req.scaleToZeroRetentionPeriodSeconds is not None:
                wanted["retention_seconds"] = req.scaleToZeroRetentionPeriodSeconds
            engine_settings = _settings_after(row, req)
            if engine_settings != row.engine_settings:
                self.check_engine_settings(row.model_name, engine_settings)
                if placement is None:
                    self._fits_with(row, engine_settings)
                # Replicas take their settings at start: new ones replace them.
                wanted.update(engine_settings=engine_settings, generation=row.generation + 1)
            moved = placement is not None and (placement.gpu_type, placement.gpu_count) != (
                row.gpu_type, row.gpu_count)  # fmt: skip
            if moved or engine_settings != row.engine_settings:
                check_engine_settings_on(engine_settings, (placement or row).gpu_type)
            # Only a new GPU type or count replaces the replicas (a new generation).
            if placement is not None and moved:
                wanted.update(
                    gpu_type=placement.gpu_type,
                    gpu_count=placement.gpu_count,
                    hourly_price=placement.hourly_price,
                    currency=placement.currency,
                    generation=row.generation + 1,
                )
            wanted = {k: v for k, v in wanted.items() if getattr(row, k) != v}
            if not wanted:
                return row
            changes = EndpointChanges(updated_at=self._clock(), **wanted)
            try:
                row = await self._store.update_endpoint(endpoint_id, changes)
            except EndpointGone:
                raise not_found(endpoint_id) from None
            self._cache.put(row)
        self._signals.endpoint_changed(endpoint_id)
        return row

    async def reissue_token(self, principal: Principal, endpoint_id: str) -> str:
        row = self.endpoint(principal, endpoint_id, Action.WRITE)
        async with self._cache.lock:
            self._writable(endpoint_id)
            token = new_endpoint_token()
            digest = hash_token(token)
            try:
                await self._store.replace_token(endpoint_id, digest, self._clock())
            except EndpointGone:
                raise not_found(endpoint_id) from None
            # After the commit and before the answer: the old token fails from now on.
            self.verifier.set_active(endpoint_id, digest)
        logger.info("re-issued the access token of endpoint %s", endpoint_id)
        await self._accounts.audit_event(
            principal, AuditAction.TOKEN_REISSUE, row.project_id, f"endpoint:{row.id}"
        )
        return token

    async def delete(self, principal: Principal, endpoint_id: str) -> None:
        """Mark deleting (tokens stop working), drain replicas, then remove the row."""
        row = self.endpoint(principal, endpoint_id, Action.WRITE)
        await self._accounts.audit_event(
            principal, AuditAction.ENDPOINT_DELETE, row.project_id, f"endpoint:{row.id}",
            name=row.name,
        )  # fmt: skip
        async with self._cache.lock:
            self.row(endpoint_id)
            try:
                row = await self._store.mark_deleting(endpoint_id, self._clock())
            except EndpointGone:
                raise not_found(endpoint_id) from None
            self._cache.put(row)
            self.verifier.forget(endpoint_id)
        self._signals.endpoint_changed(endpoint_id)
        await self._finish_delete(row)

    async def _finish_delete(self, row: Endpoint) -> None:
        await self._drain.drain_endpoint(row.id)
        async with self._cache.lock:
            await self._store.delete_endpoint(row.id)
            self._cache.drop(row.id)
        logger.info("deleted endpoint %s (%s)", row.id, row.name)

    async def finish_pending_deletions(self) -> None:
        """Complete deletions a previous process started but did not finish."""
        for row in [r for r in self._cache.rows() if r.deleting_at is not None]:
            await self._finish_delete(row)

    def _writable(self, endpoint_id: str) -> Endpoint:
        row = self.row(endpoint_id)
        if row.deleting_at is not None:
            raise Conflict(
                f"Endpoint '{endpoint_id}' is being deleted.", param="id", code="endpoint_deleting"
            )
        return row
