"""Recommendations: the GPU options for a model, one service for the
management API's `/recommendations` and the console's tables.

It authorizes (another project's model is answered as an unknown name),
validates (the location, the engine settings against the model, the load the
query names against the model's kind), asks the recommender (through the
model service, so measured profiles count) and holds the answer to the
machines replicas are placed on. An endpoint's engine settings size the
replicas both ways, so the console shows what the API would place.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from inferd.api.engine_settings import EngineSettings
from inferd.api.management import RecommendationInfo
from inferd.catalog import Catalog, recommend
from inferd.catalog.capacity_fit import Totals, within_capacity
from inferd.catalog.models import CatalogError, ModelSpec, parse_size
from inferd.catalog.pooling_workload import PoolingWorkload, size_pooling
from inferd.catalog.recommend import POOLING_KINDS, Recommendation
from inferd.catalog.workload import ChatWorkload, ImageWorkload, Workload, WorkloadRecommendation
from inferd.control.accounts.roles import Principal
from inferd.control.model_service import ModelService
from inferd.control.ports import Capacity
from inferd.errors import BadRequest
from inferd.http import validate
from inferd.vocab import ModelKind

AnyRecommendation = Recommendation | WorkloadRecommendation
# (model name, engine settings): 400 naming the setting the model cannot run with.
SettingsCheck = Callable[[str, EngineSettings], None]


class RecommendationService:
    def __init__(
        self,
        catalog: Catalog,
        models: ModelService,
        check_engine_settings: SettingsCheck,
        capacity_of: Callable[[], Awaitable[Capacity]],
    ) -> None:
        self._catalog = catalog
        self._models = models
        self._check_engine_settings = check_engine_settings
        self._capacity_of = capacity_of

    async def answer(
        self,
        principal: Principal,
        model_name: str,
        location: str | None,
        sizing: Mapping[str, Any],
        load: Mapping[str, str],
    ) -> dict[str, Any]:
        """The API's answer, held to the machines: `location` None is every
        location; `sizing` the engine settings that size a replica, as given;
        `load` the query's load parameters (none: the fixed-concurrency
        ranking). A BadRequest about a setting the model cannot run with
        names it as `engineSettings.<name>`."""
        model = self._visible_model(principal, model_name)
        if location is not None and location not in self._catalog.gpus.locations:
            raise BadRequest(
                f"Unknown location '{location}'.", param="locationName", code="location_not_found"
            )
        # Sized as an endpoint with these engine settings would run it.
        settings = validate(EngineSettings, sizing)
        self._check_engine_settings(model_name, settings)
        totals = await self.totals()
        if model.kind in POOLING_KINDS:
            pooling = pooling_workload_from_query(load)
            if pooling is not None:
                try:
                    sized_pooling = size_pooling(model, self._catalog.gpus, pooling, location)
                except ValueError as exc:
                    raise BadRequest(f"{exc}.", code="invalid_value") from None
                return within_capacity(sized_pooling, totals)
        work = workload_from_query(load, model.kind)
        if work is None:
            rec = recommend(model, self._catalog.gpus, location, engine_settings=settings)
            body = RecommendationInfo.model_validate(rec.to_dict()).model_dump(mode="json")
            return within_capacity(body, totals)
        try:
            sized = self.estimate(model_name, work, location, settings)
        except ValueError as exc:  # a workload the model cannot take
            raise BadRequest(f"{exc}.", param="modelName", code="invalid_value") from None
        return within_capacity(sized.to_dict(), totals)

    def estimate(
        self,
        model_name: str,
        work: Workload | None,
        location: str | None,
        settings: EngineSettings | None = None,
    ) -> AnyRecommendation:
        """The options for a model the caller may see (`work` None: the
        fixed-concurrency ranking, as the API gives without a load)."""
        if work is None:
            model = self._catalog.models.get(model_name)
            return recommend(model, self._catalog.gpus, location, engine_settings=settings)
        return self._models.recommend(model_name, work, location, engine_settings=settings)

    async def capacity(self) -> Capacity:
        """The machines replicas are placed on, by location and GPU type:
        in all and free now (the launcher's)."""
        return await self._capacity_of()

    async def totals(self) -> Totals:
        """(location, GPU type) -> CPU replica slots or GPUs of the machines
        the launcher places replicas on, in all (empty: none known)."""
        capacity = await self._capacity_of()
        return {(k.location, k.gpu_type): n for k, n in capacity.total.items()}

    def _visible_model(self, principal: Principal, model_name: str) -> ModelSpec:
        # Another project's model is answered as an unknown name.
        if not self._models.seen_by(model_name, principal.sees):
            raise BadRequest(
                f"Unknown model '{model_name}'.", param="modelName", code="model_not_found"
            )
        return self._catalog.models.get(model_name)


# --- the load a query names ----------------------------------------------------------

_CHAT_PARAMS = ("requestsPerSecond", "promptTokens", "outputTokens", "ttftP95Ms", "tpotP95Ms")
_IMAGE_PARAMS = ("imagesPerMinute", "size", "steps", "secondsPerImageP95")


def _number(params: Mapping[str, str], name: str, *, integer: bool = False) -> float | None:
    raw = params.get(name)
    if raw is None:
        return None
    try:
        value = float(int(raw)) if integer else float(raw)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise BadRequest(f"'{name}' must be {kind}.", param=name, code="invalid_value") from None
    if not math.isfinite(value) or value <= 0 or value > 1e9:
        raise BadRequest(f"'{name}' must be positive.", param=name, code="invalid_value")
    return value


_POOLING_PARAMS = ("requestsPerSecond", "promptTokens", "inputsPerRequest")


def pooling_workload_from_query(params: Mapping[str, str]) -> PoolingWorkload | None:
    """An embedding or rerank load (requests/s x tokens per input; nothing
    decoded), or None (the fixed-batch ranking)."""
    given = [p for p in (*_CHAT_PARAMS, *_IMAGE_PARAMS, *_POOLING_PARAMS) if p in params]
    if not given:
        return None
    wrong = [p for p in given if p not in _POOLING_PARAMS]
    if wrong:
        raise BadRequest(
            f"'{wrong[0]}' does not apply to an embedding or rerank model (it decodes "
            "nothing): give requestsPerSecond and promptTokens (tokens per input).",
            param=wrong[0],
            code="invalid_value",
        )
    for name in _POOLING_PARAMS[:2]:
        if name not in params:
            raise BadRequest(
                f"A workload needs '{name}' (with 'requestsPerSecond').",
                param=name,
                code="missing_required_parameter",
            )
    return PoolingWorkload(
        requests_per_s=_number(params, "requestsPerSecond") or 0.0,
        tokens_per_input=int(_number(params, "promptTokens", integer=True) or 0),
        inputs_per_request=int(_number(params, "inputsPerRequest", integer=True) or 1),
    )


def workload_from_query(params: Mapping[str, str], kind: str) -> Workload | None:
    """The workload named by the query, or None (the fixed-concurrency ranking)."""
    given = [p for p in (*_CHAT_PARAMS, *_IMAGE_PARAMS) if p in params]
    if not given:
        return None
    needed: tuple[str, ...]
    if kind == ModelKind.CHAT:
        wrong = [p for p in given if p in _IMAGE_PARAMS]
        lead, needed = "requestsPerSecond", _CHAT_PARAMS[:3]
    else:
        wrong = [p for p in given if p in _CHAT_PARAMS]
        lead, needed = "imagesPerMinute", _IMAGE_PARAMS[:1]
    if wrong:
        raise BadRequest(
            f"'{wrong[0]}' does not apply to a {kind} model.", param=wrong[0], code="invalid_value"
        )
    for name in needed:
        if name not in params:
            raise BadRequest(
                f"A workload needs '{name}' (with '{lead}').",
                param=name,
                code="missing_required_parameter",
            )
    if kind == ModelKind.CHAT:
        ttft, tpot = _number(params, "ttftP95Ms"), _number(params, "tpotP95Ms")
        return ChatWorkload(
            requests_per_s=_number(params, "requestsPerSecond") or 0.0,
            prompt_tokens=int(_number(params, "promptTokens", integer=True) or 0),
            output_tokens=int(_number(params, "outputTokens", integer=True) or 0),
            ttft_p95_s=None if ttft is None else ttft / 1000,
            tpot_p95_s=None if tpot is None else tpot / 1000,
        )
    size = None
    if "size" in params:
        try:
            size = parse_size(params["size"], "size")
        except CatalogError as exc:
            raise BadRequest(str(exc), param="size", code="invalid_value") from None
    steps = _number(params, "steps", integer=True)
    return ImageWorkload(
        images_per_minute=_number(params, "imagesPerMinute") or 0.0,
        size=size,
        steps=None if steps is None else int(steps),
        seconds_per_image_p95=_number(params, "secondsPerImageP95"),
    )
