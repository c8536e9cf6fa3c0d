"""Registered models and measured profiles: register, list, read, delete,
record a benchmark, recommend for a workload.

Each write takes the principal and authorizes it here: a project's model is
acted on by the project's roles (another project's is answered as unknown),
a global or catalog one is read by all and changed by the operator.

A registered model joins the in-memory catalog, so endpoint placement and
the recommender treat it like a catalog model; the store is the record that
survives a restart (`load` puts them back). Writes are serialised by one
lock: validate against the current catalog and endpoints, commit, then
update memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from anyio import to_thread

from inferd.api.engine_settings import EngineSettings
from inferd.api.management import RegisterModelRequest
from inferd.catalog import Catalog
from inferd.catalog.inspect import InspectError
from inferd.catalog.registered import (
    DuplicateModel,
    MeasuredProfile,
    ModelStore,
    ProfileStore,
    RegisteredModel,
    default_name,
    describe,
    qualified_name,
)
from inferd.catalog.roots import ModelRoots, is_local_path
from inferd.catalog.sources import parse_source, read_model_files
from inferd.catalog.support import EngineSupport
from inferd.catalog.workload import Workload, WorkloadRecommendation, recommend_for_workload
from inferd.control.accounts.roles import (
    Action,
    Principal,
    authorize,
    project_to_write,
    require_operator,
)
from inferd.control.follow import follow
from inferd.control.model import Change, ChangeKind, Endpoint, utc_now_text
from inferd.errors import BadRequest, Conflict, NotFound


def model_missing(name: str) -> NotFound:
    return NotFound(f"No model named '{name}'.", param="name", code="model_not_found")


class ModelAndProfileStore(ModelStore, ProfileStore, Protocol):
    pass


class Projects(Protocol):
    """`AccountService.project`: the project, if the principal may act in it."""

    async def project(self, principal: Principal, project_id: str, action: Action) -> object: ...


class NoProjects:
    """A model service without projects (global models only): every
    project is unknown."""

    async def project(self, principal: Principal, project_id: str, action: Action) -> object:
        raise NotFound(f"No project '{project_id}'.", param="projectId", code="project_not_found")


NO_PROJECTS = NoProjects()


def _models_used_by(endpoint: Endpoint) -> tuple[str, ...]:
    """The models an endpoint's replicas load: its own, and the draft model
    of its speculative decoding."""
    speculative = endpoint.engine_settings.speculativeDecoding
    return (endpoint.model_name,) + (() if speculative is None else (speculative.draftModel,))


class ModelService:
    def __init__(
        self,
        store: ModelAndProfileStore,
        catalog: Catalog,
        endpoints: Callable[[], Sequence[Endpoint]],
        *,
        support: EngineSupport | None = None,
        hf_cache_dir: Path | None = None,
        offline: bool | None = None,
        clock: Callable[[], str] = utc_now_text,
        roots: ModelRoots | None = None,
        projects: Projects = NO_PROJECTS,
    ) -> None:
        self._store = store
        self._projects = projects
        self.catalog = catalog
        self._endpoints = endpoints
        self._support = support or EngineSupport()
        # Where Hugging Face sources are looked up (None: huggingface_hub's
        # default cache), and whether the Hub may be asked (None: unless
        # HF_HUB_OFFLINE is set).
        self.hf_cache_dir = hf_cache_dir
        self.offline = offline
        self._clock = clock
        # Where project members may register local directories from.
        self.roots = roots or ModelRoots()
        self._registered: dict[str, RegisteredModel] = {}
        self._profiles: dict[tuple[str, str, int], MeasuredProfile] = {}
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        """Make the catalog's registered models and the profiles what the
        store holds (at start, and when another instance changed them)."""
        # Read under the lock: a snapshot taken before a registration (or a
        # delete) of this instance finished would undo it here until the
        # next change arrived (a model just registered answered 404).
        async with self._lock:
            stored = {m.name: m for m in await self._store.list_models()}
            profiles = {p.key: p for p in await self._store.list_profiles()}
            for name in [n for n in self._registered if n not in stored]:
                self.catalog.models.remove(name)
                del self._registered[name]
            for name, model in stored.items():
                if name in self._registered or name in self.catalog.models:
                    continue  # a catalog file of the same name wins
                self.catalog.models.add(model.spec)
                self._registered[name] = model
            self._profiles = profiles

    async def follow(self, feed: AsyncIterator[Change]) -> None:
        """Follow other instances' registrations and measurements."""

        async def apply(change: Change) -> None:
            if change.kind is ChangeKind.MODEL:
                await self.load()

        await follow(feed, apply, self.load, what="registered models")

    # --- reads -------------------------------------------------------------------------

    def describe(self, name: str) -> dict[str, Any]:
        registered = self._registered.get(name)
        if registered is not None:
            return registered.to_dict()
        if name not in self.catalog.models:
            raise model_missing(name)
        return {**self.catalog.models.get(name).to_dict(), "registered": False}

    def listing(self, project_id: str | None = None) -> list[dict[str, Any]]:
        """Catalog models, then registered ones: global ones and, with a
        project, that project's."""
        return self.visible(lambda p: p == project_id)

    def visible(self, sees: Callable[[str], bool]) -> list[dict[str, Any]]:
        """Catalog models, then registered ones: global ones and those of the
        projects `sees` admits (a caller's: another project's are not shown)."""
        out = []
        for spec in self.catalog.models:
            registered = self._registered.get(spec.name)
            if registered is None:
                out.append({**spec.to_dict(), "registered": False})
            elif registered.project_id is None or sees(registered.project_id):
                out.append(registered.to_dict())
        return out

    def of_project(self, project_id: str) -> list[str]:
        """Names of the models registered in a project."""
        return sorted(n for n, m in self._registered.items() if m.project_id == project_id)

    def owner_of(self, name: str) -> str | None:
        """The project a model belongs to; None for a global or catalog one
        (and for an unknown name: callers check existence themselves)."""
        registered = self._registered.get(name)
        return registered.project_id if registered is not None else None

    def usable_in(self, name: str, project_id: str) -> bool:
        """Whether an endpoint of `project_id` may serve the model: a global
        or catalog model, or one of the project's own."""
        return name in self.catalog.models and self.owner_of(name) in (None, project_id)

    def seen_by(self, name: str, sees: Callable[[str], bool]) -> bool:
        """Whether a caller who sees the projects `sees` admits may know of
        the model at all (read it, be recommended GPUs for it)."""
        if name not in self.catalog.models:
            return False
        owner = self.owner_of(name)
        return owner is None or sees(owner)

    def project_of(self, name: str) -> str | None:
        """The project of a registered model; None for a global or catalog
        one. 404 for an unknown name."""
        registered = self._registered.get(name)
        if registered is not None:
            return registered.project_id
        if name not in self.catalog.models:
            raise model_missing(name)
        return None

    def authorize(
        self, principal: Principal, name: str, action: Action, what: str = "change a global model"
    ) -> None:
        """404 for an unknown model or another project's; a global or
        catalog model is read by all and changed only by the operator
        (`what`: the refusal's words for the change)."""
        project_id = self.project_of(name)
        if project_id is not None:
            authorize(principal, project_id, action, hidden=model_missing(name))
        elif action is not Action.READ:
            require_operator(principal, what)

    def profiles(self) -> list[MeasuredProfile]:
        return list(self._profiles.values())

    def recommend(
        self,
        model_name: str,
        work: Workload,
        location: str | None,
        gpu_type: str | None = None,
        gpu_count: int | None = None,
        engine_settings: EngineSettings | None = None,
    ) -> WorkloadRecommendation:
        model = self.catalog.models.get(model_name)
        return recommend_for_workload(
            model,
            self.catalog.gpus,
            work,
            location,
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            profiles=self.profiles(),
            engine_settings=engine_settings,
        )

    # --- writes ------------------------------------------------------------------------

    def _inspect(self, req: RegisterModelRequest, project_id: str | None) -> RegisteredModel:
        source = parse_source(req.source, req.revision)
        files = read_model_files(source, hf_cache_dir=self.hf_cache_dir, offline=self.offline)
        name = qualified_name(project_id, req.name or default_name(source))
        return describe(
            files,
            source,
            name,
            self._support,
            project_id=project_id,
            created_at=self._clock(),
            description=req.description,
        )

    async def register(self, principal: Principal, req: RegisterModelRequest) -> dict[str, Any]:
        """Without `projectId`, the operator's model is global and a user's
        belongs to the one project it may write in. A caller who is not the
        operator registers a local directory only below the project's model
        roots, checked before the disk is looked at."""
        project_id = req.projectId
        if project_id is None and not principal.operator:
            project_id = project_to_write(principal, None)
        if project_id is not None:
            await self._projects.project(principal, project_id, Action.WRITE)
        if not principal.operator and is_local_path(req.source):
            self.roots.check(req.source, project_id)
        try:
            # File reads, maybe the Hub, and vLLM's registry: off the event loop.
            model = await to_thread.run_sync(self._inspect, req, project_id)
        except InspectError as exc:
            raise BadRequest(
                f"Cannot register '{req.source}': {exc}.",
                param="source",
                code="model_not_supported",
            ) from None
        async with self._lock:
            if model.name in self.catalog.models:
                raise Conflict(
                    f"A model named '{model.name}' already exists; choose another 'name'.",
                    param="name",
                    code="model_name_taken",
                )
            try:
                await self._store.add_model(model)
            except DuplicateModel:
                raise Conflict(
                    f"A model named '{model.name}' already exists.",
                    param="name",
                    code="model_name_taken",
                ) from None
            self.catalog.models.add(model.spec)
            self._registered[model.name] = model
        return model.to_dict()

    async def delete(self, principal: Principal, name: str) -> None:
        self.authorize(principal, name, Action.WRITE)
        async with self._lock:
            if name not in self._registered:
                if name in self.catalog.models:
                    raise Conflict(
                        f"'{name}' is a catalog model (a file under models/catalog); only "
                        "registered models can be deleted.",
                        param="name",
                        code="catalog_model",
                    )
                raise model_missing(name)
            owner = self._registered[name].project_id
            users = [r for r in self._endpoints() if name in _models_used_by(r)]
            if users:
                # A project's model: only its own project's endpoints are
                # named; any other (made before models were checked at
                # create) is none of the caller's business. A global model
                # is deleted by the operator, who sees every endpoint.
                named = sorted(r.name for r in users if owner in (None, r.project_id))
                which = f" {', '.join(named)}" if len(named) == len(users) else ""
                raise Conflict(
                    f"Model '{name}' is used by endpoint(s){which}; delete them first.",
                    param="name",
                    code="model_in_use",
                )
            await self._store.delete_model(name)
            self.catalog.models.remove(name)
            del self._registered[name]

    async def record_profile(self, principal: Principal, profile: MeasuredProfile) -> None:
        self.authorize(principal, profile.model_name, Action.WRITE)
        if profile.model_name not in self.catalog.models:
            raise NotFound(
                f"No model named '{profile.model_name}'.", param="name", code="model_not_found"
            )
        if profile.gpu_type not in self.catalog.gpus.gpu_types:
            raise BadRequest(
                f"Unknown GPU type '{profile.gpu_type}'.",
                param="gpuType",
                code="gpu_type_not_found",
            )
        async with self._lock:
            await self._store.put_profile(profile)
            self._profiles[profile.key] = profile
