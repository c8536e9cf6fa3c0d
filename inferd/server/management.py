"""Routes of the management API's endpoints and catalogs, mounted at `/inference`.

HTTP only: parse and validate (via `inferd.http`, so every failure is a 400
in the one error shape), call the service, map the result to a response.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api import management as wire
from inferd.api.engine_settings import SIZING_QUERY, EngineSettings, sizing_from_query
from inferd.api.management import (
    CreateEndpointRequest,
    GpuTypeInfo,
    LocationInfo,
    ModelInfo,
    RecordProfileRequest,
    RegisterModelRequest,
    UpdateEndpointRequest,
)
from inferd.catalog import Catalog
from inferd.catalog.models import KINDS as MODEL_KINDS
from inferd.catalog.registered import MeasuredProfile, ProfilePoint
from inferd.control.accounts.roles import Action, Principal
from inferd.control.endpoints.reads import EndpointReads, render_json
from inferd.control.endpoints.service import EndpointCommands
from inferd.control.model import utc_now_text
from inferd.control.model_service import ModelService
from inferd.control.paging import EndpointFilter
from inferd.control.ports import Capacity
from inferd.control.recommendations import RecommendationService
from inferd.errors import BadRequest
from inferd.http import read_model
from inferd.server.access import Operation, Target
from inferd.server.docs import Answer, Doc, Param, ok
from inferd.server.paging import (
    ENDPOINT_FILTERS,
    MODEL_FILTERS,
    PAGE_PARAMS,
    filter_value,
    next_cursor,
    paged_body,
    read_key_page,
    read_page,
)
from inferd.vocab import EndpointStatus

_STATUSES = tuple(s.value for s in EndpointStatus)


class ManagementRoutes:
    def __init__(
        self,
        endpoints: EndpointReads,
        commands: EndpointCommands,
        models: ModelService,
        recommendations: RecommendationService,
        catalog: Catalog,
        max_body_bytes: int,
    ) -> None:
        self.endpoints = endpoints
        self.commands = commands
        self.models = models
        self.recommender = recommendations
        self.max_body_bytes = max_body_bytes
        self._catalog = catalog
        self._gpu_types, self._locations = _catalog_documents(catalog)

    # --- endpoints -------------------------------------------------------------------

    async def list_endpoints(self, request: Request, principal: Principal) -> Response:
        query = {name: filter_value(request, name) for name in ENDPOINT_FILTERS}
        status = query["status"]
        if status is not None and status not in _STATUSES:
            raise BadRequest(
                f"Unknown status '{status}'; one of: {', '.join(_STATUSES)}.",
                param="status",
                code="invalid_value",
            )
        page = read_page(request, "endpoints", query)
        project_id = query["projectId"]
        where = EndpointFilter(
            project_ids=None if project_id is None else frozenset([project_id]),
            model_name=query["modelName"],
            location_name=query["locationName"],
            name_prefix=query["namePrefix"],
        )
        data, after = await self.endpoints.page_json(
            principal, where, status, page.after, page.limit
        )
        cursor = next_cursor("endpoints", query, after)
        more = b"" if cursor is None else b',"continue":' + render_json(cursor)
        return Response(b'{"data":[' + data + b"]" + more + b"}", media_type="application/json")

    async def create_endpoint(self, request: Request, principal: Principal) -> Response:
        req = await read_model(request, CreateEndpointRequest, self.max_body_bytes)
        record, token = await self.commands.create(principal, req, req.projectId)
        return JSONResponse({**record, "accessToken": token}, status_code=201)

    async def get_endpoint(self, request: Request, principal: Principal) -> Response:
        data = self.endpoints.get_json(principal, request.path_params["id"])
        return Response(data, media_type="application/json")

    async def update_endpoint(self, request: Request, principal: Principal) -> Response:
        endpoint_id = request.path_params["id"]
        req = await read_model(request, UpdateEndpointRequest, self.max_body_bytes)
        return JSONResponse(await self.commands.update(principal, endpoint_id, req))

    async def delete_endpoint(self, request: Request, principal: Principal) -> Response:
        await self.commands.delete(principal, request.path_params["id"])
        return Response(status_code=204)

    async def reissue_token(self, request: Request, principal: Principal) -> Response:
        token = await self.commands.reissue_token(principal, request.path_params["id"])
        return JSONResponse({"accessToken": token})

    # --- catalog -----------------------------------------------------------------------

    async def list_models(self, request: Request, principal: Principal) -> Response:
        # The catalog's files and the registrations (change-fed) are both held
        # in memory: a page is a keyset by name over that copy, rendered per
        # call (tens of entries).
        query = {name: filter_value(request, name) for name in MODEL_FILTERS}
        kind, project_id, prefix = query["kind"], query["projectId"], query["namePrefix"]
        if kind is not None and kind not in MODEL_KINDS:
            raise BadRequest(
                f"Unknown kind '{kind}'; one of: {', '.join(MODEL_KINDS)}.",
                param="kind",
                code="invalid_value",
            )
        page = read_key_page(request, "models", query)
        found = sorted(
            (m for m in self.models.visible(principal.sees)
             if (page.after is None or m["name"] > page.after)
             and (kind is None or m["kind"] == kind)
             and (project_id is None or m.get("projectId") == project_id)
             and (prefix is None or m["name"].startswith(prefix))),
            key=lambda m: str(m["name"]),
        )  # fmt: skip
        after = found[page.limit - 1]["name"] if len(found) > page.limit else None
        data = [_model_info(m) for m in found[: page.limit]]
        body = paged_body(data, "models", query, after)
        return Response(render_json(body), media_type="application/json")

    async def register_model(self, request: Request, principal: Principal) -> Response:
        req = await read_model(request, RegisterModelRequest, self.max_body_bytes)
        registered = await self.models.register(principal, req)
        return JSONResponse(_model_info(registered), status_code=201)

    async def get_model(self, request: Request, principal: Principal) -> Response:
        return JSONResponse(_model_info(self.models.describe(request.path_params["name"])))

    async def delete_model(self, request: Request, principal: Principal) -> Response:
        await self.models.delete(principal, request.path_params["name"])
        return Response(status_code=204)

    async def list_profiles(self, request: Request, principal: Principal) -> Response:
        name = request.path_params["name"]
        self.models.describe(name)  # 404 for an unknown model
        data = [p.to_dict() for p in self.models.profiles() if p.model_name == name]
        return JSONResponse({"data": data})

    async def record_profile(self, request: Request, principal: Principal) -> Response:
        name = request.path_params["name"]
        kind = self.models.describe(name)["kind"]
        req = await read_model(request, RecordProfileRequest, self.max_body_bytes)
        profile = MeasuredProfile(
            model_name=name,
            gpu_type=req.gpuType,
            gpu_count=req.gpuCount,
            kind=kind,
            prompt_tokens=req.promptTokens,
            output_tokens=req.outputTokens,
            image_size=req.imageSize,
            endpoint=req.endpoint,
            points=tuple(ProfilePoint.from_dict(p.model_dump()) for p in req.points),
            measured_at=utc_now_text(),
        )
        await self.models.record_profile(principal, profile)
        return JSONResponse(profile.to_dict(), status_code=201)

    async def list_gpu_types(self, request: Request, principal: Principal) -> Response:
        live = _by_location(await self.recommender.capacity())
        data = [
            {**g, "capacity": {loc: types[g["name"]] for loc, types in live.items()
                               if g["name"] in types}}
            for g in self._gpu_types
        ]  # fmt: skip
        return Response(render_json({"data": data}), media_type="application/json")

    async def list_locations(self, request: Request, principal: Principal) -> Response:
        live = _by_location(await self.recommender.capacity())
        data = [{**loc, "capacity": live.get(loc["name"], {})} for loc in self._locations]
        body = {"currency": self._catalog.gpus.currency, "data": data}
        return Response(render_json(body), media_type="application/json")

    async def recommendations(self, request: Request, principal: Principal) -> Response:
        params = request.query_params
        model_name = params.get("modelName")
        if not model_name:
            raise BadRequest(
                "Query parameter 'modelName' is required.",
                param="modelName",
                code="missing_required_parameter",
            )
        try:
            # locationName absent: every location ("" is invalid).
            body = await self.recommender.answer(
                principal, model_name, params.get("locationName"), sizing_from_query(params), params
            )
        except BadRequest as exc:  # a setting is named as the query parameter it is here
            if exc.param is not None and exc.param.startswith("engineSettings."):
                exc.param = exc.param.removeprefix("engineSettings.")
            raise
        return JSONResponse(body)


def _model_info(data: dict[str, Any]) -> dict[str, Any]:
    """Exactly the documented fields of a model."""
    return ModelInfo.model_validate(data).model_dump(mode="json")


def _by_location(capacity: Capacity) -> dict[str, dict[str, dict[str, int]]]:
    """location -> GPU type -> {total, free}, as the wire shows it."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key, total in capacity.total.items():
        out.setdefault(key.location, {})[key.gpu_type] = {
            "total": total,
            "free": capacity.free.get(key, 0),
        }
    return out


def _catalog_documents(catalog: Catalog) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The GPU type and location listings, built once: they do not change
    while the server runs (the live capacity is added per request; models
    are listed per request, as registrations come and go). Passing through
    the wire models keeps each answer to exactly its documented fields."""
    gpus = catalog.gpus
    gpu_types = [
        GpuTypeInfo.model_validate(
            {**g.to_dict(), "allowedCounts": list(gpus.allowed_counts_for(g.name))}
        ).model_dump(mode="json")
        for g in gpus.gpu_types.values()
    ]
    locations = [LocationInfo.model_validate(loc.to_dict()).model_dump(mode="json")
                 for loc in gpus.locations.values()]  # fmt: skip
    return gpu_types, locations


# --- the route table ------------------------------------------------------------------

R, W = Action.READ, Action.WRITE
_CREATED_LINKS = ("getEndpoint", "updateEndpoint", "deleteEndpoint", "requestAccessToken")


def _workload(description: str, integer: bool = False) -> Param:
    schema = {"type": "integer" if integer else "number", "exclusiveMinimum": 0, "maximum": 1e9}
    return Param(description, schema)


def _sizing(name: str) -> Param:
    """An engine setting as a query parameter: its schema and description
    are the wire model's (less the null that clears it in a PATCH)."""
    prop = EngineSettings.model_json_schema()["properties"][name]
    (schema,) = [b for b in prop["anyOf"] if b.get("type") != "null"]
    description = f"{prop.get('description', name)} Sized as an endpoint with this engine "
    return Param(description + "setting would run.", schema)


# With these, the answer is a WorkloadRecommendationInfo: per option the
# batch, replicas and total cost for the load.
_RECOMMENDATION_QUERY = {
    "modelName": Param(None, {"type": "string", "minLength": 1}, required=True),
    "locationName": Param(
        "Omitted: every location.", {"type": "string", "minLength": 1}, catalog="locations"
    ),
    "requestsPerSecond": _workload("Chat load; with promptTokens and outputTokens."),
    "promptTokens": _workload("Prompt tokens per request.", integer=True),
    "outputTokens": _workload("Output tokens per request.", integer=True),
    "ttftP95Ms": _workload("Time-to-first-token target at p95, ms."),
    "tpotP95Ms": _workload("Time-per-output-token target at p95, ms."),
    "imagesPerMinute": _workload("Image load."),
    "size": Param("Image size WxH.", {"type": "string", "pattern": "^[0-9]+x[0-9]+$"}),
    "steps": _workload("Denoising steps.", integer=True),
    "secondsPerImageP95": _workload("Seconds-per-image target at p95."),
    "inputsPerRequest": _workload(
        "Embedding or rerank load: inputs per request (default 1).", integer=True
    ),
    # The engine settings that size a replica, as an endpoint would have them.
    **{name: _sizing(name) for name in SIZING_QUERY},
}

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "GET", "/endpoints", Target.ANY, R, ManagementRoutes.list_endpoints,
        (*ENDPOINT_FILTERS, *PAGE_PARAMS),
        doc=Doc("listEndpoints", "List the endpoints of the caller's projects",
                ok(200, "A page of endpoints, oldest first.", wire.EndpointList), (400,)),
    ),
    Operation(
        "POST", "/endpoints", Target.NEW_ENDPOINT, W, ManagementRoutes.create_endpoint,
        doc=Doc("createEndpoint", "Create an endpoint",
                (Answer(201, "The new endpoint and its access token (shown once).",
                        wire.CreatedEndpoint, links=_CREATED_LINKS),),
                (400, 403, 404, 409, 413), body=wire.CreateEndpointRequest),
    ),
    Operation(
        "GET", "/endpoints/{id}", Target.ENDPOINT, R, ManagementRoutes.get_endpoint,
        doc=Doc("getEndpoint", "Get an endpoint",
                ok(200, "The endpoint record.", wire.EndpointRecord), (404,)),
    ),
    Operation(
        "PATCH", "/endpoints/{id}", Target.ENDPOINT, W, ManagementRoutes.update_endpoint,
        doc=Doc("updateEndpoint", "Change scaling settings (or the GPU type and count)",
                ok(200, "The updated record.", wire.EndpointRecord), (400, 403, 404, 409, 413),
                body=wire.UpdateEndpointRequest),
    ),
    Operation(
        "DELETE", "/endpoints/{id}", Target.ENDPOINT, W, ManagementRoutes.delete_endpoint,
        doc=Doc("deleteEndpoint", "Delete an endpoint (its replicas drain first)",
                ok(204, "Deleted."), (403, 404)),
    ),
    Operation(
        "POST", "/endpoints/{id}/access-token", Target.ENDPOINT, W, ManagementRoutes.reissue_token,
        doc=Doc("requestAccessToken",
                "Request a new access token; the previous one stops working at once",
                ok(200, "The new token (shown once).", wire.AccessToken), (403, 404, 409)),
    ),
    Operation(
        "GET", "/models", Target.ANY, R, ManagementRoutes.list_models,
        (*MODEL_FILTERS, *PAGE_PARAMS),
        doc=Doc("listModels", "Models: the catalog's and the registered ones",
                ok(200, "A page of models, by name.", wire.ModelList), (400,)),
    ),
    Operation(
        "POST", "/models", Target.NEW_MODEL, W, ManagementRoutes.register_model,
        doc=Doc("registerModel",
                "Register a model from a Hugging Face repository or a server directory",
                ok(201, "The model as read from its own files.", wire.ModelInfo),
                (400, 403, 404, 409, 413), body=wire.RegisterModelRequest),
    ),
    Operation(
        "GET", "/models/{name}", Target.MODEL, R, ManagementRoutes.get_model,
        doc=Doc("getModel", "Get a model", ok(200, "The model.", wire.ModelInfo), (404,)),
    ),
    Operation(
        "DELETE", "/models/{name}", Target.MODEL, W, ManagementRoutes.delete_model,
        doc=Doc("deleteModel", "Delete a registered model (refused while an endpoint uses it)",
                ok(204, "Deleted."), (403, 404, 409)),
    ),
    Operation(
        "GET", "/models/{name}/profiles", Target.MODEL, R, ManagementRoutes.list_profiles,
        doc=Doc("listProfiles", "Measured profiles of a model",
                ok(200, "Profiles.", wire.ProfileList), (404,)),
    ),
    Operation(
        "POST", "/models/{name}/profiles", Target.MODEL, W, ManagementRoutes.record_profile,
        doc=Doc("recordProfile", "Record a measured profile (what `inferd bench` posts)",
                ok(201, "The profile as stored.", wire.ProfileInfo), (400, 403, 404, 413),
                body=wire.RecordProfileRequest),
    ),
    Operation(
        "GET", "/gpu-types", Target.ANY, R, ManagementRoutes.list_gpu_types,
        doc=Doc("listGpuTypes", "GPU types", ok(200, "GPU types.", wire.GpuTypeList)),
    ),
    Operation(
        "GET", "/locations", Target.ANY, R, ManagementRoutes.list_locations,
        doc=Doc("listLocations", "Locations with the GPU types offered and their hourly prices",
                ok(200, "Locations.", wire.LocationList)),
    ),
    Operation(
        "GET", "/recommendations", Target.ANY, R, ManagementRoutes.recommendations,
        tuple(_RECOMMENDATION_QUERY),
        doc=Doc("recommend",
                "GPU options for a model, ranked by cost per output token (or image)",
                (Answer(200, "Ranked options and rejected ones with reasons.",
                        (wire.RecommendationInfo, wire.WorkloadRecommendationInfo)),),
                (400,), query=_RECOMMENDATION_QUERY),
    ),
)  # fmt: skip
