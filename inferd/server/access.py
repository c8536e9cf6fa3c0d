"""The management API's route table: every operation names what it acts on
and the action it needs, and the dispatcher checks that before the handler
runs. A route exists only as an `Operation`, so none can skip the check, and
the OpenAPI document (`inferd.server.openapi`) is generated from this same
table, each operation's `Doc` with it.

The tables are module constants of the routes classes (their handlers are
those classes' methods), so that the document can be built without a server;
`Routes` pairs a table with the object whose methods answer it.

`ResolvePrincipal` (ASGI middleware) turns the bearer key into a `Principal`
before routing and body parsing: an unauthenticated caller learns nothing
about ids or validation rules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.roles import Action, Principal
from inferd.control.accounts.service import AccountService
from inferd.control.endpoints.reads import EndpointReads
from inferd.control.model_service import ModelService
from inferd.errors import BadRequest
from inferd.server.docs import Doc

# A routes object's method (unbound): (self, request, principal) -> response.
Handler = Callable[[Any, Request, Principal], Awaitable[Response]]


class Target(str, Enum):
    ENDPOINT = "endpoint"  # path {id}: an endpoint; its project and the action are checked
    PROJECT = "project"  # path {id}: a project
    USER = "user"  # path {userId}: the caller, or a user of a project the caller administers
    NEW_ENDPOINT = "new-endpoint"  # the project is in the body; the service checks it
    NEW_MODEL = "new-model"  # the project is in the body; the model service checks it
    # path {name}: a model; a registered one of a project is checked like an
    # endpoint, a global or catalog one is read by all, changed by the operator
    MODEL = "model"
    ANY = "any"  # any principal; answers are filtered to what it may see
    OPERATOR = "operator"  # the operator key only


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # below /inference
    target: Target
    action: Action
    handler: Handler
    # Query parameters it reads; any other is a 400 (a misspelt filter must
    # not silently widen an answer).
    query: tuple[str, ...] = ()
    # What the OpenAPI document says of it.
    doc: Doc = field(kw_only=True)


@dataclass(frozen=True)
class Routes:
    """A route table and the routes object whose methods answer it."""

    owner: object
    operations: Sequence[Operation]


class AccessCheck:
    def __init__(
        self, endpoints: EndpointReads, accounts: AccountService, models: ModelService
    ) -> None:
        self.endpoints = endpoints
        self.accounts = accounts
        self.models = models

    async def check(self, op: Operation, principal: Principal, request: Request) -> None:
        """Each target's own service authorizes (the same check its
        operations make), before the body is read: a caller who may not act
        learns nothing from validation."""
        params = request.path_params
        if op.target is Target.ENDPOINT:
            self.endpoints.endpoint(principal, params["id"], op.action)
        elif op.target is Target.PROJECT:
            await self.accounts.project(principal, params["id"], op.action)
        elif op.target is Target.USER:
            await self.accounts.user_scope(principal, params["userId"])
        elif op.target is Target.MODEL:
            self.models.authorize(
                principal, params["name"], op.action, f"{op.method} a global model"
            )
        elif op.target is Target.OPERATOR:
            self.accounts.operator_only(principal, f"{op.method} /inference{op.path}")


def principal_of(request: Request) -> Principal:
    principal = request.scope.get("state", {}).get("principal")
    if not isinstance(principal, Principal):
        raise RuntimeError("management route reached without ResolvePrincipal")
    return principal


def build_routes(tables: Sequence[Routes], access: AccessCheck) -> list[BaseRoute]:
    """One Starlette route per path, dispatching on the method, so that a 405
    answers with an `Allow` header listing every method of the path."""
    by_path: dict[str, dict[str, tuple[Operation, object]]] = {}
    for table in tables:
        for op in table.operations:
            methods = by_path.setdefault(op.path, {})
            if op.method in methods:
                raise ValueError(f"{op.method} {op.path} is declared twice")
            methods[op.method] = (op, table.owner)
            if op.method == "GET":
                methods.setdefault("HEAD", (op, table.owner))

    def route(path: str, methods: dict[str, tuple[Operation, object]]) -> Route:
        async def dispatch(request: Request) -> Response:
            op, owner = methods[request.method]
            principal = principal_of(request)
            for name in request.query_params:
                if name not in op.query:
                    raise BadRequest(
                        f"Unknown query parameter '{name}'.",
                        param=name,
                        code="unknown_parameter",
                    )
            await access.check(op, principal, request)
            return await op.handler(owner, request, principal)

        return Route(path, dispatch, methods=list(methods), name=path)

    return [route(path, methods) for path, methods in by_path.items()]


class ResolvePrincipal:
    """ASGI middleware: every HTTP request below it needs a management key
    (a user's key or the operator key)."""

    def __init__(self, app: ASGIApp, resolver: PrincipalResolver) -> None:
        self.app = app
        self.resolver = resolver

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            value = None
            for name, raw in scope["headers"]:
                if name == b"authorization":
                    value = raw.decode("latin-1")
                    break
            principal = await self.resolver.resolve(value)
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)
