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
from inferd.errors import BadRequest
from inferd.http import DEFAULT_MAX_BODY_BYTES
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.replica.chat import ChatHandler, ServedModel
from inferd.replica.images import ImagesHandler
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState
from inferd.replica.vllm_routes import VllmRouteHandler
from inferd.vocab import ModelKind, ReplicaStatus

CHAT_PATH = f"/{COMPAT_FAMILY}/v1/chat/completions"
COMPLETIONS_PATH = f"/{COMPAT_FAMILY}/v1/completions"
IMAGES_PATHS = ("/v1/images/generations", f"/{COMPAT_FAMILY}/v1/images/generations")
EMBEDDINGS_PATHS = (f"/{COMPAT_FAMILY}/v1/embeddings", "/v1/embeddings")
# vLLM's server's paths for both: Jina's client posts to /v1/rerank,
# Cohere's to /v2/rerank.
SCORE_PATHS = ("/score", "/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
INFERENCE_PATHS = (
    CHAT_PATH,
    COMPLETIONS_PATH,
    *IMAGES_PATHS,
    *EMBEDDINGS_PATHS,
    *SCORE_PATHS,
    *RERANK_PATHS,
)
MODELS_PATH = f"/{COMPAT_FAMILY}/v1/models"
# The agents' APIs, on chat models: OpenAI's Responses (the openai client
# posts under its base URL, .../openai/v1) and Anthropic's Messages (the
# anthropic client posts to {base_url}/v1/messages).
RESPONSES_PATH = f"/{COMPAT_FAMILY}/v1/responses"
MESSAGES_PATH = "/v1/messages"


def build_app(
    engine: Engine,
    state: ReplicaState,
    metrics: ReplicaMetrics,
    model: ServedModel,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    engine_name: str | None = None,
) -> Starlette:
    async def wrong_kind(request: Request) -> Response:
        # A 400, not a 404: the path exists, the request is for another
        # kind of model than this endpoint serves.
        raise BadRequest(
            f"This endpoint serves the {engine.kind.value} model '{model.name}': "
            f"{engine.kind.serves}; {request.url.path} is not available on it.",
            code="unsupported_route",
        )

    def vllm_route(route: str, path: str) -> Route:
        handler = VllmRouteHandler(engine, route, path, state, metrics, model, max_body_bytes)
        return Route(path, handler.handle, methods=["POST"])

    if engine.kind is ModelKind.CHAT:
        chat = ChatHandler(cast(TextEngine, engine), state, metrics, model, max_body_bytes)
        routes = [
            Route(CHAT_PATH, chat.handle, methods=["POST"]),
            vllm_route("completions", COMPLETIONS_PATH),
            vllm_route("responses", RESPONSES_PATH),
            vllm_route("messages", MESSAGES_PATH),
        ]
    elif engine.kind is ModelKind.IMAGE:
        images = ImagesHandler(cast(ImageEngine, engine), state, metrics, model, max_body_bytes)
        routes = [Route(path, images.handle, methods=["POST"]) for path in IMAGES_PATHS]
    else:
        # vLLM scores pairs with a cross-encoder, or with an embedder (the
        # cosine of the two embeddings), as its own server does.
        routes = [vllm_route("score", path) for path in SCORE_PATHS]
        routes += [vllm_route("rerank", path) for path in RERANK_PATHS]
        if engine.kind is ModelKind.EMBEDDING:
            routes += [vllm_route("embeddings", path) for path in EMBEDDINGS_PATHS]
    served = {route.path for route in routes}
    every = (*INFERENCE_PATHS, RESPONSES_PATH, MESSAGES_PATH)
    routes += [Route(p, wrong_kind, methods=["POST"]) for p in every if p not in served]

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
