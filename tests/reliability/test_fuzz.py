"""Item 10: every public route of a real `inferd serve`, fuzzed from the one
OpenAPI document it serves (`/openapi.json`: the management API, the
gateway's inference routes, `/healthz`, `/metrics`), with schemathesis,
positive and negative data, 100 examples per operation.

The gateway's operations are aimed at two real endpoints (a chat and an
image one, fake-engine replica processes behind them) with their tokens, so
bodies reach a replica; management operations carry a user's management key
(an admin of the project the targets are in), so every call also passes
through the principal, project and role checks.
schemathesis' own checks still send requests without the credentials and
expect them refused. Every answer must be documented, status and schema,
and none a server error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode

from inferd.catalog import load_catalog
from inferd.gateway.app import PREFIX, ROUTES
from inferd.server.app import openapi_document, serving_openapi
from inferd.settings import load_settings
from inferd.testing import ServeHandle
from tests.reliability.fault_support import Endpoint

pytestmark = pytest.mark.reliability(item=10)

EXAMPLES = 100
SETTINGS = {
    "replica_args": "--engine fake --engine-arg token_delay_s=0",
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    # Fuzzed creates ask for replicas too: the two slots are the targets',
    # so theirs stay pending instead of starting processes.
    "cpu_replica_slots": "2",
    "max_replicas_cap": "2",
    "max_body_bytes": "65536",
}


def served_document() -> dict[str, Any]:
    """The document `inferd serve` with SETTINGS serves, built the way it
    builds it (a test holds the two together), so that the tests can be
    generated at import time. Only `servers` (its URL) differs: the server's
    port is chosen when it starts."""
    settings = load_settings(env={}, overrides=SETTINGS)
    catalog = load_catalog(settings.models_dir, settings.configs_dir)
    return openapi_document(settings, catalog, [serving_openapi()])


DOCUMENT = served_document()
schema = schemathesis.openapi.from_dict(DOCUMENT)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    deterministic=True,  # derandomized: the same cases on every run
    database="none",
)
# A body over the size limit is refused with 413 before it is read: a
# rejection as valid as a 400 (not in schemathesis' default list).
_rejection = schema.config.checks.negative_data_rejection
_rejection.expected_statuses = [*_rejection.expected_statuses, "413"]
# Schema-valid requests can still be refused for what the schema cannot say:
# a taken name (409), a GPU type not offered in the location, an engine
# limit (context length, images per call): documented 4xx answers.
schema.config.checks.update(excluded_check_names=["positive_data_acceptance"])


class Targets:
    def __init__(self, serve: ServeHandle, chat: Endpoint, image: Endpoint, user_key: str) -> None:
        self.serve = serve
        self.chat = chat
        self.image = image
        self.user_key = user_key
        self.statuses: dict[str, dict[int, int]] = {}

    def count(self, label: str, status: int) -> None:
        by_status = self.statuses.setdefault(label, {})
        by_status[status] = by_status.get(status, 0) + 1


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    serve = ServeHandle(tmp_path_factory.mktemp("fuzz"), settings=SETTINGS).start()
    try:
        chat = Endpoint.create(serve, name="fuzz-chat", modelName="tiny-chat", minReplicas=1)
        image = Endpoint.create(serve, name="fuzz-image", modelName="tiny-sdxl", minReplicas=1)
        for endpoint in (chat, image):
            serve.wait_record(endpoint.id, lambda r: r["status"] == "running", timeout=60)
        added = httpx.put(
            f"{serve.url}/inference/projects/default/members/fuzzer",
            json={"role": "admin"},
            headers={"Authorization": f"Bearer {serve.admin_key}"},
        )
        assert added.status_code == 201, added.text
        found = Targets(serve, chat, image, added.json()["createdKey"]["key"])
        yield found
        print("\nfuzzed calls per operation {status: count}:")
        for label, by_status in sorted(found.statuses.items()):
            print(f"  {label:58} {sum(by_status.values()):4}  {dict(sorted(by_status.items()))}")
    finally:
        serve.cleanup()


def test_one_document_describes_every_public_route(targets: Targets) -> None:
    """The served /openapi.json is the one the tests are generated from (bar
    its server URL): every gateway route, /healthz, /metrics,
    /inference/endpoints; each operation needs its own credential or none."""
    served = httpx.get(targets.serve.url + "/openapi.json").json()
    assert served.pop("servers") == [{"url": targets.serve.url}]
    assert served == {k: v for k, v in DOCUMENT.items() if k != "servers"}
    paths = set(served["paths"])
    assert {PREFIX + route.path for route in ROUTES} <= paths
    assert {"/healthz", "/metrics", "/openapi.json", "/inference/endpoints"} <= paths
    assert set(served["components"]["securitySchemes"]) == {"adminKey", "endpointToken"}
    for path, ops in served["paths"].items():
        for op in ops.values():
            scheme = "endpointToken" if path.startswith("/endpoints/") else "adminKey"
            assert op.get("security", [{scheme: []}]) in ([], [{scheme: []}]), path


@pytest.mark.timeout(300)
@schema.parametrize()
def test_every_operation_answers_as_documented(case: schemathesis.Case, targets: Targets) -> None:
    """One generated case (positive or negative data) with the endpoint's token
    or a user's management key: no server error, status and schema as documented, bad
    input refused (413 allowed), unauthenticated calls refused."""
    if case.path.startswith("/endpoints/"):
        endpoint = targets.image if "images" in case.path else targets.chat
        case.path_parameters = {**(case.path_parameters or {}), "endpoint_id": endpoint.id}
        headers = endpoint.headers
    else:
        headers = {"Authorization": f"Bearer {targets.user_key}"}
    response = case.call_and_validate(base_url=targets.serve.url, headers=headers, timeout=30)
    targets.count(f"{case.method} {case.path}", response.status_code)


def test_every_operation_got_its_examples(targets: Targets) -> None:
    """Runs after the fuzzing: every documented operation that takes input
    (parameters or a body) was called at least EXAMPLES times, and every
    other one (nothing to vary: /healthz, /metrics, /openapi.json) at least
    once, so no operation was skipped or cut short."""
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            calls = sum(targets.statuses.get(f"{method.upper()} {path}", {}).values())
            takes_input = bool(operation.get("parameters") or operation.get("requestBody"))
            assert calls >= (EXAMPLES if takes_input else 1), (method, path, calls)


def test_fuzzing_left_the_targets_serving(targets: Targets) -> None:
    """After the fuzzing (runs after it in this module), both endpoints still
    answer a plain request: nothing the fuzzer sent broke a replica."""
    chat = targets.chat.post(
        "/openai/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    image = targets.image.post("/v1/images/generations", {"prompt": "x", "size": "64x64"})
    assert (chat.status_code, image.status_code) == (200, 200), (chat.text, image.text)
    assert all(s < 500 for by_status in targets.statuses.values() for s in by_status)
