"""The replica's Starlette app: routes only; handlers do the protocol work.

Engines are told apart by their `kind`, not `isinstance` against the
protocols: a runtime protocol check reads every property, and an engine's
`info` is only available once it has loaded."""

from __future__ import annotations

from typing import cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inferd import COMPAT_FAMILY
from inferd.engines.base import Engine, ImageEngine, TextEngine
from inferd.errors import NotFound
from inferd.http import DEFAULT_MAX_BODY_BYTES
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.replica.chat import ChatHandler, ServedModel
from inferd.replica.images import ImagesHandler
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState
from inferd.vocab import ModelKind, ReplicaStatus

CHAT_PATH = f"/{COMPAT_FAMILY}/v1/chat/completions"
IMAGES_PATHS = ("/v1/images/generations", f"/{COMPAT_FAMILY}/v1/images/generations")
MODELS_PATH = f"/{COMPAT_FAMILY}/v1/models"


def build_app(
    engine: Engine,
    state: ReplicaState,
    metrics: ReplicaMetrics,
    model: ServedModel,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    engine_name: str | None = None,
) -> Starlette:
    async def wrong_kind(request: Request) -> Response:
        kind = "chat" if engine.kind is ModelKind.CHAT else "image"
        raise NotFound(
            f"This endpoint serves the {kind} model '{model.name}'; "
            f"{request.url.path} is not available on it.",
            code="unsupported_route",
        )

    if engine.kind is ModelKind.CHAT:
        chat = ChatHandler(cast(TextEngine, engine), state, metrics, model, max_body_bytes)
        routes = [Route(CHAT_PATH, chat.handle, methods=["POST"])]
        routes += [Route(path, wrong_kind, methods=["POST"]) for path in IMAGES_PATHS]
    else:
        images = ImagesHandler(cast(ImageEngine, engine), state, metrics, model, max_body_bytes)
        routes = [Route(path, images.handle, methods=["POST"]) for path in IMAGES_PATHS]
        routes.append(Route(CHAT_PATH, wrong_kind, methods=["POST"]))

    async def health(request: Request) -> Response:
        ready = state.status is ReplicaStatus.READY
        body = {
            "status": state.status.value,
            "model": model.name,
            "engine": engine_name,
            "reason": state.reason,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def list_models(request: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model.name, "object": "model", "created": 0, "owned_by": "inferd"}],
            }
        )

    routes += [
        # `/healthz` as on `inferd serve`; `/health` as on vLLM's own server,
        # so that probes written for either find the replica.
        Route("/healthz", health, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
        Route(MODELS_PATH, list_models, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers=EXCEPTION_HANDLERS)
