"""The endpoint commands: create, change and delete endpoints and re-issue
their access tokens, as a principal may.

Each command authorizes (through the reads' `endpoint`: another project's
endpoint is a 404 like a missing one, a role that may not act a 403),
validates (placed once by the catalog and recommender, checked against the
project's quota on that placement under the project's guard), writes (the
endpoint row and its token in one transaction), signals the reconciler and
audits. The HTTP routes and the console both call these commands; what they
read goes through `EndpointReads` (`inferd.control.endpoints.reads`).

A write returns only after the commit is durable; a database that is away
makes writes answer 503 while reads go on from memory.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from inferd.api.engine_settings import NO_ENGINE_SETTINGS, EngineSettings
from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.catalog import Catalog
from inferd.catalog.models import ModelSpec
from inferd.control.accounts.model import AuditAction
from inferd.control.accounts.project_guard import ProjectGuard
from inferd.control.accounts.quota import EndpointShape
from inferd.control.accounts.roles import Action, Principal, authorize, project_to_write
from inferd.control.accounts.service import AccountService
from inferd.control.endpoints.cache import EndpointCache
from inferd.control.endpoints.checks import check_scaling, model_not_usable, name_taken, not_found
from inferd.control.endpoints.engine_checks import check_engine_settings, check_engine_settings_on
from inferd.control.endpoints.placement import Placement, placement_for_change, resolve_placement
from inferd.control.endpoints.reads import EndpointReads
from inferd.control.endpoints.tokens import TokenVerifier, hash_token, new_endpoint_token
from inferd.control.model import (
    DuplicateName,
    Endpoint,
    EndpointChanges,
    EndpointGone,
    utc_now,
)
from inferd.control.ports import EndpointStore, TokenStore
from inferd.errors import BadRequest, Conflict, NotFound

logger = logging.getLogger(__name__)


class Drain(Protocol):
    """The drain that must finish before a deleted endpoint's row goes."""

    async def drain_endpoint(self, endpoint_id: str) -> None: ...


class EndpointSignals(Protocol):
    """`ScaleSignals.endpoint_changed`: the reconciler acts at once."""

    def endpoint_changed(self, endpoint_id: str) -> None: ...


class ModelOwners(Protocol):
    """Which models an endpoint of a project may serve (`ModelService`)."""

    def usable_in(self, name: str, project_id: str) -> bool: ...


class NoReplicas:
    """The serving side of a control plane that runs no replicas (the
    management API alone): none to drain, nobody to tell."""

    async def drain_endpoint(self, endpoint_id: str) -> None:
        return None

    def endpoint_changed(self, endpoint_id: str) -> None:
        return None


NO_REPLICAS = NoReplicas()


class ServiceStore(EndpointStore, TokenStore, Protocol):
    """What the commands write to: endpoints and their tokens."""


def _settings_after(row: Endpoint, req: UpdateEndpointRequest) -> EngineSettings:
    if req.engineSettings is None:
        return row.engine_settings
    return row.engine_settings.merged(req.engineSettings)


class EndpointCommands:
    def __init__(
        self,
        reads: EndpointReads,
        store: ServiceStore,
        cache: EndpointCache,
        catalog: Catalog,
        verifier: TokenVerifier,
        accounts: AccountService,
        guard: ProjectGuard,
        models: ModelOwners,
        *,
        default_location: str,
        max_replicas_cap: int,
        max_endpoints: int = 10_000,
        drain: Drain = NO_REPLICAS,
        signals: EndpointSignals = NO_REPLICAS,
        clock: Callable[[], datetime] = utc_now,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        """`drain`, `signals`: the serving side (the reconciler); left out,
        the commands run no replicas. `cache`: the reads' copy, which a
        write updates (under its lock) before it answers."""
        self._reads = reads
        self._store = store
        self._cache = cache
        self._catalog = catalog
        self._verifier = verifier
        self._accounts = accounts
        self._guard = guard
        self._models = models
        self._default_location = default_location
        self._max_replicas_cap = max_replicas_cap
        self._max_endpoints = max_endpoints
        self._drain = drain
        self._signals = signals
        self._clock = clock
        self._new_id = new_id

    # --- writes ----------------------------------------------------------------------------

    def _model_or_none(self, name: str) -> ModelSpec | None:
        return self._catalog.models.get(name) if name in self._catalog.models else None

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
            self._catalog,
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
        location = req.locationName or self._default_location
        placement = self._place(
            req.modelName, location, req.gpuType, req.gpuCount, req.engineSettings
        )
        max_replicas = req.maxReplicas if req.maxReplicas is not None else max(1, req.minReplicas)
        shape = EndpointShape("", placement.gpu_type, placement.gpu_count, req.minReplicas)
        async with self._guard.exclusive(project_id):
            await self._guard.check_quota(project_id, shape, max_replicas, new_endpoint=True)
            check_scaling(req.minReplicas, max_replicas, self._max_replicas_cap)
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
        return self._reads.record_of(row), token

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
            if len(self._cache) >= self._max_endpoints:
                raise Conflict(
                    f"This server holds at most {self._max_endpoints} endpoints.",
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
            self._verifier.set_active(row.id, digest)
        return row, token

    async def update(
        self, principal: Principal, endpoint_id: str, req: UpdateEndpointRequest
    ) -> dict[str, Any]:
        project_id = self._reads.endpoint(principal, endpoint_id, Action.WRITE).project_id
        self._check_draft(req.engineSettings, project_id)
        async with self._guard.exclusive(project_id):
            # Read again under the lock: the change applies to the row as it is.
            row = self._reads.row(endpoint_id)
            placement = placement_for_change(
                self._catalog, row, req.gpuType, req.gpuCount, _settings_after(row, req)
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
        return self._reads.record_of(row)

    async def _change(
        self, endpoint_id: str, req: UpdateEndpointRequest, placement: Placement | None
    ) -> Endpoint:
        async with self._cache.lock:
            row = self._writable(endpoint_id)
            min_replicas = row.min_replicas if req.minReplicas is None else req.minReplicas
            max_replicas = row.max_replicas if req.maxReplicas is None else req.maxReplicas
            check_scaling(min_replicas, max_replicas, self._max_replicas_cap)
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
        row = self._reads.endpoint(principal, endpoint_id, Action.WRITE)
        async with self._cache.lock:
            self._writable(endpoint_id)
            token = new_endpoint_token()
            digest = hash_token(token)
            try:
                await self._store.replace_token(endpoint_id, digest, self._clock())
            except EndpointGone:
                raise not_found(endpoint_id) from None
            # After the commit and before the answer: the old token fails from now on.
            self._verifier.set_active(endpoint_id, digest)
        logger.info("re-issued the access token of endpoint %s", endpoint_id)
        await self._accounts.audit_event(
            principal, AuditAction.TOKEN_REISSUE, row.project_id, f"endpoint:{row.id}"
        )
        return token

    async def delete(self, principal: Principal, endpoint_id: str) -> None:
        """Mark deleting (tokens stop working), drain replicas, then remove the row."""
        row = self._reads.endpoint(principal, endpoint_id, Action.WRITE)
        await self._accounts.audit_event(
            principal, AuditAction.ENDPOINT_DELETE, row.project_id, f"endpoint:{row.id}",
            name=row.name,
        )  # fmt: skip
        async with self._cache.lock:
            self._reads.row(endpoint_id)
            try:
                row = await self._store.mark_deleting(endpoint_id, self._clock())
            except EndpointGone:
                raise not_found(endpoint_id) from None
            self._cache.put(row)
            self._verifier.forget(endpoint_id)
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
        row = self._reads.row(endpoint_id)
        if row.deleting_at is not None:
            raise Conflict(
                f"Endpoint '{endpoint_id}' is being deleted.", param="id", code="endpoint_deleting"
            )
        return row
