"""LoRA adapters registered on endpoints: checked, stored, and known in memory.

Registration checks the adapter against the endpoint's base model before
anything is stored (`inferd.catalog.adapters`): an adapter another base
was trained for, one whose rank is above what the endpoint's replicas
reserve (`maxLoraRank`), or one that adapts modules the base does not have
is a 400 naming what is wrong. Adding or removing an adapter touches no
replica: replicas load adapters on demand, when a request names one
(the gateway tells the replica where the adapter is).

The gateway reads adapters on every request that names one, so they are
served from an in-memory copy, loaded at start and kept fresh from the
store's change feed (another instance's registrations included).

The management operations take the principal: an adapter belongs to its
endpoint's project, authorized as the endpoint is (another project's is a
404), and each change is audited here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from inferd.api.management import RegisterAdapterRequest
from inferd.catalog.adapters import (
    AdapterRejected,
    BaseFacts,
    check_adapter,
    read_adapter,
    read_base,
)
from inferd.catalog.resolve import BUILTIN_PREFIX, ModelUnavailable, resolve_source
from inferd.catalog.roots import ModelRoots
from inferd.control.accounts.adapter_metering import AdapterMeter, merge_adapter_usage
from inferd.control.accounts.model import AuditAction
from inferd.control.accounts.roles import Action, Principal
from inferd.control.follow import follow
from inferd.control.model import (
    Adapter,
    AdapterUsage,
    Change,
    ChangeKind,
    DuplicateAdapter,
    Endpoint,
    EndpointGone,
    rfc3339,
    utc_now,
)
from inferd.control.ports import AdapterStore
from inferd.errors import BadRequest, Conflict, NotFound

logger = logging.getLogger(__name__)

# Adapters one endpoint may have registered (each is one row and one entry
# of the gateway's copy; replicas hold only `maxLoras` of them at a time).
MAX_ADAPTERS_PER_ENDPOINT = 1000
NO_ADAPTERS: Mapping[str, Adapter] = MappingProxyType({})
NO_SOURCES: Mapping[str, str] = MappingProxyType({})


def adapter_record(adapter: Adapter) -> dict[str, Any]:
    return {
        "name": adapter.name,
        "source": adapter.source,
        "rank": adapter.rank,
        "baseModel": adapter.base_model,
        "createdAt": rfc3339(adapter.created_at),
    }


class EndpointRows(Protocol):
    def find(self, endpoint_id: str) -> Endpoint | None: ...

    def endpoint(self, principal: Principal, endpoint_id: str, action: Action) -> Endpoint:
        """The endpoint, if `principal` may do `action` on it (404, 403)."""
        ...


class Audit(Protocol):
    """`AccountService.audit_event`."""

    async def audit_event(
        self,
        principal: Principal,
        action: AuditAction,
        project_id: str | None,
        target: str,
        **detail: object,
    ) -> None: ...


# A model name -> the source its replicas load (a catalog entry's `source`).
BaseSource = Callable[[str], str]


class AdapterService:
    def __init__(
        self,
        store: AdapterStore,
        endpoints: EndpointRows,
        base_source: BaseSource,
        audit: Audit,
        meter: AdapterMeter,
        *,
        roots: ModelRoots | None = None,
        cache_dir: Path | None = None,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        """`base_source`: where an endpoint's base model comes from (read
        here for its weights' names and shapes); `meter`: the usage this
        instance counted and has not written yet; `cache_dir`: where built-in
        tiny models are built."""
        self._store = store
        self._endpoints = endpoints
        self._base_source = base_source
        self._audit = audit
        self._meter = meter
        self._roots = roots or ModelRoots()
        self._cache_dir = cache_dir
        self._clock = clock
        # endpoint id -> name -> adapter; each inner mapping is replaced, never
        # changed, so a reader holds a consistent view.
        self._by_endpoint: dict[str, Mapping[str, Adapter]] = {}
        # The same, as the gateway reads it on every request: name -> source.
        self._sources: dict[str, Mapping[str, str]] = {}
        self._lock = asyncio.Lock()

    # --- the in-memory copy ------------------------------------------------------------

    async def load(self) -> None:
        # Reads under the lock, here and in `_apply`: a read taken before
        # this instance's own register or remove committed would otherwise
        # undo it in memory until the next change arrived.
        async with self._lock:
            adapters = await self._store.list_adapters()
            grouped: dict[str, dict[str, Adapter]] = {}
            for adapter in adapters:
                grouped.setdefault(adapter.endpoint_id, {})[adapter.name] = adapter
            self._by_endpoint = {k: MappingProxyType(v) for k, v in grouped.items()}
            self._sources = {k: _sources(v) for k, v in grouped.items()}

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Apply other writers' changes from `feed` (subscribed before `load`)."""
        await follow(feed, self._apply, self.load, what="adapter cache")

    async def _apply(self, change: Change) -> None:
        # An endpoint's deletion takes its adapters (by cascade) without an
        # adapter change of its own.
        if change.kind in (ChangeKind.ADAPTER, ChangeKind.ENDPOINT):
            async with self._lock:
                await self._reload(change.id)

    async def _reload(self, endpoint_id: str) -> None:
        adapters = await self._store.list_adapters(endpoint_id)
        if adapters:
            named = {a.name: a for a in adapters}
            self._by_endpoint[endpoint_id] = MappingProxyType(named)
            self._sources[endpoint_id] = _sources(named)
        else:
            self._by_endpoint.pop(endpoint_id, None)
            self._sources.pop(endpoint_id, None)

    # --- the serving side's reads (memory only) -----------------------------------------

    def of(self, endpoint_id: str) -> Mapping[str, Adapter]:
        """The endpoint's adapters by name (empty when it has none)."""
        return self._by_endpoint.get(endpoint_id, NO_ADAPTERS)

    def sources(self, endpoint_id: str) -> Mapping[str, str]:
        """Name -> source of the endpoint's adapters (the gateway's view)."""
        return self._sources.get(endpoint_id, NO_SOURCES)

    # --- a principal's reads -----------------------------------------------------------

    def listed(self, principal: Principal, endpoint_id: str) -> list[Adapter]:
        """Every adapter of the endpoint, oldest first."""
        self._endpoints.endpoint(principal, endpoint_id, Action.READ)
        return list(self.of(endpoint_id).values())

    def get(self, principal: Principal, endpoint_id: str, name: str) -> Adapter:
        self._endpoints.endpoint(principal, endpoint_id, Action.READ)
        return self._named(endpoint_id, name)

    async def usage(self, principal: Principal, endpoint_id: str, name: str) -> list[AdapterUsage]:
        """Hourly requests and tokens of one adapter (stored, plus what this
        instance has not written yet). Kept after the adapter is removed."""
        self._endpoints.endpoint(principal, endpoint_id, Action.READ)
        stored = await self._store.adapter_usage(endpoint_id, name)
        return merge_adapter_usage(stored, self._meter.pending(endpoint_id, name))

    def _named(self, endpoint_id: str, name: str) -> Adapter:
        adapter = self.of(endpoint_id).get(name)
        if adapter is None:
            raise NotFound(
                f"Endpoint '{endpoint_id}' has no adapter '{name}'.",
                param="name",
                code="adapter_not_found",
            )
        return adapter

    # --- writes ----------------------------------------------------------------------------

    async def register(
        self, principal: Principal, endpoint_id: str, req: RegisterAdapterRequest
    ) -> Adapter:
        """A caller who is not the operator registers a directory only below
        the project's model roots (as a model), checked before the disk is
        looked at."""
        self._endpoints.endpoint(principal, endpoint_id, Action.WRITE)
        adapter = await self._register(endpoint_id, req, operator=principal.operator)
        await self._audited(principal, AuditAction.ADAPTER_ADD, endpoint_id, adapter.name)
        return adapter

    async def remove(self, principal: Principal, endpoint_id: str, name: str) -> None:
        self._endpoints.endpoint(principal, endpoint_id, Action.WRITE)
        await self._remove(endpoint_id, name)
        await self._audited(principal, AuditAction.ADAPTER_REMOVE, endpoint_id, name)

    async def _audited(
        self, principal: Principal, action: AuditAction, endpoint_id: str, name: str
    ) -> None:
        # The row as it is now: an endpoint deleted meanwhile has no project to audit in.
        row = self._endpoints.find(endpoint_id)
        if row is not None:
            await self._audit.audit_event(
                principal, action, row.project_id, f"endpoint:{endpoint_id}", adapter=name
            )

    async def _register(
        self, endpoint_id: str, req: RegisterAdapterRequest, *, operator: bool
    ) -> Adapter:
        row = self._writable(endpoint_id)
        if row.max_loras == 0:
            raise BadRequest(
                f"Endpoint '{row.name}' runs without LoRA: set engineSettings.maxLoras (PATCH "
                "the endpoint; its replicas are replaced) before registering adapters.",
                param="engineSettings.maxLoras",
                code="lora_disabled",
            )
        if req.name == row.model_name:
            raise BadRequest(
                f"'{req.name}' is the endpoint's base model: an adapter needs another name.",
                param="name",
                code="adapter_name_is_base",
            )
        if len(self.of(endpoint_id)) >= MAX_ADAPTERS_PER_ENDPOINT:
            raise Conflict(
                f"Endpoint '{row.name}' has {MAX_ADAPTERS_PER_ENDPOINT} adapters, the most "
                "one endpoint may have.",
                code="adapter_limit_reached",
            )
        self._check_free(row, req.name)
        source, directory = _adapter_source(req.source)
        if directory is not None and not operator:
            self._roots.check(source, row.project_id)
        try:
            facts = await asyncio.to_thread(read_adapter, await _local(directory, source))
            base = await asyncio.to_thread(self._base_facts, row)
            check_adapter(facts, base, row.max_lora_rank)
        except AdapterRejected as exc:
            raise BadRequest(
                f"Adapter '{req.name}' cannot serve on '{row.model_name}': {exc}",
                param=exc.param,
                code="adapter_mismatch",
            ) from None
        adapter = Adapter(
            endpoint_id, req.name, source, facts.rank, self._clock(), base_model=facts.base_model
        )
        async with self._lock:
            self._check_free(row, req.name)
            try:
                await self._store.add_adapter(adapter)
            except DuplicateAdapter:
                raise self._taken(row, req.name) from None
            except EndpointGone:
                raise _gone(endpoint_id) from None
            await self._reload(endpoint_id)
        logger.info("endpoint %s: adapter %s registered (%s)", endpoint_id, req.name, source)
        return adapter

    async def _remove(self, endpoint_id: str, name: str) -> None:
        self._named(endpoint_id, name)
        async with self._lock:
            if not await self._store.delete_adapter(endpoint_id, name):
                raise NotFound(
                    f"Endpoint '{endpoint_id}' has no adapter '{name}'.",
                    param="name",
                    code="adapter_not_found",
                )
            await self._reload(endpoint_id)
        logger.info("endpoint %s: adapter %s removed", endpoint_id, name)

    def _writable(self, endpoint_id: str) -> Endpoint:
        row = self._endpoints.find(endpoint_id)
        if row is None:
            raise _gone(endpoint_id)
        if row.deleting_at is not None:
            raise Conflict(
                f"Endpoint '{endpoint_id}' is being deleted.", param="id", code="endpoint_deleting"
            )
        return row

    def _check_free(self, row: Endpoint, name: str) -> None:
        if name in self.of(row.id):
            raise self._taken(row, name)

    @staticmethod
    def _taken(row: Endpoint, name: str) -> Conflict:
        return Conflict(
            f"Endpoint '{row.name}' already has an adapter named '{name}'; remove it first.",
            param="name",
            code="adapter_exists",
        )

    def _base_facts(self, row: Endpoint) -> BaseFacts:
        """The base model's weight shapes where its files are on this
        machine (a built-in model is built); a repository that is not in the
        local cache is not downloaded: only the rank is checked then."""
        try:
            source = self._base_source(row.model_name)
        except KeyError:
            return BaseFacts(row.model_name, (), {})
        if not source.startswith(BUILTIN_PREFIX) and not Path(source).is_absolute():
            try:
                directory = _cached_repo(source)
            except ModelUnavailable:
                return BaseFacts(row.model_name, (), {})
        else:
            try:
                directory = resolve_source(source, row.model_name, self._cache_dir)
            except ModelUnavailable:
                return BaseFacts(row.model_name, (), {})
        return read_base(row.model_name, directory)


def _sources(adapters: Mapping[str, Adapter]) -> Mapping[str, str]:
    return MappingProxyType({name: a.source for name, a in adapters.items()})


def _gone(endpoint_id: str) -> NotFound:
    return NotFound(f"No endpoint with id '{endpoint_id}'.", param="id")


def _adapter_source(text: str) -> tuple[str, Path | None]:
    """The stored source (an absolute directory, or a repository id) and the
    directory when it is one; 400 for anything else."""
    text = text.strip()
    if text.startswith("/"):
        return text, Path(text)
    if text.startswith(".") or text.startswith("~"):
        raise BadRequest(
            f"Adapter source '{text}': give an absolute directory (the server's) or a "
            "Hugging Face repository id (org/name).",
            param="source",
            code="invalid_source",
        )
    from inferd.catalog.sources import HF_REPO_ID

    if not HF_REPO_ID.match(text.partition("@")[0]):
        raise BadRequest(
            f"Adapter source '{text}' is neither an absolute directory nor a Hugging Face "
            "repository id (org/name).",
            param="source",
            code="invalid_source",
        )
    return text, None


async def _local(directory: Path | None, source: str) -> Path:
    """The adapter's files on this machine (a repository from the local
    Hugging Face cache, or downloaded where a network exists)."""
    if directory is not None:
        if not await asyncio.to_thread(directory.is_dir):
            raise BadRequest(
                f"Adapter source '{source}': no such directory on the server.",
                param="source",
                code="invalid_source",
            )
        return directory
    try:
        return await asyncio.to_thread(resolve_source, source, source)
    except ModelUnavailable as exc:
        raise BadRequest(str(exc), param="source", code="adapter_unavailable") from None


def _cached_repo(repo: str) -> Path:
    """A repository's snapshot from the local Hugging Face cache, without a
    download (a base model's weights are the replicas' to fetch)."""
    try:
        from huggingface_hub import snapshot_download

        repo_id, _, revision = repo.partition("@")
        return Path(snapshot_download(repo_id, revision=revision or None, local_files_only=True))
    except Exception as exc:
        raise ModelUnavailable(str(exc)) from None
