"""What the OpenAPI document says of a gateway route, declared beside the
route in `inferd.gateway.app.ROUTES` (as the management API's `Operation`
carries its `Doc`); `inferd.gateway.openapi` renders it. A new route is one
entry there, its document included.
"""

from __future__ import annotations

from dataclasses import dataclass

# Every status a proxied request can answer besides 200: the replica's 400,
# the gateway's own refusals, the replica failing.
PROXIED_ERRORS = (400, 401, 404, 413, 429, 500, 503)


@dataclass(frozen=True)
class OwnShape:
    """A route whose request and answer are this project's wire models
    (component schemas of the document)."""

    request: str | None  # the body's schema; None: no body
    answer: str  # the 200 answer's schema
    description: str  # of the 200 answer
    errors: tuple[int, ...] = PROXIED_ERRORS
    # The schema of each server-sent event, where `stream: true` streams.
    stream: str | None = None


@dataclass(frozen=True)
class VllmShape:
    """A route answered by vLLM's own serving code: its request and answer are
    vLLM's protocol models, named here (vLLM's server document describes them)."""

    request: str
    answer: str
    streams: bool = False  # the answer may be server-sent events
    errors: tuple[int, ...] = PROXIED_ERRORS


@dataclass(frozen=True)
class About:
    """What routes of one kind share in the document: a summary and a shape."""

    summary: str
    shape: OwnShape | VllmShape


@dataclass(frozen=True)
class RouteDoc:
    operation_id: str
    about: About


CHAT = About(
    "Chat completion (OpenAI-compatible)",
    OwnShape(
        "ChatCompletionRequest",
        "ChatCompletion",
        "The completion; with `stream: true`, server-sent events passed through as the "
        "replica produces them.",
        errors=(400, 401, 404, 409, 413, 429, 500, 503),
        stream="ChatCompletionStreamEvent",
    ),
)
IMAGES = About(
    "Image generation (OpenAI-compatible)",
    OwnShape("ImageGenerationRequest", "ImagesResponse", "The generated images."),
)
MODELS = About(
    "The model this endpoint serves",
    OwnShape(None, "InferenceModelList", "One model: the endpoint's.", (401, 404, 429, 503)),
)
COMPLETIONS = About(
    "Text completion (OpenAI-compatible, answered by vLLM's serving code)",
    VllmShape("CompletionRequest", "CompletionResponse", streams=True),
)
EMBEDDINGS = About(
    "Embeddings (OpenAI-compatible, answered by vLLM's serving code)",
    VllmShape("EmbeddingRequest", "EmbeddingResponse"),
)
SCORE = About(
    "Relevance scores of text pairs (vLLM's score API)",
    VllmShape("ScoreRequest", "ScoreResponse"),
)
RERANK = About(
    "Documents ranked by relevance to a query (vLLM's rerank API, Jina/Cohere shape)",
    VllmShape("RerankRequest", "RerankResponse"),
)
RESPONSES = About(
    "A response (OpenAI's Responses API, answered by vLLM's serving code; not stored: "
    "`store`, `previous_response_id` and `background` are refused)",
    VllmShape("ResponsesRequest", "ResponsesResponse", streams=True),
)
MESSAGES = About(
    "A message (Anthropic's Messages API, answered by vLLM's serving code; the token as "
    "`x-api-key` or a bearer token)",
    VllmShape("AnthropicMessagesRequest", "AnthropicMessagesResponse", streams=True),
)
