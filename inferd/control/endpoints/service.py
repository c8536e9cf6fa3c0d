"""Endpoint lifecycle: create, read, update, delete, re-issue the access token.

Reads are the hot path and are served from an in-memory copy of the
endpoints: loaded from the store at start (`load`), written through on
every change made here, and kept fresh from the store's change feed
(`follow`) so that another control plane's writes to the same database are
seen too. Writes are serialised by one asyncio lock (validate against the
current copy, commit, then update memory, with no interleaving; changes from
the feed are applied under the same lock). A write returns only after the
commit is durable; a database that is away makes writes answer 503 while
reads go on from memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from inferd.api.engine_settings import NO_ENGINE_SETTINGS, EngineSettings
from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.catalog import Catalog
from inferd.catalog.models import ModelSpec
from inferd.control.accounts.model import DEFAULT_PROJECT
from inferd.control.endpoints.engine_checks import check_engine_settings
from inferd.control.endpoints.placement import Placement, resolve_placement
from inferd.control.endpoints.records import (
    DEFAULT_IMAGE_SIZE,
    EndpointRuntime,
    build_record,
    derive_status,
)
from inferd.control.endpoints.tokens import TokenVerifier, hash_token, new_endpoint_token
from inferd.control.follow import follow
from inferd.control.model import (
    Change,
    ChangeKind,
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

logger = logging.getLogger(__name__)

# What the service learns from the serving side, given at construction: the
# replicas of an endpoint (for its record), and the drain that must finish
# before a deleted endpoint's row goes.
RuntimeOf = Callable[[str], EndpointRuntime]


class Drain(Protocol):
    async def drain_endpoint(self, endpoint_id: str) -> None: ...


class EndpointSignals(Protocol):
    """`ScaleSignals.endpoint_changed`: the reconciler acts at once."""

    def endpoint_changed(self, endpoint_id: str) -> None: ...


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


class EndpointService:
    def __init__(
        self,
        store: ServiceStore,
        catalog: Catalog,
        verifier: TokenVerifier,
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
        self.catalog = catalog
        self.verifier = verifier
        self.public_url = public_url
        self.default_location = default_location
        self.max_replicas_cap = max_replicas_cap
        self.max_endpoints = max_endpoints
        self._clock = clock
        self._new_id = new_id
        self._rows: dict[str, Endpoint] = {}
        # Names are unique within a project: (project, name) -> id.
        self._names: dict[tuple[str, str], str] = {}
        # Rendered JSON of each record, keyed by everything the record is
        # computed from: the row object (frozen, replaced on every change, so
        # identity is its version) and the replicas' views (frozen, compared by
        # value). Reads are far more frequent than changes, and the list call
        # renders a thousand records; a hit costs a tuple comparison.
        self._rendered: dict[str, tuple[Endpoint, EndpointRuntime, bytes]] = {}
        self._write_lock = asyncio.Lock()
        self.runtime_of = runtime_of
        self._drain = drain
        self._signals = signals
        self.capacity_of = capacity_of

    # --- the in-memory copy ---------------------------------------------------------

    async def load(self) -> None:
        """(Re)load every endpoint from the store."""
        async with self._write_lock:
            endpoints = await self._store.list_endpoints()
            # Keep the objects that did not change: the render cache is keyed
            # by identity.
            fresh: dict[str, Endpoint] = {}
            for endpoint in endpoints:
                old = self._rows.get(endpoint.id)
                fresh[endpoint.id] = old if old is not None and old == endpoint else endpoint
            self._rows = fresh
            self._names = {(e.project_id, e.name): e.id for e in self._rows.values()}
            for endpoint_id in [i for i in self._rendered if i not in self._rows]:
                del self._rendered[endpoint_id]

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Apply other writers' changes from `feed` (subscribed before `load`)."""
        await follow(feed, self._apply, self.load, what="endpoint cache")

    async def _apply(self, change: Change) -> None:
        if change.kind is not ChangeKind.ENDPOINT:
            return
        async with self._write_lock:
            stored = await self._store.get_endpoint(change.id)
            current = self._rows.get(change.id)
            if stored == current:
                return
            if current is not None:
                key = (current.project_id, current.name)
                if self._names.get(key) == current.id:
                    del self._names[key]
            if stored is None:
                self._rows.pop(change.id, None)
                self._rendered.pop(change.id, None)
            else:
                self._rows[stored.id] = stored
                self._names[(stored.project_id, stored.name)] = stored.id

    # --- reads (memory only) -------------------------------------------------------

    def rows(self) -> list[Endpoint]:
        return list(self._rows.values())

    def endpoint_ids(self) -> list[str]:
        return list(self._rows)

    def find(self, endpoint_id: str) -> Endpoint | None:
        return self._rows.get(endpoint_id)

    def row(self, endpoint_id: str) -> Endpoint:
        row = self._rows.get(endpoint_id)
        if row is None:
            # Also the answer for an id that is not a UUID at all: to a client
            # both are "no such endpoint".
            raise self._gone(endpoint_id)
        return row

    @staticmethod
    def _gone(endpoint_id: str) -> NotFound:
        return NotFound(f"No endpoint with id '{endpoint_id}'.", param="id")

    def _image_size(self, row: Endpoint) -> str:
        # The model's own default size, so the example works as pasted; a
        # model gone from the catalog since creation falls back to 1024x1024.
        if row.model_kind == "image" and row.model_name in self.catalog.models:
            size = self.catalog.models.get(row.model_name).default_size
            if size is not None:
                return f"{size[0]}x{size[1]}"
        return DEFAULT_IMAGE_SIZE

    def _build(self, row: Endpoint, runtime: EndpointRuntime | None = None) -> dict[str, Any]:
        if runtime is None:
            runtime = self.runtime_of(row.id)
        return build_record(
            row,
            self.public_url,
            runtime.replicas,
            image_size=self._image_size(row),
            waiting_for=runtime.waiting_for,
            last_failure=runtime.last_failure,
            replacing=runtime.replacing,
        )

    def _rendered_json(self, row: Endpoint) -> bytes:
        runtime = self.runtime_of(row.id)
        cached = self._rendered.get(row.id)
        if cached is not None and cached[0] is row and cached[1] == runtime:
            return cached[2]
        data = render_json(self._build(row, runtime))
        self._rendered[row.id] = (row, runtime, data)
        return data

    def record(self, endpoint_id: str) -> dict[str, Any]:
        return self._build(self.row(endpoint_id))

    def record_json(self, endpoint_id: str) -> bytes:
        """`record(endpoint_id)` as JSON bytes, from the render cache."""
        return self._rendered_json(self.row(endpoint_id))

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
            row = self._rows.get(endpoint_id) or await self._store.get_endpoint(endpoint_id)
            if row is not None:  # None: deleted since the page was read
                rows.append(row)
        return Page(rows, page.after)

    def _page_from_copy(
        self, where: EndpointFilter, after: int | None, limit: int
    ) -> Page[Endpoint]:
        """While the store is down, reads go on from this instance's copy (as
        `record` does), as long as the answer is one whole list: a cursor is
        a store position, which the copy does not know."""
        matching = [row for row in self._rows.values() if where.matches(row)]
        if after is not None or len(matching) > limit:
            raise StoreUnavailable(
                "The database is unreachable: only a list that fits one page can be answered "
                "from this instance's copy meanwhile."
            )
        return Page(matching, None)

    def status_of(self, row: Endpoint) -> str:
        runtime = self.runtime_of(row.id)
        return derive_status(row, runtime.replicas, runtime.waiting_for).status.value

    def row_json(self, row: Endpoint) -> bytes:
        """The record of `row` (from `page`) as JSON bytes."""
        return self._rendered_json(row)

    def records(self) -> list[dict[str, Any]]:
        return [self._build(row) for row in self._rows.values()]

    def records_json(self) -> bytes:
        """`{"data": [every record, oldest first]}` as JSON bytes."""
        return b'{"data":[' + b",".join(map(self._rendered_json, self._rows.values())) + b"]}"

    def find_by_name(self, name: str, project_id: str = DEFAULT_PROJECT) -> Endpoint | None:
        endpoint_id = self._names.get((project_id, name))
        return None if endpoint_id is None else self._rows.get(endpoint_id)

    # --- validation ------------------------------------------------------------------

    def _check_scaling(self, min_replicas: int, max_replicas: int) -> None:
        if min_replicas > self.max_replicas_cap:
            raise BadRequest(
                f"minReplicas {min_replicas} is above this server's cap of "
                f"{self.max_replicas_cap} replicas.",
                param="minReplicas",
                code="min_replicas_above_cap",
            )
        if max_replicas > self.max_replicas_cap:
            raise BadRequest(
                f"maxReplicas {max_replicas} is above this server's cap of "
                f"{self.max_replicas_cap}.",
                param="maxReplicas",
                code="max_replicas_above_cap",
            )
        if min_replicas > max_replicas:
            raise BadRequest(
                f"minReplicas ({min_replicas}) must not exceed maxReplicas ({max_replicas}).",
                param="minReplicas",
                code="min_above_max",
            )

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

    # --- writes ----------------------------------------------------------------------

    def resolve_gpus(
        self, row: Endpoint | None, req: CreateEndpointRequest | UpdateEndpointRequest
    ) -> tuple[str, int]:
        """The GPU type and count a create (`row` None) or an update of `row`
        would give the endpoint (400 if the catalog does not allow them)."""
        if row is None:
            assert isinstance(req, CreateEndpointRequest)
            location = req.locationName or self.default_location
            placement = self._place(
                req.modelName, location, req.gpuType, req.gpuCount, req.engineSettings
            )
            return placement.gpu_type, placement.gpu_count
        if req.gpuType is None and req.gpuCount is None:
            return row.gpu_type, row.gpu_count
        gpu_count = req.gpuCount
        if gpu_count is None and req.gpuType in (None, row.gpu_type):
            gpu_count = row.gpu_count
        placement = self._place(
            row.model_name,
            row.location_name,
            req.gpuType or row.gpu_type,
            gpu_count,
            self._settings_after(row, req),
        )
        return placement.gpu_type, placement.gpu_count

    @staticmethod
    def _settings_after(
        row: Endpoint, req: CreateEndpointRequest | UpdateEndpointRequest
    ) -> EngineSettings:
        if req.engineSettings is None:
            return row.engine_settings
        return row.engine_settings.merged(req.engineSettings)

    async def create(
        self, req: CreateEndpointRequest, project_id: str = DEFAULT_PROJECT
    ) -> tuple[dict[str, Any], str]:
        """Returns the record and the plaintext token (which is never stored)."""
        max_replicas = req.maxReplicas if req.maxReplicas is not None else max(1, req.minReplicas)
        self._check_scaling(req.minReplicas, max_replicas)
        location = req.locationName or self.default_location
        engine_settings = req.engineSettings or NO_ENGINE_SETTINGS
        self.check_engine_settings(req.modelName, engine_settings)
        placement = self._place(req.modelName, location, req.gpuType, req.gpuCount, engine_settings)
        async with self._write_lock:
            if (project_id, req.name) in self._names:
                raise Conflict(
                    f"An endpoint named '{req.name}' already exists in project '{project_id}'.",
                    param="name",
                    code="name_taken",
                )
            if len(self._rows) >= self.max_endpoints:
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
                raise Conflict(
                    f"An endpoint named '{req.name}' already exists in project '{project_id}'.",
                    param="name",
                    code="name_taken",
                ) from None
            self._rows[row.id] = row
            self._names[(row.project_id, row.name)] = row.id
            self.verifier.set_active(row.id, digest)
        self._signals.endpoint_changed(row.id)
        logger.info("created endpoint %s (%s) for %s", row.id, row.name, row.model_name)
        return self._build(row), token

    async def update(self, endpoint_id: str, req: UpdateEndpointRequest) -> dict[str, Any]:
        async with self._write_lock:
            row = self._writable(endpoint_id)
            min_replicas = row.min_replicas if req.minReplicas is None else req.minReplicas
            max_replicas = row.max_replicas if req.maxReplicas is None else req.maxReplicas
            self._check_scaling(min_replicas, max_replicas)
            wanted: dict[str, Any] = {
                "min_replicas": min_replicas,
                "max_replicas": max_replicas,
            }
            if req.scaleToZeroRetentionPeriodSeconds is not None:
                wanted["retention_seconds"] = req.scaleToZeroRetentionPeriodSeconds
            engine_settings = self._settings_after(row, req)
            if engine_settings != row.engine_settings:
                self.check_engine_settings(row.model_name, engine_settings)
                if req.gpuType is None and req.gpuCount is None:
                    self._fits_with(row, engine_settings)
                # Replicas take their settings at start: new ones replace them.
                wanted.update(engine_settings=engine_settings, generation=row.generation + 1)
            if req.gpuType is not None or req.gpuCount is not None:
                gpu_type = req.gpuType or row.gpu_type
                # Same type, new count: keep the type. New type, no count:
                # the recommended count for it (as on create).
                gpu_count = req.gpuCount
                if gpu_count is None and req.gpuType in (None, row.gpu_type):
                    gpu_count = row.gpu_count
                placement = self._place(
                    row.model_name, row.location_name, gpu_type, gpu_count, engine_settings
                )
                if (placement.gpu_type, placement.gpu_count) != (row.gpu_type, row.gpu_count):
                    wanted.update(
                        gpu_type=placement.gpu_type,
                        gpu_count=placement.gpu_count,
                        hourly_price=placement.hourly_price,
                        currency=placement.currency,
                        generation=row.generation + 1,
                    )
            wanted = {k: v for k, v in wanted.items() if getattr(row, k) != v}
            if wanted:
                changes = EndpointChanges(updated_at=self._clock(), **wanted)
                try:
                    row = await self._store.update_endpoint(endpoint_id, changes)
                except EndpointGone:
                    raise self._gone(endpoint_id) from None
                self._rows[endpoint_id] = row
                self._signals.endpoint_changed(endpoint_id)
        return self._build(row)

    async def reissue_token(self, endpoint_id: str) -> str:
        async with self._write_lock:
            self._writable(endpoint_id)
            token = new_endpoint_token()
            digest = hash_token(token)
            try:
                await self._store.replace_token(endpoint_id, digest, self._clock())
            except EndpointGone:
                raise self._gone(endpoint_id) from None
            # After the commit and before the answer: the old token fails from now on.
            self.verifier.set_active(endpoint_id, digest)
        logger.info("re-issued the access token of endpoint %s", endpoint_id)
        return token

    async def delete(self, endpoint_id: str) -> None:
        """Mark deleting (tokens stop working), drain replicas, then remove the row."""
        async with self._write_lock:
            self.row(endpoint_id)
            try:
                row = await self._store.mark_deleting(endpoint_id, self._clock())
            except EndpointGone:
                raise self._gone(endpoint_id) from None
            self._rows[endpoint_id] = row
            self.verifier.forget(endpoint_id)
        self._signals.endpoint_changed(endpoint_id)
        await self._finish_delete(row)

    async def _finish_delete(self, row: Endpoint) -> None:
        await self._drain.drain_endpoint(row.id)
        async with self._write_lock:
            await self._store.delete_endpoint(row.id)
            self._rows.pop(row.id, None)
            self._rendered.pop(row.id, None)
            if self._names.get((row.project_id, row.name)) == row.id:
                del self._names[(row.project_id, row.name)]
        logger.info("deleted endpoint %s (%s)", row.id, row.name)

    async def finish_pending_deletions(self) -> None:
        """Complete deletions a previous process started but did not finish."""
        for row in [r for r in self._rows.values() if r.deleting_at is not None]:
            await self._finish_delete(row)

    def _writable(self, endpoint_id: str) -> Endpoint:
        row = self.row(endpoint_id)
        if row.deleting_at is not None:
            raise Conflict(
                f"Endpoint '{endpoint_id}' is being deleted.", param="id", code="endpoint_deleting"
            )
        return row
