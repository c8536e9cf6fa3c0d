"""Endpoints as a principal sees them: the project and role checks, quotas,
the audit trail, usage and `costSoFar`, around `EndpointService`.

Another project's endpoint is answered exactly like an endpoint that does
not exist (404, same message), on every operation; a role that may not act
gets 403. The console and the HTTP routes both call this layer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from inferd.api.engine_settings import EngineSettings
from inferd.api.management import CreateEndpointRequest, UpdateEndpointRequest
from inferd.control.accounts.metering import UsageMeter, merge_usage
from inferd.control.accounts.model import (
    DEFAULT_PROJECT,
    AuditAction,
    UsageKey,
    UsageRow,
    UsageTotals,
    hour_of,
    usage_order,
)
from inferd.control.accounts.quota import UNLIMITED, EndpointShape, check_settings
from inferd.control.accounts.roles import Action, Principal, authorize, require_operator
from inferd.control.accounts.service import AccountService, project_missing
from inferd.control.paging import EndpointFilter, Page
from inferd.errors import BadRequest, Conflict, NotFound


class EndpointLike(Protocol):
    """What this layer reads of a stored endpoint."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def project_id(self) -> str: ...
    @property
    def gpu_type(self) -> str: ...
    @property
    def gpu_count(self) -> int: ...
    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def deleting_at(self) -> object: ...


class Endpoints(Protocol):
    """What of `EndpointService` this layer uses."""

    def find(self, endpoint_id: str) -> Any: ...
    def rows(self) -> Any: ...
    def record_json(self, endpoint_id: str) -> bytes: ...
    async def create(
        self, req: CreateEndpointRequest, project_id: str = ...
    ) -> tuple[dict[str, Any], str]: ...
    async def update(self, endpoint_id: str, req: UpdateEndpointRequest) -> dict[str, Any]: ...
    async def delete(self, endpoint_id: str) -> None: ...
    async def reissue_token(self, endpoint_id: str) -> str: ...
    def resolve_gpus(
        self, row: Any, req: CreateEndpointRequest | UpdateEndpointRequest
    ) -> tuple[str, int]: ...
    async def page(self, where: EndpointFilter, after: int | None, limit: int) -> Page[Any]: ...
    def status_of(self, row: Any) -> str: ...
    def row_json(self, row: Any) -> bytes: ...


# A status filter is applied to records, not in the store (status is derived
# from the replicas): one page reads at most this many store rows per item
# asked for before it answers, possibly short, with a cursor to go on from.
STATUS_SCAN_FACTOR = 10


class ModelOwners(Protocol):
    """Which models an endpoint of a project may serve (`ModelService`)."""

    def usable_in(self, name: str, project_id: str) -> bool: ...


def model_not_usable(name: str, project_id: str) -> BadRequest:
    # The same answer whether the model exists in another project or
    # nowhere: another project's models are not revealed.
    return BadRequest(
        f"Unknown model '{name}': not a model of GET /inference/models that project "
        f"'{project_id}' can use.",
        param="modelName",
        code="model_not_found",
    )


def not_found(endpoint_id: str) -> NotFound:
    # The same answer as for an id that exists nowhere.
    return NotFound(f"No endpoint with id '{endpoint_id}'.", param="id")


class ProjectEndpoints:
    def __init__(
        self,
        service: Endpoints,
        accounts: AccountService,
        meter: UsageMeter,
        clock: Callable[[], datetime],
        models: ModelOwners,
    ) -> None:
        self.service = service
        self.accounts = accounts
        self.meter = meter
        self._clock = clock
        self.models = models
        # Quota checks and the writes they allow happen without interleaving.
        self._lock = asyncio.Lock()

    # --- access ---------------------------------------------------------------------

    def endpoint(self, principal: Principal, endpoint_id: str, action: Action) -> EndpointLike:
        row = self.service.find(endpoint_id)
        if row is None:
            raise not_found(endpoint_id)
        authorize(principal, row.project_id, action, hidden=not_found(endpoint_id))
        return row

    def visible(self, principal: Principal, project_id: str | None = None) -> list[EndpointLike]:
        return [
            r
            for r in self.service.rows()
            if principal.sees(r.project_id) and (project_id is None or r.project_id == project_id)
        ]

    def _decorate(self, row: EndpointLike, data: bytes) -> bytes:
        extra = b',"projectId":"%s","costSoFar":%s}' % (
            row.project_id.encode(),
            repr(round(self.meter.cost_so_far(row.id), 6)).encode(),
        )
        return data[:-1] + extra

    def _decorate_dict(self, row: EndpointLike, record: dict[str, Any]) -> dict[str, Any]:
        record["projectId"] = row.project_id
        record["costSoFar"] = round(self.meter.cost_so_far(row.id), 6)
        return record

    # --- reads ------------------------------------------------------------------------

    def get_json(self, principal: Principal, endpoint_id: str) -> bytes:
        row = self.endpoint(principal, endpoint_id, Action.READ)
        return self._decorate(row, self.service.record_json(endpoint_id))

    def list_json(self, principal: Principal, project_id: str | None = None) -> bytes:
        parts = [
            self._decorate(r, self.service.record_json(r.id))
            for r in self.visible(principal, project_id)
        ]
        return b'{"data":[' + b",".join(parts) + b"]}"

    async def visible_page(
        self,
        principal: Principal,
        where: EndpointFilter,
        after: int | None,
        limit: int,
        keep: Callable[[Any], bool] | None = None,
    ) -> Page[Any]:
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
        rows: list[Any] = []
        budget = limit * STATUS_SCAN_FACTOR
        while True:
            page = await self.service.page(where, after, limit - len(rows))
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

        def in_status(row: Any) -> bool:
            return self.service.status_of(row) == status

        page = await self.visible_page(
            principal, where, after, limit, None if status is None else in_status
        )
        parts = [self._decorate(row, self.service.row_json(row)) for row in page.items]
        return b",".join(parts), page.after

    # --- writes ------------------------------------------------------------------------

    async def create(
        self, principal: Principal, req: CreateEndpointRequest, project_id: str | None
    ) -> tuple[dict[str, Any], str]:
        project_id = self.target_project(principal, project_id)
        project = await self.accounts.project(principal, project_id)
        authorize(
            principal,
            project_id,
            Action.WRITE,
            hidden=NotFound(
                f"No project '{project_id}'.", param="projectId", code="project_not_found"
            ),
        )
        if not self.models.usable_in(req.modelName, project_id):
            raise model_not_usable(req.modelName, project_id)
        self._check_draft(req.engineSettings, project_id)
        gpu_type, gpu_count = self.service.resolve_gpus(None, req)
        max_replicas = req.maxReplicas if req.maxReplicas is not None else max(1, req.minReplicas)
        new = EndpointShape("", gpu_type, gpu_count, req.minReplicas)
        async with self._within_quota(project.id, new, max_replicas, new_endpoint=True):
            record, token = await self.service.create(req, project_id=project_id)
        row = self.service.find(record["id"])
        await self.accounts.audit_event(
            principal, AuditAction.ENDPOINT_CREATE, project_id, f"endpoint:{record['id']}",
            name=req.name, modelName=record["modelName"], gpuType=record["gpuType"],
            minReplicas=record["minReplicas"], maxReplicas=record["maxReplicas"],
        )  # fmt: skip
        return (self._decorate_dict(row, record) if row else record), token

    def _check_draft(self, settings: EngineSettings | None, project_id: str) -> None:
        """A draft model is a use of a model, as `modelName` is: another
        project's is answered as unknown."""
        speculative = None if settings is None else settings.speculativeDecoding
        if speculative is not None and not self.models.usable_in(
            speculative.draftModel, project_id
        ):
            error = model_not_usable(speculative.draftModel, project_id)
            error.param = "engineSettings.speculativeDecoding.draftModel"
            raise error

    @contextlib.asynccontextmanager
    async def _within_quota(
        self, project_id: str, changed: EndpointShape, max_replicas: int, *, new_endpoint: bool
    ) -> AsyncIterator[None]:
        """Refuse a create or change that breaks the project's quota, else
        let it be written while no other check of this project runs, on this
        instance or another (the check reads the store, not this instance's
        copy, which may not have heard of another's create yet)."""
        store = self.accounts.store
        async with self._lock, store.quota_lock(project_id):
            # Read under the lock: a project deleted meanwhile takes nothing.
            project = await store.get_project(project_id)
            if project is None:
                raise project_missing(project_id)
            quota = project.quota_in_force
            if quota == UNLIMITED:
                yield
                return
            others = await store.quota_shapes(project_id)
            exceeded = check_settings(
                quota, others, changed, max_replicas, new_endpoint=new_endpoint
            )
            if exceeded is not None:
                raise exceeded.error(project_id)
            yield

    async def delete_project(
        self, principal: Principal, project_id: str, models_of: Callable[[str], Sequence[str]]
    ) -> None:
        """The operator deletes an empty project: refused while it has
        endpoints (being deleted included) or registered models, under the
        same lock as creates, so none can appear meanwhile. Members lose it
        at once; its audit entries and usage stay in the store."""
        require_operator(principal, "delete projects")
        if project_id == DEFAULT_PROJECT:
            raise Conflict(
                "The default project cannot be deleted.", param="id", code="project_is_default"
            )
        await self.accounts.project(principal, project_id)
        store = self.accounts.store
        async with self._lock, store.quota_lock(project_id):
            endpoints = await store.count_endpoints(project_id)
            models = list(models_of(project_id))
            if endpoints or models:
                raise Conflict(
                    f"Project '{project_id}' still has {endpoints} endpoint(s) and "
                    f"{len(models)} registered model(s); delete them first.",
                    param="id",
                    code="project_not_empty",
                )
            if not await store.delete_project(project_id):
                raise project_missing(project_id)
        self.accounts.quotas.pop(project_id, None)
        await self.accounts.audit_event(
            principal, AuditAction.PROJECT_DELETE, project_id, f"project:{project_id}"
        )

    def target_project(self, principal: Principal, project_id: str | None) -> str:
        if project_id is not None:
            return project_id
        if principal.operator:
            return DEFAULT_PROJECT
        writable = [p for p in principal.roles if principal.may(Action.WRITE, p)]
        if len(writable) == 1:
            return writable[0]
        raise BadRequest(
            "Name the project to create the endpoint in ('projectId'): "
            f"you may create endpoints in {len(writable)} projects.",
            param="projectId",
            code="project_required",
        )

    async def update(
        self, principal: Principal, endpoint_id: str, req: UpdateEndpointRequest
    ) -> dict[str, Any]:
        row = self.endpoint(principal, endpoint_id, Action.WRITE)
        self._check_draft(req.engineSettings, row.project_id)
        gpu_type, gpu_count = self.service.resolve_gpus(row, req)
        min_replicas = row.min_replicas if req.minReplicas is None else req.minReplicas
        max_replicas = row.max_replicas if req.maxReplicas is None else req.maxReplicas
        shape = EndpointShape(row.id, gpu_type, gpu_count, min_replicas)
        async with self._within_quota(row.project_id, shape, max_replicas, new_endpoint=False):
            record = await self.service.update(endpoint_id, req)
        changed = req.model_dump(exclude_none=True)
        if req.engineSettings is not None:
            # As asked: a null clears a setting, and the audit says so.
            changed["engineSettings"] = req.engineSettings.model_dump(exclude_unset=True)
        await self.accounts.audit_event(
            principal, AuditAction.ENDPOINT_UPDATE, row.project_id, f"endpoint:{row.id}", **changed
        )
        new_row = self.service.find(endpoint_id) or row
        return self._decorate_dict(new_row, record)

    async def delete(self, principal: Principal, endpoint_id: str) -> None:
        row = self.endpoint(principal, endpoint_id, Action.WRITE)
        await self.accounts.audit_event(
            principal,
            AuditAction.ENDPOINT_DELETE,
            row.project_id,
            f"endpoint:{row.id}",
            name=row.name,
        )
        await self.service.delete(endpoint_id)

    async def reissue_token(self, principal: Principal, endpoint_id: str) -> str:
        row = self.endpoint(principal, endpoint_id, Action.WRITE)
        token = await self.service.reissue_token(endpoint_id)
        await self.accounts.audit_event(
            principal, AuditAction.TOKEN_REISSUE, row.project_id, f"endpoint:{row.id}"
        )
        return token

    async def usage(
        self, principal: Principal, endpoint_id: str, since: datetime | None, until: datetime | None
    ) -> list[UsageRow]:
        """Hourly usage of an endpoint; `since` counts from the start of its hour."""
        self.endpoint(principal, endpoint_id, Action.READ)
        since = hour_of(since) if since else None
        stored = await self.accounts.store.usage(endpoint_id=endpoint_id, since=since, until=until)
        return merge_usage(stored, self.meter.pending(endpoint_id=endpoint_id), since, until)

    async def names_of_deleted(
        self, principal: Principal, project_id: str, endpoint_ids: Sequence[str]
    ) -> dict[str, str]:
        """The names deleted endpoints of the project had (their usage
        outlives them), from the audit log's create and delete entries."""
        await self.accounts.project(principal, project_id)
        wanted = {f"endpoint:{i}": i for i in endpoint_ids}
        names: dict[str, str] = {}
        after: int | None = None
        while wanted:
            entries = await self.accounts.store.audit(
                project_id,
                actions=(AuditAction.ENDPOINT_CREATE, AuditAction.ENDPOINT_DELETE),
                limit=1000,
                after=after,
            )
            for e in entries:
                name = e.detail.get("name")
                if e.target in wanted and isinstance(name, str):
                    names[wanted[e.target]] = name
            if len(entries) < 1000:
                break
            after = entries[-1].id
        return names

    async def usage_page(
        self,
        principal: Principal,
        *,
        endpoint_id: str | None = None,
        project_id: str | None = None,
        since: datetime | None,
        until: datetime | None,
        after: UsageKey | None,
        limit: int,
    ) -> tuple[list[UsageRow], UsageKey | None, UsageTotals]:
        """A keyset page of hourly usage of an endpoint or a project, current
        to the last sample, where the next page starts, and the totals of the
        whole window (every page)."""
        if endpoint_id is not None:
            self.endpoint(principal, endpoint_id, Action.READ)
        else:
            assert project_id is not None
            await self.accounts.project(principal, project_id)
        since = hour_of(since) if since else None
        store = self.accounts.store
        scope = {"endpoint_id": endpoint_id, "project_id": project_id}
        stored = await store.usage(**scope, since=since, until=until, after=after,
                                   limit=limit + 1)  # fmt: skip
        more = len(stored) > limit
        stored = stored[:limit]
        # Figures not written yet join the page whose span holds their row:
        # past `after`, up to the last stored row's key when more follow.
        upper = usage_order(stored[-1]) if more else None
        pending = [
            d for d in self.meter.pending(**scope)
            if (after is None or usage_order(d) > after)
            and (upper is None or usage_order(d) <= upper)
        ]  # fmt: skip
        rows = merge_usage(stored, pending, since, until)
        if len(rows) > limit:
            rows, upper = rows[:limit], usage_order(rows[limit - 1])
        # `upper` is None only on the last page.
        in_window = merge_usage((), self.meter.pending(**scope), since, until)
        totals = (await store.usage_totals(**scope, since=since, until=until)).plus(in_window)
        return rows, upper, totals

    async def project_usage(
        self, principal: Principal, project_id: str, since: datetime | None, until: datetime | None
    ) -> list[UsageRow]:
        await self.accounts.project(principal, project_id)
        since = hour_of(since) if since else None
        stored = await self.accounts.store.usage(project_id=project_id, since=since, until=until)
        return merge_usage(stored, self.meter.pending(project_id=project_id), since, until)
