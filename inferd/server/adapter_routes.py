"""Routes of an endpoint's LoRA adapters, mounted at `/inference`.

`/endpoints/{id}/adapters`: the endpoint's own operations' access check
(`Target.ENDPOINT`: its project, read or write) covers them, so an adapter
belongs to the endpoint's project and another project's is a 404.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api import management as wire
from inferd.api.management import RegisterAdapterRequest
from inferd.control.accounts.adapter_metering import AdapterMeter, merge_adapter_usage
from inferd.control.accounts.model import AuditAction
from inferd.control.accounts.roles import Action, Principal
from inferd.control.accounts.service import AccountService
from inferd.control.endpoints.adapters import AdapterService, adapter_record
from inferd.control.model import AdapterUsage, rfc3339
from inferd.control.ports import AdapterStore
from inferd.http import read_model
from inferd.server.access import Operation, Target
from inferd.server.docs import Doc, ok


class AdapterRoutes:
    def __init__(
        self,
        adapters: AdapterService,
        accounts: AccountService,
        max_body_bytes: int,
        usage: AdapterUsageReads,
    ) -> None:
        self.adapters = adapters
        self.accounts = accounts
        self.max_body_bytes = max_body_bytes
        self.usage = usage

    async def list_adapters(self, request: Request, principal: Principal) -> Response:
        adapters = self.adapters.of(request.path_params["id"]).values()
        return JSONResponse({"data": [adapter_record(a) for a in adapters]})

    async def get_adapter(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        return JSONResponse(adapter_record(self.adapters.get(params["id"], params["name"])))

    async def adapter_usage(self, request: Request, principal: Principal) -> Response:
        """Hourly requests and tokens of one adapter (stored, plus what this
        instance has not written yet). Kept after the adapter is removed."""
        params = request.path_params
        endpoint_id, name = params["id"], params["name"]
        stored = await self.usage.store.adapter_usage(endpoint_id, name)
        rows = merge_adapter_usage(stored, self.usage.meter.pending(endpoint_id, name))
        return JSONResponse({"data": [usage_record(r) for r in rows]})

    async def register(self, request: Request, principal: Principal) -> Response:
        endpoint_id = request.path_params["id"]
        req = await read_model(request, RegisterAdapterRequest, self.max_body_bytes)
        adapter = await self.adapters.register(endpoint_id, req, operator=principal.operator)
        await self._audit(principal, AuditAction.ADAPTER_ADD, endpoint_id, adapter.name)
        return JSONResponse(adapter_record(adapter), status_code=201)

    async def remove(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        await self.adapters.remove(params["id"], params["name"])
        await self._audit(principal, AuditAction.ADAPTER_REMOVE, params["id"], params["name"])
        return Response(status_code=204)

    async def _audit(
        self, principal: Principal, action: AuditAction, endpoint_id: str, name: str
    ) -> None:
        row = self.adapters.endpoint(endpoint_id)
        if row is not None:
            await self.accounts.audit_event(
                principal, action, row.project_id, f"endpoint:{endpoint_id}", adapter=name
            )


@dataclass(frozen=True)
class AdapterUsageReads:
    store: AdapterStore
    meter: AdapterMeter


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
