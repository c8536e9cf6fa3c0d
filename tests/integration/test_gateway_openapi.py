"""The gateway's OpenAPI paths, fuzzed with schemathesis against the gateway
in front of real replica processes (fake engines): every answer must be a
documented status with its documented schema, and none a server error.
(Issue 5 fuzzes the whole server document; this keeps the gateway's part
honest on its own.)"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import schemathesis
import uvicorn
from schemathesis import GenerationMode
from starlette.applications import Starlette

from inferd.control.endpoints.tokens import new_endpoint_token
from inferd.gateway.app import Gateway, gateway_routes
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.openapi import gateway_openapi
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.testing import ReplicaHandle, free_port, verifier_for

CHAT_EP = "fuzz-chat"
IMAGE_EP = "fuzz-image"
TOKENS = {CHAT_EP: new_endpoint_token(), IMAGE_EP: new_endpoint_token()}


def document() -> dict[str, object]:
    part = gateway_openapi()
    return {
        "openapi": "3.1.0",
        "info": {"title": "inferd gateway", "version": "test"},
        "paths": part["paths"],
        "components": part["components"],
    }


schema = schemathesis.openapi.from_dict(document())
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=60,
    # The same cases on every run: a random run once sent a header uvicorn
    # refuses before the app sees it (a plain-text 400 of the HTTP server).
    deterministic=True,
    database="none",
)
# A body over the size limit is refused with 413 before it is read: a
# rejection as valid as a 400 (schemathesis' default list lacks it).
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]
# Schema-valid bodies can still be refused (400) for limits of the engine
# behind the endpoint (context length, images per call, structured output):
# documented 400s, so "schema-valid request rejected" does not apply.
schema.config.checks.update(excluded_check_names=["positive_data_acceptance"])


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    chat = ReplicaHandle("tiny-chat", ["--engine", "fake", "--engine-arg", "token_delay_s=0"])
    image = ReplicaHandle(
        "tiny-sdxl", ["--engine", "fake", "--engine-arg", "kind=image", "--no-warmup"]
    )
    server = None
    thread = None
    try:
        chat.wait_ready(60)
        image.wait_ready(60)
        directory = StaticDirectory()
        directory.add_endpoint(
            EndpointRoute(CHAT_EP, "chat", "tiny-chat"), [RoutableReplica("c", chat.url)]
        )
        directory.add_endpoint(
            EndpointRoute(IMAGE_EP, "image", "tiny-sdxl"), [RoutableReplica("i", image.url)]
        )
        gateway = Gateway(directory, verifier_for(TOKENS), GatewaySettings())

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            yield
            await gateway.shutdown()

        app = Starlette(
            routes=gateway_routes(gateway), exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan
        )
        port = free_port()
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(10)
        chat.stop()
        image.stop()


@pytest.mark.timeout(300)
@schema.parametrize()
def test_gateway_answers_as_documented(case: schemathesis.Case, base_url: str) -> None:
    endpoint_id = IMAGE_EP if "images" in case.path else CHAT_EP
    # Aim every generated request at a real endpoint with its token, so that
    # bodies reach the replica (the auth matrix is tested in test_gateway.py;
    # schemathesis still checks that a request without the token is refused).
    case.path_parameters = {**(case.path_parameters or {}), "endpoint_id": endpoint_id}
    case.call_and_validate(
        base_url=base_url, headers={"Authorization": f"Bearer {TOKENS[endpoint_id]}"}
    )
