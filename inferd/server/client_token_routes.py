"""Routes of an endpoint's client tokens, mounted at `/inference`.

`/endpoints/{id}/tokens`: the endpoint's own operations' access check
(`Target.ENDPOINT`: its project; listing is a read, creating and revoking
are writes, as re-issuing the owner's token is) covers them, so another
project's endpoint is a 404.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from inferd.api import management as wire
from inferd.api.management import CreateClientTokenRequest
from inferd.control.accounts.roles import Action, Principal
from inferd.control.endpoints.client_tokens import ClientTokenService, client_token_record
from inferd.http import read_model
from inferd.server.access import Operation, Target
from inferd.server.docs import Doc, ok


class ClientTokenRoutes:
    def __init__(self, tokens: ClientTokenService, max_body_bytes: int) -> None:
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes

    async def list_tokens(self, request: Request, principal: Principal) -> Response:
        tokens = await self.tokens.list(principal, request.path_params["id"])
        return JSONResponse({"data": tokens})

    async def get_token(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        return JSONResponse(await self.tokens.get(principal, params["id"], params["name"]))

    async def create(self, request: Request, principal: Principal) -> Response:
        endpoint_id = request.path_params["id"]
        req = await read_model(request, CreateClientTokenRequest, self.max_body_bytes)
        record, token = await self.tokens.create(principal, endpoint_id, req)
        return JSONResponse({**client_token_record(record), "token": token}, status_code=201)

    async def revoke(self, request: Request, principal: Principal) -> Response:
        params = request.path_params
        await self.tokens.revoke(principal, params["id"], params["name"])
        return Response(status_code=204)


# --- the route table ------------------------------------------------------------------

_BASE = "/endpoints/{id}/tokens"
R, W = Action.READ, Action.WRITE

OPERATIONS: tuple[Operation, ...] = (
    Operation("GET", _BASE, Target.ENDPOINT, R, ClientTokenRoutes.list_tokens,
              doc=Doc("listClientTokens", "The endpoint's client tokens (by hint, never the token)",
                      ok(200, "Every client token, oldest first.", wire.ClientTokenList),
                      (404,))),
    Operation("POST", _BASE, Target.ENDPOINT, W, ClientTokenRoutes.create,
              doc=Doc("createClientToken",
                      "Create a named client token beside the owner's, with an optional "
                      "weight (its share at capacity) and rate limit",
                      ok(201, "The token (shown once) and its record.",
                         wire.CreatedClientToken),
                      (400, 403, 404, 409, 413), body=wire.CreateClientTokenRequest)),
    Operation("GET", _BASE + "/{name}", Target.ENDPOINT, R, ClientTokenRoutes.get_token,
              doc=Doc("getClientToken", "One client token (by hint)",
                      ok(200, "The client token.", wire.ClientTokenInfo), (404,))),
    Operation("DELETE", _BASE + "/{name}", Target.ENDPOINT, W, ClientTokenRoutes.revoke,
              doc=Doc("revokeClientToken",
                      "Revoke a client token: it stops working on every instance at once",
                      ok(204, "Revoked."), (403, 404))),
)  # fmt: skip
