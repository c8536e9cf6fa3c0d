"""inferd's embeddings, score and rerank held against vLLM's own server.

Both serve tiny-embed (a BERT embedder, BGE's architecture) with the same
engine arguments. Each variant goes to vLLM's server, to an inferd replica
and through inferd's gateway: accepted by all or refused by all (a 4xx),
and where accepted, the same numbers (the same weights through the same
serving code)."""

from __future__ import annotations

import base64
import inspect
import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.engines.base import EngineOptions
from inferd.testing import ReplicaHandle, free_port
from tests.e2e.test_vllm_compat import Variant, running_reference, v
from tests.integration.test_gateway import OTHER_EP, GatewayServer, auth
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow]

# Any endpoint id the test gateway holds a token for; its kind is embedding here.
EMBED_EP = OTHER_EP
LONG = "word " * 600  # past tiny-embed's 512-token context

EMBEDDING_VARIANTS = [
    v("string", ("input", "model")),
    v("list", ("input",), input=["Hello", "World", "again"]),
    v("token ids", ("input",), input=[5, 6, 7]),
    v("base64", ("encoding_format",), encoding_format="base64"),
    v("float", ("encoding_format",), encoding_format="float"),
    v("user", user="u1"),
    v("truncate_prompt_tokens", truncate_prompt_tokens=3),
    # Bad input, or what the model cannot do: both refuse.
    v("dimensions (not a Matryoshka model)", ("dimensions",), dimensions=8),
    v("longer than the context", ("input",), input=LONG),
    v("unknown model", ("model",), model="nope"),
    v("no input", ("input",), input=None),
]

SCORE_VARIANTS = [
    v("one to many", text_1="query", text_2=["a document", "another one"]),
    v("pairs", text_1=["q1", "q2"], text_2=["d1", "d2"]),
    v("queries and items", queries="query", items=["x", "y"]),
    v("longer than the context", text_1="q", text_2=[LONG]),
]

RERANK_VARIANTS = [
    v("rerank", query="query", documents=["first", "second", "third"]),
    v("top_n", query="query", documents=["first", "second", "third"], top_n=2),
    v("return_documents", query="q", documents=["a", "b"], return_documents=True),
    v("no documents", query="q", documents=[]),
]


def embedding_body(variant: Variant) -> dict[str, Any]:
    body = {"model": "tiny-embed", "input": "Hello there", **variant.body}
    return {k: value for k, value in body.items() if value is not None}


def vectors(answer: dict[str, Any]) -> list[list[float]]:
    """The embeddings of an answer, base64 (little-endian float32) decoded."""
    out = []
    for item in answer["data"]:
        data = item["embedding"]
        if isinstance(data, str):
            raw = base64.b64decode(data)
            data = list(struct.unpack(f"<{len(raw) // 4}f", raw))
        out.append(data)
    return out


def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url, json=body, headers=headers or {}, timeout=120)


@pytest.fixture(scope="module")
def reference(tiny_embed_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from inferd.engines.vllm_pooling import pooling_engine_args

    args = pooling_engine_args(
        tiny_embed_dir, "tiny-embed", EngineOptions(engine="vllm", device="cpu")
    )
    yield from running_reference(args, free_port(), tmp_path_factory.mktemp("vllm-pooling"))


@pytest.fixture(scope="module")
def gateway(pooling_replica: ReplicaHandle) -> Iterator[GatewayServer]:
    from inferd.gateway.directory import EndpointRoute, RoutableReplica
    from inferd.gateway.settings import GatewaySettings
    from inferd.gateway.static import StaticDirectory

    directory = StaticDirectory()
    directory.add_endpoint(
        EndpointRoute(EMBED_EP, "embedding", "tiny-embed"),
        [RoutableReplica("r-1", pooling_replica.url)],
    )
    server = GatewayServer(directory, GatewaySettings())
    try:
        yield server
    finally:
        server.stop()


def three_ways(
    reference: str,
    replica: ReplicaHandle,
    gateway: GatewayServer,
    path: str,
    body: dict[str, Any],
    ours_path: str | None = None,
) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
    ours_path = ours_path or path
    ref = post(f"{reference}{path}", body)
    ours = post(f"{replica.url}{ours_path}", body)
    via = post(f"{gateway.url(EMBED_EP)}{ours_path}", body, auth(EMBED_EP))
    assert ref.status_code < 500 and ours.status_code < 500, (ref.text, ours.text)
    assert (ours.status_code == 200) == (ref.status_code == 200), (ref.text, ours.text)
    assert via.status_code == ours.status_code, (via.text, ours.text)
    if ours.status_code != 200:
        error = ours.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return ref, ours, via


def test_the_embeddings_table_covers_every_field_the_openai_client_sends() -> None:
    from openai.resources.embeddings import Embeddings

    sent = set(inspect.signature(Embeddings.create).parameters) - {
        "self",
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
    }
    covered = {name for variant in EMBEDDING_VARIANTS for name in variant.covers}
    assert sent - covered == set(), f"not covered: {sorted(sent - covered)}"


@pytest.mark.parametrize("variant", EMBEDDING_VARIANTS, ids=lambda variant: variant.name)
def test_embeddings_alike(
    variant: Variant, reference: str, pooling_replica: ReplicaHandle, gateway: GatewayServer
) -> None:
    from openai.types import CreateEmbeddingResponse

    ref, ours, via = three_ways(
        reference,
        pooling_replica,
        gateway,
        "/v1/embeddings",
        embedding_body(variant),
        "/openai/v1/embeddings",
    )
    if ours.status_code != 200:
        if variant.name == "longer than the context":
            assert "512" in ours.json()["error"]["message"]  # the limit, named
        return
    answer = ours.json()
    CreateEmbeddingResponse.model_validate(
        answer if variant.body.get("encoding_format") != "base64" else {**answer, "data": []}
    )
    assert answer["usage"]["prompt_tokens"] == ref.json()["usage"]["prompt_tokens"] > 0
    for mine, theirs in zip(vectors(answer), vectors(ref.json()), strict=True):
        assert mine == pytest.approx(theirs, abs=1e-5)
    assert vectors(via.json()) == vectors(answer)


def test_an_empty_input_list_is_refused(pooling_replica: ReplicaHandle) -> None:
    answer = post(
        f"{pooling_replica.url}/openai/v1/embeddings", {"model": "tiny-embed", "input": []}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "input"


@pytest.mark.parametrize("variant", SCORE_VARIANTS, ids=lambda variant: variant.name)
def test_score_alike(
    variant: Variant, reference: str, pooling_replica: ReplicaHandle, gateway: GatewayServer
) -> None:
    body = {"model": "tiny-embed", **variant.body}
    ref, ours, _ = three_ways(reference, pooling_replica, gateway, "/score", body)
    if ours.status_code == 200:
        mine = [item["score"] for item in ours.json()["data"]]
        assert mine == pytest.approx([item["score"] for item in ref.json()["data"]], abs=1e-5)


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
@pytest.mark.parametrize("variant", RERANK_VARIANTS, ids=lambda variant: variant.name)
def test_rerank_alike(
    variant: Variant,
    path: str,
    reference: str,
    pooling_replica: ReplicaHandle,
    gateway: GatewayServer,
) -> None:
    body = {"model": "tiny-embed", **variant.body}
    ref, ours, _ = three_ways(reference, pooling_replica, gateway, path, body)
    if ours.status_code == 200:
        ranked = [(r["index"], round(r["relevance_score"], 5)) for r in ours.json()["results"]]
        expected = [(r["index"], round(r["relevance_score"], 5)) for r in ref.json()["results"]]
        assert ranked == expected
        assert json.dumps(sorted(ours.json())) == json.dumps(sorted(ref.json()))


def test_chat_is_refused_on_an_embedding_endpoint_saying_what_it_serves(
    pooling_replica: ReplicaHandle, gateway: GatewayServer
) -> None:
    body = {"model": "tiny-embed", "messages": [{"role": "user", "content": "hi"}]}
    for url, headers in (
        (pooling_replica.url, {}),
        (gateway.url(EMBED_EP), auth(EMBED_EP)),
    ):
        answer = post(f"{url}/openai/v1/chat/completions", body, headers)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "unsupported_route"
        assert "serves the embedding model 'tiny-embed': embeddings at" in error["message"]
