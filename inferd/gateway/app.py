"""The gateway: authenticate, hold or route, forward, and account.

`Gateway` is constructed once per server with the registry's
`ReplicaDirectory` and the token verifier; `gateway_routes(gateway)` gives
the Starlette routes mounted on the server app. Each route is a plain ASGI
callable (no request object, no middleware): the body is read once, size
checked, and passed through unparsed; the replica validates it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from inferd import COMPAT_FAMILY
from inferd.api.openai import sse_error
from inferd.api.replica import (
    ADAPTER_SOURCE_HEADER,
    BATCH_REQUEST_HEADER,
    RESUMED_HEADER,
    TOKEN_IDS_HEADER,
)
from inferd.errors import (
    BadRequest,
    InferdError,
    NotFound,
    PayloadTooLarge,
    TooManyRequests,
)
from inferd.gateway import route_doc as docs
from inferd.gateway.affinity import PrefixTable, RequestPrefix, request_prefix, requested_model
from inferd.gateway.auth import (
    WWW_AUTHENTICATE,
    Caller,
    TokenCheck,
    bearer_token,
    caller,
    unauthorized,
)
from inferd.gateway.directory import EndpointRoute, ReplicaDirectory, RoutableReplica
from inferd.gateway.fairness import BYTES_PER_TOKEN, Claim
from inferd.gateway.held_stream import STREAMING_ROUTES, HeldStream
from inferd.gateway.hold import NO_SCALING, CapacitySignal, Dispatcher, endpoint_gone
from inferd.gateway.inprocess import BATCH_PRIORITY, PRIORITY_HEADER, PRIORITY_KEY, grant_of
from inferd.gateway.metrics import UNAUTHENTICATED
from inferd.gateway.migration import DONE_EVENT, Continuation, Finished, Refusal, Transcript, plan
from inferd.gateway.placement import Placements
from inferd.gateway.placement_claims import PLACED, ClaimsPoller
from inferd.gateway.proxy import Broken, Leg, Relayed, Retry, forward, with_call_key
from inferd.gateway.ratelimit import (
    RateLimitExchange,
    RateLimits,
    SharedBuckets,
    retry_after_seconds,
)
from inferd.gateway.route_doc import RouteDoc
from inferd.gateway.routing import NO_AFFINITY, Affinity, Policy
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.state import GatewayState
from inferd.gateway.traffic import EndpointTraffic, TrafficSnapshot
from inferd.gateway.upstream import HttpxUpstream, Upstream
from inferd.gateway.usage import UsageTail
from inferd.http_errors import error_response
from inferd.tracing import end_span, request_id_from, traceparent_of
from inferd.tracing import tracer as process_tracer
from inferd.vocab import ModelKind

logger = logging.getLogger(__name__)
# One line per gateway request, with its request id (uvicorn's own access
# lines for these paths are left out: `inferd.server.access_log`).
access_log = logging.getLogger("inferd.gateway.access")

# Request headers passed to the replica. Not the client's Authorization:
# the endpoint token stops at the gateway.
# The request id and the trace context are set by the gateway itself
# (`handle`): the client's own `x-request-id` is kept when it is sane.
FORWARDED_REQUEST_HEADERS = frozenset({b"content-type", b"accept"})
# Where the replica loads the LoRA adapter a request names; only the
# gateway sets it: a client's own is not forwarded (above).
ADAPTER_SOURCE = ADAPTER_SOURCE_HEADER.encode()
RESUMED = RESUMED_HEADER.encode()
# Asks the replica for each chunk's token ids, which a migration replays.
TOKEN_IDS = (TOKEN_IDS_HEADER.encode(), b"1")
BATCH_REQUEST = (BATCH_REQUEST_HEADER.encode(), b"1")
CLIENT_GONE = 499
# A request's priority class (`PRIORITY_HEADER`): `batch` is released from
# the hold queue only when no interactive request waits. Anyone may send it:
# it can only lower the sender's own priority. In process (the Batch API's
# runner calling the gateway as an ASGI app) the scope's `PRIORITY_KEY` says
# the same.
PRIORITIES = {BATCH_PRIORITY.encode(): True, b"interactive": False}


@dataclass(frozen=True)
class GatewayRoute:
    """One public path under `/endpoints/{endpoint_id}` and where it goes."""

    path: str  # below the endpoint URL
    upstream_path: str  # on the replica
    method: str
    label: str  # metrics route label: chat | completions | images | embeddings | ...
    # Model kinds it serves ("chat", or several: "embedding rerank"); None: any.
    kind: str | None
    # What the OpenAPI document says of it (`inferd.gateway.openapi`).
    doc: RouteDoc = field(kw_only=True)


CHAT = f"/{COMPAT_FAMILY}/v1/chat/completions"
COMPLETIONS = f"/{COMPAT_FAMILY}/v1/completions"
RESPONSES = f"/{COMPAT_FAMILY}/v1/responses"
# Anthropic's client posts to {base_url}/v1/messages: the endpoint URL is its base.
MESSAGES = "/v1/messages"
IMAGES = "/v1/images/generations"
OPENAI_IMAGES = f"/{COMPAT_FAMILY}/v1/images/generations"
ROUTES = (
    GatewayRoute(CHAT, CHAT, "POST", "chat", "chat",
                 doc=RouteDoc("createChatCompletion", docs.CHAT)),
    GatewayRoute(COMPLETIONS, COMPLETIONS, "POST", "completions", "chat",
                 doc=RouteDoc("createCompletion", docs.COMPLETIONS)),
    GatewayRoute(RESPONSES, RESPONSES, "POST", "responses", "chat",
                 doc=RouteDoc("createResponse", docs.RESPONSES)),
    GatewayRoute(MESSAGES, MESSAGES, "POST", "messages", "chat",
                 doc=RouteDoc("createMessage", docs.MESSAGES)),
    GatewayRoute(IMAGES, IMAGES, "POST", "images", "image",
                 doc=RouteDoc("createImage", docs.IMAGES)),
    GatewayRoute("/images/generations", IMAGES, "POST", "images", "image",
                 doc=RouteDoc("createImageFromEndpointBase", docs.IMAGES)),
    GatewayRoute(OPENAI_IMAGES, OPENAI_IMAGES, "POST", "images", "image",
                 doc=RouteDoc("createImageOpenAIBase", docs.IMAGES)),
    GatewayRoute(f"/{COMPAT_FAMILY}/v1/models", f"/{COMPAT_FAMILY}/v1/models", "GET", "models",
                 None, doc=RouteDoc("listEndpointModels", docs.MODELS)),
    # Pooling models, on vLLM's server's paths (the openai client posts
    # embeddings under its base URL; Jina's and Cohere's rerank clients to
    # /v1/rerank and /v2/rerank).
    *(
        GatewayRoute(path, path, "POST", "embeddings", "embedding",
                     doc=RouteDoc(operation_id, docs.EMBEDDINGS))
        for path, operation_id in (
            (f"/{COMPAT_FAMILY}/v1/embeddings", "createEmbedding"),
            ("/v1/embeddings", "createEmbeddingFromEndpointBase"),
        )
    ),
    # vLLM scores pairs with a cross-encoder, or with an embedder (cosine).
    *(
        GatewayRoute(path, path, "POST", "score", "embedding rerank",
                     doc=RouteDoc(operation_id, docs.SCORE))
        for path, operation_id in (("/score", "score"), ("/v1/score", "scoreV1"))
    ),
    *(
        GatewayRoute(path, path, "POST", "rerank", "embedding rerank",
                     doc=RouteDoc(operation_id, docs.RERANK))
        for path, operation_id in (
            ("/rerank", "rerank"), ("/v1/rerank", "rerankV1"), ("/v2/rerank", "rerankV2"),
        )
    ),
)  # fmt: skip
PREFIX = "/endpoints/{endpoint_id}"
# Routes whose streams are continued on another replica when theirs is lost.
MIGRATABLE_ROUTES = frozenset({"chat", "completions"})


class _ClientGone(Exception):
    pass


if TYPE_CHECKING:
    from opentelemetry.trace import Span


class _RequestNotes:
    """What a traced request's span is told on its way: each attempt (the
    replica, why it was chosen, how long the request was held) and each
    retry. Only made when the request is traced."""

    __slots__ = ("attempts", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.attempts = 0

    def attempt(self, replica_id: str, held_s: float, policy: str, affinity: Affinity) -> None:
        self.attempts += 1
        if self.attempts == 1:  # how long the request waited before it was first sent
            self.span.set_attribute("inferd.hold_seconds", round(held_s, 6))
        self.span.set_attributes(
            {
                "inferd.replica": replica_id,
                "inferd.routing.policy": policy,
                # The replica holds the prompt's prefix as far as this gateway knows.
                "inferd.routing.prefix_hit_expected": affinity.cached_on == replica_id,
                "inferd.routing.has_prefix": affinity.home is not None,
                "inferd.attempts": self.attempts,
            }
        )
        if affinity.adapter is not None:
            self.span.set_attribute("inferd.adapter", affinity.adapter)
        self.span.add_event("forwarded", {"replica": replica_id, "held_seconds": held_s})

    def retry(self, replica_id: str, reason: str, detail: str) -> None:
        self.span.add_event("retry", {"replica": replica_id, "reason": reason, "detail": detail})

    def migrated(self, lost: str, reason: str, produced_chars: int, by: str) -> None:
        self.span.add_event(
            "migrated",
            {"lost_replica": lost, "reason": reason, "produced_chars": produced_chars, "by": by},
        )

    def not_migrated(self, reason: str) -> None:
        self.span.add_event("migration_refused", {"reason": reason})


_REQUEST: contextvars.ContextVar[_RequestNotes | None] = contextvars.ContextVar(
    "inferd_gateway_request", default=None
)


def _span_start(endpoint_id: str, route: GatewayRoute) -> dict[str, Any]:
    return {"inferd.endpoint": endpoint_id, "inferd.route": route.label}


def _answer_with_request_id(send: Send, request_id: bytes, usage: UsageTail) -> Send:
    """`send` that puts `x-request-id` on the answer unless the replica did,
    and shows `usage` what the answer's body says."""

    async def sending(message: Any) -> None:
        if message["type"] == "http.response.body":
            usage.seen(message.get("body", b""))
        elif message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            if not any(name.lower() == b"x-request-id" for name, _ in headers):
                headers.append((b"x-request-id", request_id))
                message = {**message, "headers": headers}
        await send(message)

    return sending


def is_batch(scope: Scope, header: bytes | None) -> bool:
    """The request's priority class (400 for a header value that is neither)."""
    if scope.get(PRIORITY_KEY) == BATCH_PRIORITY:
        return True
    if header is None:
        return False
    batch = PRIORITIES.get(header.strip().lower())
    if batch is None:
        raise BadRequest(
            "The x-inferd-priority header is 'batch' or 'interactive'.",
            param="x-inferd-priority",
            code="invalid_header",
        )
    return batch


class Gateway:
    def __init__(
        self,
        directory: ReplicaDirectory,
        verifier: TokenCheck,
        settings: GatewaySettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        upstream: Upstream | httpx.AsyncClient | None = None,
        signals: CapacitySignal = NO_SCALING,
        state: GatewayState | None = None,
        on_migration: Callable[[str, str], None] | None = None,
        shared_limits: SharedBuckets | None = None,
        catch_up: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`clock`: monotonic seconds; `TrafficSnapshot` times are its values.
        `upstream`: the HTTP client to replicas; by default the lean pool
        (`pool.ConnectionPool`); an `httpx.AsyncClient` (or `HttpxUpstream`)
        works too, at several times the CPU per request. `signals`: told
        when a request waits with no ready replica (the reconciler); a
        gateway in front of fixed replicas has nothing to scale. `state`:
        what the control plane reads of this gateway (built first; see
        `inferd.gateway.state`); `upstream` is ignored when it is given.
        `on_migration(endpoint_id, text)`: told of each stream continued on
        another replica (the console's timeline). `shared_limits`: where
        client tokens' rate limits are shared with the other instances (the
        store); None: this instance counts alone. `catch_up(endpoint_id)`:
        reads one endpoint this instance has not heard of from the store
        (one created through another instance a moment ago); None: what is
        in memory is all there is.

        Everything here runs on the server's event loop: call `traffic()`,
        `abort_replica()` and `forget_endpoint()` from it too."""
        self.directory = directory
        self.verifier = verifier
        self.settings = settings or GatewaySettings()
        self.clock = clock
        if isinstance(upstream, httpx.AsyncClient):
            upstream = HttpxUpstream(upstream)
        self.state = state or GatewayState(self.settings, upstream)
        self.upstream = self.state.upstream
        self.metrics = self.state.metrics
        self._book = self.state.book
        self._replica_urls = self.state.replica_urls
        self._dispatcher = Dispatcher(directory, self.settings, clock, signals)
        # Client tokens' rate limits, shared with the other instances.
        self.rate_limits = RateLimits(clock)
        self._limit_exchange = (
            RateLimitExchange(self.rate_limits, shared_limits) if shared_limits else None
        )
        self._on_migration = on_migration or _ignore
        self._catch_up = catch_up
        # Where this gateway sent which prompt prefixes (bounded, LRU).
        self.prefixes = PrefixTable(self.settings.prefix_table_entries)
        # Which replica each live prefix belongs to, by what each cache holds.
        self.placements = Placements()
        # Gateway instances agree on placements through the replicas' lists.
        self._claims = ClaimsPoller(self.placements, directory.ready_replicas, clock, self.upstream)
        self.metrics.watch_placements(self.placements.endpoints)
        # Off unless `inferd serve` was given an OTLP endpoint.
        self.tracer = process_tracer()

    # -- lifecycle and what the control plane reads -----------------------

    async def startup(self) -> None:
        """Start sharing rate limits; nothing to open: connections to
        replicas are made on first use."""
        if self._limit_exchange is not None:
            self._limit_exchange.start()
        if self.settings.routing_place_prefixes and self.settings.routing_policy is Policy.PREFIX:
            self._claims.start()

    async def shutdown(self) -> None:
        """Answer held requests with 503 and close the connections."""
        if self._limit_exchange is not None:
            await self._limit_exchange.stop()
        await self._claims.stop()
        await self._dispatcher.close()
        await self.upstream.aclose()

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        return self.state.traffic(endpoint_id)

    def abort_replica(self, replica_id: str, reason: str = "the replica failed") -> int:
        return self.state.abort_replica(replica_id, reason)

    def forget_endpoint(self, endpoint_id: str) -> None:
        if self._dispatcher.idle(endpoint_id):
            self._dispatcher.forget(endpoint_id)
            self.state.forget_endpoint(endpoint_id)
            self.placements.forget(endpoint_id)

    # -- the request path ---------------------------------------------------

    async def handle(self, scope: Scope, receive: Receive, send: Send, route: GatewayRoute) -> None:
        started = time.perf_counter()
        endpoint_id: str = scope["path_params"]["endpoint_id"]
        label = UNAUTHENTICATED
        status = 500
        authorization = content_length = client_request_id = priority = None
        who: Caller | None = None
        headers = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == PRIORITY_HEADER:
                priority = value
            elif name == b"content-length":
                content_length = value
            elif name == b"x-api-key" and authorization is None:
                # Anthropic's client sends its key here; the same token.
                authorization = b"Bearer " + value
            elif name == b"x-request-id":
                client_request_id = value
            elif name in FORWARDED_REQUEST_HEADERS:
                headers.append((name, value))
        request_id = request_id_from(client_request_id)
        headers.append((b"x-request-id", request_id))
        usage = UsageTail()
        send = _answer_with_request_id(send, request_id, usage)
        trace = self.tracer.start(
            f"{route.method} {route.label}", scope["headers"], _span_start(endpoint_id, route)
        )
        if trace is not None:
            parent = traceparent_of(trace)
            if parent is not None:
                headers.append((b"traceparent", parent))
        # A span that records gets notes on its way (unsampled: none made).
        token = _REQUEST.set(_RequestNotes(trace)) if trace and trace.is_recording() else None
        try:
            # Work this process runs for the endpoint (a batch's requests)
            # carries the grant its creation with a token gave it, and runs
            # as that token's client (its share, rate limit and usage).
            grant = grant_of(scope, endpoint_id)
            who = (
                caller(self.verifier, endpoint_id, authorization)
                if grant is None
                else self.verifier.named(endpoint_id, grant.client)
            )
            if who is None and grant is None and self._catch_up and bearer_token(authorization):
                # Created, or its token re-issued, through another instance a
                # moment ago, and the change not here yet. Any refused token
                # reads, not only one for an unknown id: the time of a 401
                # must not tell which endpoints exist.
                await self._catch_up(endpoint_id)
                who = caller(self.verifier, endpoint_id, authorization)
            if who is None:
                raise unauthorized()
            label = endpoint_id
            endpoint = self.directory.endpoint(endpoint_id)
            if endpoint is None and self._catch_up is not None:
                # Its token's change arrived before its record's.
                await self._catch_up(endpoint_id)
                endpoint = self.directory.endpoint(endpoint_id)
            self._check(endpoint, route)
            assert endpoint is not None
            batch = is_batch(scope, priority)
            if grant is not None:
                # Metered by the batch store when its result is recorded.
                headers.append(BATCH_REQUEST)
            if who.requests_per_minute is not None:
                if self._limit_exchange is not None and not self.rate_limits.known(
                    endpoint_id, who.client
                ):
                    await self._limit_exchange.learn(
                        endpoint_id, who.client, who.requests_per_minute
                    )
                if grant is None:
                    self._rate_limit(endpoint_id, who, who.requests_per_minute)
                else:  # in-process work waits its turn rather than failing
                    await self._rate_limit_wait(endpoint_id, who, who.requests_per_minute)
            if trace is not None:
                trace.set_attribute("inferd.model", endpoint.model_name)
            if route.label == "models":
                status = 200
                await models_response(endpoint)(scope, receive, send)
                return
            body = await self._read_body(receive, content_length)
            prefix = self._prefix(endpoint, route, body)
            if prefix is not None and prefix.adapter is not None:
                headers.append((ADAPTER_SOURCE, adapter_source(endpoint, prefix.adapter)))
            # Work that must neither wake the endpoint nor keep it up (a
            # `running` batch's): no activity, no load, never held at zero.
            background = grant is not None and grant.background
            ep = self._book.endpoint(endpoint_id)
            ep.arrived(self.clock(), background)
            claim = self._dispatcher.claim(ep, who.client, who.weight, batch, len(body), background)
            try:
                status = await self._serve(
                    ep, route, headers, body, prefix, receive, send, claim, usage
                )
            finally:
                ep.ended(self.clock(), background)
        except InferdError as exc:
            status = exc.status
            await self._send_error(exc, scope, receive, send)
        except _ClientGone:
            status = CLIENT_GONE
        finally:
            seconds = time.perf_counter() - started
            self.metrics.answered(label, route.label, status, seconds)
            if who is not None:
                self.metrics.client_answered(endpoint_id, who.client, status, *usage.counts())
            client = scope.get("client")
            access_log.info(
                '%s - "%s %s" %d %.3fs request_id=%s',
                f"{client[0]}:{client[1]}" if client else "-",
                route.method,
                scope["path"],
                status,
                seconds,
                request_id.decode(),
            )
            if trace is not None:
                end_span(trace, status, {"inferd.request_id": request_id.decode()})
            if token is not None:
                _REQUEST.reset(token)

    def _rate_limit(self, endpoint_id: str, who: Caller, per_minute: int) -> None:
        wait = self.rate_limits.take(endpoint_id, who.client, per_minute)
        if wait > 0:
            raise TooManyRequests(
                f"This client token's rate limit of {per_minute} requests per minute is "
                "reached; retry later.",
                code="rate_limited",
                retry_after=retry_after_seconds(wait),
            )

    async def _rate_limit_wait(self, endpoint_id: str, who: Caller, per_minute: int) -> None:
        """Take from the client's bucket, sleeping until it holds one (the
        bucket refills at its own rate: nothing else to wait on)."""
        wait = self.rate_limits.take(endpoint_id, who.client, per_minute)
        while wait > 0:
            await asyncio.sleep(wait)
            wait = self.rate_limits.take(endpoint_id, who.client, per_minute)

    def _check(self, endpoint: EndpointRoute | None, route: GatewayRoute) -> None:
        gone = endpoint_gone(endpoint is not None, endpoint is not None and endpoint.deleting)
        if gone is not None:
            raise gone
        assert endpoint is not None
        if route.kind is not None and endpoint.kind not in route.kind.split():
            # Answered here: a wrong route must not wake a scaled-to-zero
            # endpoint. A 400, not a 404: the path exists, the request is for
            # another kind of model than this endpoint serves.
            raise BadRequest(
                f"This endpoint serves the {endpoint.kind} model '{endpoint.model_name}': "
                f"{ModelKind(endpoint.kind).serves}; {route.path} is not available on it.",
                code="unsupported_route",
            )

    def _prefix(
        self, endpoint: EndpointRoute, route: GatewayRoute, body: bytes
    ) -> RequestPrefix | None:
        """What the routing choice needs of a request's prompt (see
        `inferd.gateway.affinity`); None for bodiless routes."""
        if not body or route.method != "POST":
            return None
        settings = self.settings
        if settings.routing_policy is not Policy.PREFIX:
            model = requested_model(body)
            adapter = model if model and model != endpoint.model_name else None
            return RequestPrefix(None, (), adapter)
        return request_prefix(
            body,
            endpoint.endpoint_id,
            base_model=endpoint.model_name,
            block_bytes=settings.prefix_block_bytes,
            max_blocks=settings.prefix_max_blocks,
        )

    async def _read_body(self, receive: Receive, content_length: bytes | None) -> bytes:
        limit = self.settings.max_body_bytes
        if content_length is not None:
            try:
                declared = int(content_length)
            except ValueError:
                raise BadRequest("Invalid Content-Length header.", code="invalid_header") from None
            if declared > limit:
                raise PayloadTooLarge(
                    f"Request body of {declared} bytes exceeds the limit of {limit} bytes."
                )
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise _ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _serve(
        self,
        ep: EndpointTraffic,
        route: GatewayRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        prefix: RequestPrefix | None,
        receive: Receive,
        send: Send,
        claim: Claim,
        usage: UsageTail,
    ) -> int:
        """Dispatch, with the client's connection watched: if it goes away,
        the work is cancelled at once, which closes the upstream connection,
        which makes the replica abort the generation."""
        task = asyncio.current_task()
        assert task is not None
        watch = _DisconnectWatch(task)
        watcher = asyncio.get_running_loop().create_task(watch.run(receive))
        try:
            return await self._dispatch(ep, route, headers, body, prefix, send, claim, usage)
        except asyncio.CancelledError:
            if watch.gone and task.uncancel() == 0:
                return CLIENT_GONE
            raise
        finally:
            watch.done = True
            watcher.cancel()

    def _placed_on(self, endpoint_id: str, prefix: RequestPrefix, now: float) -> str | None:
        if prefix.home is None or not self.settings.routing_place_prefixes:
            return None
        replicas = self.directory.ready_replicas(endpoint_id)
        return self.placements.place(endpoint_id, prefix.home, len(prefix.blocks), replicas, now)

    def _serving(self, endpoint_id: str) -> set[str]:
        return {r.replica_id for r in self.directory.ready_replicas(endpoint_id)}

    async def _dispatch(
        self,
        ep: EndpointTraffic,
        route: GatewayRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        prefix: RequestPrefix | None,
        send: Send,
        claim: Claim,
        usage: UsageTail,
    ) -> int:
        settings = self.settings
        arrived = self.clock()
        affinity = NO_AFFINITY
        if prefix is not None:
            affinity = Affinity(
                prefix.home,
                self.prefixes.lookup(prefix.blocks),
                prefix.adapter,
                self._placed_on(ep.endpoint_id, prefix, arrived),
            )
        leg = None
        if route.label in MIGRATABLE_ROUTES and settings.migrates(ep.endpoint_id):
            leg = Leg(Transcript(settings.migration_max_transcript_bytes))
            headers = [*headers, TOKEN_IDS]
        progress = None
        if route.label in STREAMING_ROUTES:
            stage = partial(self._waiting_for, ep.endpoint_id)
            progress = HeldStream(body, send, self.clock, settings.hold_progress_seconds, stage)
        try:
            return await self._attempts(
                ep, route, headers, body, prefix, send, claim, usage, arrived, affinity, leg,
                progress,
            )  # fmt: skip
        except InferdError as exc:
            if progress is None or not progress.committed:
                raise
            # The response went out as an event stream while it was held: the
            # status cannot be sent any more, the error goes in-band.
            await progress.fail(exc)
            return exc.status
        finally:
            if progress is not None:
                progress.cancel()

    def _waiting_for(self, endpoint_id: str) -> str:
        """What a held stream is told it waits for."""
        if self.directory.ready_replicas(endpoint_id):
            return "every replica busy"
        return self.directory.coming_stage(endpoint_id) or "starting"

    async def _attempts(
        self,
        ep: EndpointTraffic,
        route: GatewayRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        prefix: RequestPrefix | None,
        send: Send,
        claim: Claim,
        usage: UsageTail,
        arrived: float,
        affinity: Affinity,
        leg: Leg | None,
        progress: HeldStream | None,
    ) -> int:
        """Up to `max_attempts` tries on replicas (a failure before the first
        byte is tried on another); a stream lost midway is migrated."""
        settings = self.settings
        dispatcher = self._dispatcher
        metrics = self.metrics
        deadline = arrived + settings.max_hold_seconds
        exclude: frozenset[str] = frozenset()
        on_hold = None if progress is None else progress.held
        for _ in range(settings.max_attempts):
            replica = await dispatcher.acquire(
                ep, exclude, deadline, affinity, len(body), claim, on_hold
            )
            if progress is not None:
                await progress.placed()
            rid = replica.replica_id
            if prefix is not None and prefix.blocks:
                # Recorded before the answer: the next turn of a conversation
                # may arrive while this one still streams.
                self.prefixes.record(prefix.blocks, rid, partial(self._serving, ep.endpoint_id))
            begun = self.clock()
            if begun - arrived > 0.001:
                metrics.hold.labels(ep.endpoint_id).observe(begun - arrived)
            notes = _REQUEST.get()
            if notes is not None:
                notes.attempt(rid, begun - arrived, self.settings.routing_policy.value, affinity)
            sent_headers = headers
            if affinity.placed_on == rid and affinity.home is not None:
                # The replica lists it for the other gateway instances.
                sent_headers = [*headers, (PLACED, str(affinity.home).encode())]
            result = await self._forward_to(
                ep,
                replica,
                route,
                sent_headers,
                body,
                send,
                leg,
                # Before the slot is released: it goes by the counters
                # corrected by what this answer served.
                settle=partial(self._settle, ep, claim, usage, len(body)),
                committed=progress is not None and progress.committed,
                background=claim.background,
            )
            if isinstance(result, Broken):
                assert leg is not None
                ep.finished(self.clock() - begun)
                return await self._migrate(
                    ep, route, headers, body, affinity, send, leg, result, rid, claim
                )
            if isinstance(result, Relayed):
                ep.finished(self.clock() - begun)
                if 200 <= result.status < 300:
                    self.directory.report_answered(rid)
                if result.broken:
                    metrics.upstream_errors.labels(ep.endpoint_id, "broken_stream").inc()
                return result.status
            metrics.upstream_errors.labels(ep.endpoint_id, result.reason).inc()
            logger.info(
                "endpoint %s: replica %s failed before answering (%s); trying another",
                ep.endpoint_id,
                rid,
                result.detail,
            )
            self._will_retry(ep, rid, result)
            exclude = exclude | {rid}
        raise dispatcher.no_replica_could_take_it(ep, settings.max_attempts)

    async def _forward_to(
        self,
        ep: EndpointTraffic,
        replica: RoutableReplica,
        route: GatewayRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        send: Send,
        leg: Leg | None,
        settle: Callable[[], None] | None = None,
        committed: bool = False,
        background: bool = False,
    ) -> Relayed | Broken | Retry:
        """One attempt on the replica the dispatcher handed out; its slot is
        given back however the attempt ends (after `settle`, when given).
        `committed`: the client's response began while it was held;
        `background`: the request's `Claim.background`."""
        rid = replica.replica_id
        self._replica_urls[rid] = replica.url
        try:
            return await forward(
                self.upstream,
                replica.url,
                route.method,
                route.upstream_path,
                with_call_key(headers, replica.call_key),
                body,
                send,
                leg,
                committed,
            )
        finally:
            if settle is not None:
                settle()
            self._dispatcher.release(ep, rid, background)
            if rid not in ep.in_flight:
                self._replica_urls.pop(rid, None)

    def _will_retry(self, ep: EndpointTraffic, rid: str, failed: Retry) -> None:
        """Bookkeeping of an attempt that failed before its first byte."""
        if failed.unreachable:
            self.directory.report_unreachable(rid, failed.detail)
        self.metrics.retries.labels(ep.endpoint_id, failed.reason).inc()
        notes = _REQUEST.get()
        if notes is not None:
            notes.retry(rid, failed.reason, failed.detail)

    async def _migrate(
        self,
        ep: EndpointTraffic,
        route: GatewayRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        affinity: Affinity,
        send: Send,
        leg: Leg,
        broken: Broken,
        lost: str,
        claim: Claim,
    ) -> int:
        """Continue a stream whose replica was lost after the client had
        bytes of it, on other replicas (held, as a cold request is, while
        none is ready), up to `max_migrations` times; or end it with an
        error event saying why it could not be."""
        settings = self.settings
        metrics = self.metrics
        endpoint_id = ep.endpoint_id
        exclude = frozenset({lost})
        migrations = 0
        while True:
            metrics.upstream_errors.labels(endpoint_id, "broken_stream").inc()
            logger.warning(
                "endpoint %s: replica %s lost mid-stream (%s: %s)",
                endpoint_id,
                lost,
                broken.reason,
                broken.detail,
            )
            if broken.reason == "continuation_refused":
                # The replica refused the continuation itself (a 4xx): another
                # would too.
                step: Continuation | Refusal | Finished = Refusal(
                    "continuation_refused", f"a replica refused to continue it: {broken.detail}"
                )
            elif leg.transcript.overflow:
                step = Refusal("too_long", "more of it was streamed than the gateway keeps")
            elif migrations >= settings.max_migrations:
                step = Refusal("cap", f"it was already continued {migrations} times")
            else:
                step = plan(route.label, body, leg.transcript.data())
            if isinstance(step, Finished):
                await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": False})
                return broken.status
            notes = _REQUEST.get()
            if isinstance(step, Refusal):
                if notes is not None:
                    notes.not_migrated(step.reason)
                await self._end_stream(endpoint_id, send, step)
                return broken.status
            migrations += 1
            metrics.migrations.labels(endpoint_id, broken.reason).inc()
            if notes is not None:
                notes.migrated(lost, broken.reason, step.produced_chars, step.by)
            logger.warning(
                "endpoint %s: continuing the stream on another replica (migration %d, %d "
                "characters already streamed, resumed by %s)",
                endpoint_id,
                migrations,
                step.produced_chars,
                step.by,
            )
            self._on_migration(
                endpoint_id,
                f"a stream's replica {lost} was lost ({broken.reason}); continued on another",
            )
            resumed = [*headers, (RESUMED, str(step.produced_chars).encode())]
            leg.head = step.head
            result = await self._continue(
                ep, route, resumed, step.body, affinity, send, leg, exclude, claim
            )
            if isinstance(result, Refusal):
                await self._end_stream(endpoint_id, send, result)
                return broken.status
            if isinstance(result, Relayed):
                return result.status
            broken, lost = result
            exclude = exclude | {lost}

    async def _continue(
        self,
        ep: EndpointTraffic,
        route: GatewayRoute,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        affinity: Affinity,
        send: Send,
        leg: Leg,
        exclude: frozenset[str],
        claim: Claim,
    ) -> Relayed | Refusal | tuple[Broken, str]:
        """One continuation, retried before its first byte as any request."""
        dispatcher = self._dispatcher
        deadline = self.clock() + self.settings.max_hold_seconds
        for _ in range(self.settings.max_attempts):
            try:
                replica = await dispatcher.acquire(
                    ep, exclude, deadline, affinity, len(body), claim
                )
            except InferdError as exc:
                return Refusal("no_replica", f"no other replica could take it: {exc.message}")
            rid = replica.replica_id
            begun = self.clock()
            notes = _REQUEST.get()
            if notes is not None:
                notes.attempt(rid, 0.0, self.settings.routing_policy.value, affinity)
            result = await self._forward_to(
                ep, replica, route, headers, body, send, leg, background=claim.background
            )
            if isinstance(result, Relayed):
                ep.finished(self.clock() - begun)
                self.directory.report_answered(rid)
                return result
            if isinstance(result, Broken):
                return result, rid
            self._will_retry(ep, rid, result)
            exclude = exclude | {rid}
        return Refusal("no_replica", "no other replica could take it")

    def _settle(self, ep: EndpointTraffic, claim: Claim, usage: UsageTail, body_bytes: int) -> None:
        prompt, completion = usage.counts()
        if completion is not None:
            if prompt is None:
                prompt = body_bytes // BYTES_PER_TOKEN
            self._dispatcher.settle(ep, claim, prompt, completion)

    async def _end_stream(self, endpoint_id: str, send: Send, refusal: Refusal) -> None:
        self.metrics.migrations_refused.labels(endpoint_id, refusal.reason).inc()
        logger.warning(
            "endpoint %s: a stream whose replica was lost is not continued (%s)",
            endpoint_id,
            refusal.reason,
        )
        error = sse_error(
            "The replica serving this stream failed and the response is incomplete; it was "
            f"not continued on another replica because {refusal.why} ({refusal.reason}).",
            "server_error",
            "upstream_failed",
        )
        await send({"type": "http.response.body", "body": error, "more_body": False})

    async def _send_error(
        self, exc: InferdError, scope: Scope, receive: Receive, send: Send
    ) -> None:
        response = error_response(exc)
        if exc.status == 401:
            response.raw_headers.append(WWW_AUTHENTICATE)
        elif exc.status == 413:
            # The rest of the body was not read: do not reuse this connection.
            response.raw_headers.append((b"connection", b"close"))
        await response(scope, receive, send)


def adapter_source(endpoint: EndpointRoute, name: str) -> bytes:
    """The header value telling the replica where adapter `name` is; 404
    (before any replica is woken) when the endpoint has no such model."""
    source = endpoint.adapters.get(name)
    if source is None:
        served = ", ".join(f"'{n}'" for n in (endpoint.model_name, *endpoint.adapters))
        raise NotFound(
            f"The model '{name}' does not exist on this endpoint; it serves {served}.",
            param="model",
            code="model_not_found",
        )
    return quote(source, safe="/:@").encode()


def adapter_root(name: str, source: str) -> str:
    """An adapter's `root` as clients see it: its source as registered when
    that is a repository id, its name when it is a directory on the server
    (a path there is nothing a client can use, and tells it how the server's
    disk is laid out)."""
    return name if source.startswith("/") else source


def models_response(endpoint: EndpointRoute) -> JSONResponse:
    """`/v1/models`, answered here (no replica is woken for it): the base
    model and its LoRA adapters, in vLLM's shape (an adapter's `parent` is
    the base, its `root` where it comes from: `adapter_root`)."""
    base = endpoint.model_name
    card: dict[str, object] = {
        "id": base, "object": "model", "created": 0, "owned_by": "inferd", "root": base
    }  # fmt: skip
    if endpoint.max_model_len is not None:
        card["max_model_len"] = endpoint.max_model_len
    cards = [card]
    cards += [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "inferd",
            "root": adapter_root(name, source),
            "parent": base,
        }
        for name, source in endpoint.adapters.items()
    ]
    return JSONResponse({"object": "list", "data": cards})


def _ignore(endpoint_id: str, text: str) -> None:
    pass


class _DisconnectWatch:
    """Reads the client's side after the body: `http.disconnect` means the
    client left; the handler's task is cancelled so the work stops now."""

    __slots__ = ("done", "gone", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.gone = False
        self.done = False

    async def run(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not self.done:
                    self.gone = True
                    self.task.cancel()
                return


class _Endpoint:
    """The ASGI app of one gateway route (a class instance, so Starlette's
    `Route` passes the raw scope through instead of building a Request)."""

    __slots__ = ("gateway", "route")

    def __init__(self, gateway: Gateway, route: GatewayRoute) -> None:
        self.gateway = gateway
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.gateway.handle(scope, receive, send, self.route)


def gateway_routes(gateway: Gateway) -> list[Route]:
    """Routes to mount at the root of the server app (their paths start with
    `/endpoints/{endpoint_id}`)."""
    return [
        Route(PREFIX + r.path, _Endpoint(gateway, r), methods=[r.method], name=f"gateway{r.path}")
        for r in ROUTES
    ]
