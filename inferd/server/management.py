"""Routes of the management API, mounted at `/inference` behind the admin key.

HTTP only: parse and validate (via `inferd.http`, so every failure is a 400
in the one error shape), call the service, map the result to a response.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from inferd.api.management import (
    CreateEndpointRequest,
    GpuTypeInfo,
    LocationInfo,
    ModelInfo,
    RecommendationInfo,
    UpdateEndpointRequest,
)
from inferd.catalog import Catalog, recommend
from inferd.control.ports import Capacity
from inferd.control.service import EndpointService, render_json
from inferd.errors import BadRequest
from inferd.http import read_model

Handler = Callable[[Request], Awaitable[Response]]


def _resource(path: str, **handlers: Handler) -> Route:
    """One route per path, dispatching on the method, so that a 405 answers
    with an `Allow` header listing every method of the path (separate routes
    per method would each report only their own)."""
    by_method = dict(handlers)
    if "GET" in by_method:
        by_method.setdefault("HEAD", by_method["GET"])

    async def dispatch(request: Request) -> Response:
        return await by_method[request.method](request)

    return Route(path, dispatch, methods=list(handlers), name=path)


class ManagementRoutes:
    def __init__(self, service: EndpointService, max_body_bytes: int) -> None:
        self.service = service
        self.max_body_bytes = max_body_bytes
        self._models_json, self._gpu_types, self._locations = _catalog_documents(service.catalog)

    def routes(self) -> list[BaseRoute]:
        return [
            _resource("/endpoints", GET=self.list_endpoints, POST=self.create_endpoint),
            _resource(
                "/endpoints/{id}",
                GET=self.get_endpoint,
                PATCH=self.update_endpoint,
                DELETE=self.delete_endpoint,
            ),
            _resource("/endpoints/{id}/access-token", POST=self.reissue_token),
            _resource("/models", GET=self.list_models),
            _resource("/gpu-types", GET=self.list_gpu_types),
            _resource("/locations", GET=self.list_locations),
            _resource("/recommendations", GET=self.recommendations),
        ]

    # --- endpoints -------------------------------------------------------------------

    async def list_endpoints(self, request: Request) -> Response:
        return Response(self.service.records_json(), media_type="application/json")

    async def create_endpoint(self, request: Request) -> Response:
        req = await read_model(request, CreateEndpointRequest, self.max_body_bytes)
        record, token = await self.service.create(req)
        return JSONResponse({**record, "accessToken": token}, status_code=201)

    async def get_endpoint(self, request: Request) -> Response:
        data = self.service.record_json(request.path_params["id"])
        return Response(data, media_type="application/json")

    async def update_endpoint(self, request: Request) -> Response:
        endpoint_id = request.path_params["id"]
        self.service.row(endpoint_id)  # 404 before a 400 about the body
        req = await read_model(request, UpdateEndpointRequest, self.max_body_bytes)
        return JSONResponse(await self.service.update(endpoint_id, req))

    async def delete_endpoint(self, request: Request) -> Response:
        await self.service.delete(request.path_params["id"])
        return Response(status_code=204)

    async def reissue_token(self, request: Request) -> Response:
        token = await self.service.reissue_token(request.path_params["id"])
        return JSONResponse({"accessToken": token})

    # --- catalog -----------------------------------------------------------------------

    async def list_models(self, request: Request) -> Response:
        return Response(self._models_json, media_type="application/json")

    async def list_gpu_types(self, request: Request) -> Response:
        live = _by_location(await self.service.capacity_of())
        data = [
            {**g, "capacity": {loc: types[g["name"]] for loc, types in live.items()
                               if g["name"] in types}}
            for g in self._gpu_types
        ]  # fmt: skip
        return Response(render_json({"data": data}), media_type="application/json")

    async def list_locations(self, request: Request) -> Response:
        live = _by_location(await self.service.capacity_of())
        data = [{**loc, "capacity": live.get(loc["name"], {})} for loc in self._locations]
        body = {"currency": self.service.catalog.gpus.currency, "data": data}
        return Response(render_json(body), media_type="application/json")

    async def recommendations(self, request: Request) -> Response:
        params = request.query_params
        model_name = params.get("modelName")
        if not model_name:
            raise BadRequest(
                "Query parameter 'modelName' is required.",
                param="modelName",
                code="missing_required_parameter",
            )
        catalog = self.service.catalog
        if model_name not in catalog.models:
            raise BadRequest(
                f"Unknown model '{model_name}'.", param="modelName", code="model_not_found"
            )
        location = params.get("locationName")  # absent: every location; "" is invalid
        if location is not None and location not in catalog.gpus.locations:
            raise BadRequest(
                f"Unknown location '{location}'.", param="locationName", code="location_not_found"
            )
        rec = recommend(catalog.models.get(model_name), catalog.gpus, location)
        body = RecommendationInfo.model_validate(rec.to_dict()).model_dump(mode="json")
        return JSONResponse(body)


def _by_location(capacity: Capacity) -> dict[str, dict[str, dict[str, int]]]:
    """location -> GPU type -> {total, free}, as the wire shows it."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for key, total in capacity.total.items():
        out.setdefault(key.location, {})[key.gpu_type] = {
            "total": total,
            "free": capacity.free.get(key, 0),
        }
    return out


def _catalog_documents(
    catalog: Catalog,
) -> tuple[bytes, list[dict[str, Any]], list[dict[str, Any]]]:
    """The catalog listings, built once: the catalog does not change while
    the server runs (the live capacity is added per request). Passing
    through the wire models keeps each answer to exactly its documented
    fields."""
    gpus = catalog.gpus
    models = [ModelInfo.model_validate(m.to_dict()).model_dump(mode="json")
              for m in catalog.models.all()]  # fmt: skip
    gpu_types = [
        GpuTypeInfo.model_validate(
            {**g.to_dict(), "allowedCounts": list(gpus.allowed_counts_for(g.name))}
        ).model_dump(mode="json")
        for g in gpus.gpu_types.values()
    ]
    locations = [LocationInfo.model_validate(loc.to_dict()).model_dump(mode="json")
                 for loc in gpus.locations.values()]  # fmt: skip
    return render_json({"data": models}), gpu_types, locations
