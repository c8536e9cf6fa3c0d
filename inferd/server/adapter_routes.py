"""Routes of an endpoint's LoRA adapters, mounted at `/inference`.

`/endpoints/{id}/adapters`: the endpoint's own operations' access check
(`Target.ENDPOINT`: its project, read or write) covers them, so an adapter
belongs to the endpoint's project and another project's is a 404.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api import management as wire
from inferd.api.management import RegisterAdapterRequest
from inferd.control.accounts.roles import Action, Principal
from inferd.control.endpoints.adapters import AdapterService, adapter_record
from inferd.control.model import AdapterUsage, rfc3339
from inferd.http import read_model
from inferd.server.access import Operation, Target
from inferd.server.docs import Doc, ok


class AdapterRoutes:
    def __init__(self, adapters: AdapterService, max_body_bytes: int) -> None:
        self.adapters = adapters
        self.max_body_bytes = max_body_bytes

    async def list_adapters(self, request: Request, principal: Principal) -> Response:
        adapters = self.adapters.listed(principal, request.path_params["id"])
        return JSONResponse({"data": [adapter_record(a) for a in adapters]})

    async def get_adapter(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        adapter = self.adapters.get(principal, params["id"], params["name"])
        return JSONResponse(adapter_record(adapter))

    async def adapter_usage(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        rows = await self.adapters.usage(principal, params["id"], params["name"])
        return JSONResponse({"data": [usage_record(r) for r in rows]})

    async def register(self, request: Request, principal: Principal) -> Response:
        endpoint_id = request.path_params["id"]
        req = await read_model(request, RegisterAdapterRequest, self.max_body_bytes)
        adapter = await self.adapters.register(principal, endpoint_id, req)
        return JSONResponse(adapter_record(adapter), status_code=201)

    async def remove(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        await self.adapters.remove(principal, params["id"], params["name"])
        return Response(status_code=204)


def usage_record(row: AdapterUsage) -> dict[str, Any]:
    return {
        "hour": rfc3339(row.hour),
        "requests": row.requests,
        "promptTokens": row.prompt_tokens,
        "completionTokens": row.completion_tokens,
    }


# --- the route table ------------------------------------------------------------------

_BASE = "/endpoints/{id}/adapters"
R, W = Action.READ, Action.WRITE

OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", _BASE, Target.ENDPOINT, R, AdapterRoutes.list_adapters,
              doc=Doc("listAdapters", "The endpoint's LoRA adapters",
                      ok(200, "Every adapter, oldest first.", wire.AdapterList), (404,))),
    Operation("POST", _BASE, Target.ENDPOINT, W, AdapterRoutes.register,
              doc=Doc("registerAdapter",
                      "Register a LoRA adapter (checked against the base model; no replica "
                      "restarts: replicas load it on demand)",
                      ok(201, "The adapter as registered.", wire.Adapter),
                      (400, 403, 404, 409, 413), body=wire.RegisterAdapterRequest)),
    Operation("GET", _BASE + "/{name}", Target.ENDPOINT, R, AdapterRoutes.get_adapter,
              doc=Doc("getAdapter", "One LoRA adapter", ok(200, "The adapter.", wire.Adapter),
                      (404,))),
    Operation("DELETE", _BASE + "/{name}", Target.ENDPOINT, W, AdapterRoutes.remove,
              doc=Doc("removeAdapter", "Remove a LoRA adapter (requests naming it are then 404)",
                      ok(204, "Removed."), (403, 404))),
    Operation("GET", _BASE + "/{name}/usage", Target.ENDPOINT, R, AdapterRoutes.adapter_usage,
              doc=Doc("getAdapterUsage", "Requests and tokens one LoRA adapter served, per hour",
                      ok(200, "Hourly rows, oldest first.", wire.AdapterUsageList), (404,))),
)  # fmt: skip
