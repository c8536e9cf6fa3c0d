"""The whole path with real processes and the real engines on the tiny models:
`inferd serve` -> endpoints -> replicas (vLLM, diffusers) -> gateway -> the
official `openai` client; scale to zero and back without losing a request;
tokens scoped to their endpoint; delete leaves no process behind."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import pytest

from inferd.testing import ServeHandle
from tests.support import needs

T = TypeVar("T")

pytestmark = [needs("vllm", "diffusers"), pytest.mark.slow]

# Long enough that a busy machine does not scale the endpoint down between
# two steps of the test that expect it running.
RETENTION_S = 10


SETTINGS = {
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.2",
    "autoscale_upscale_delay_seconds": "1",
    "autoscale_downscale_delay_seconds": "2",
    "replica_drain_timeout_seconds": "20",
    "replica_args": "--cpu-kv-cache-gib 1",
    # vLLM's start on a busy 2-core machine can pass the default 180 s; a
    # held request must outlast it here.
    "gateway_hold_timeout_seconds": "600",
}


def _serving(handle: ServeHandle) -> Iterator[ServeHandle]:
    handle.start()
    try:
        yield handle
    finally:
        handle.cleanup()
        assert handle.launched_pids() == []


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    """`inferd serve` on its embedded default store (SQLite)."""
    yield from _serving(ServeHandle(tmp_path_factory.mktemp("serve"), settings=SETTINGS))


@pytest.fixture(params=["sqlite", "postgres"])
def any_store_serve(request: pytest.FixtureRequest) -> Iterator[ServeHandle]:
    """`inferd serve` on each store: the SQLite one is the shared `serve`;
    the PostgreSQL one gets a fresh database on the session's server."""
    if request.param == "sqlite":
        yield request.getfixturevalue("serve")
        return
    server = request.getfixturevalue("postgres_server")
    settings = {**SETTINGS, "database_url": server.create_database()}
    tmp = request.getfixturevalue("tmp_path")
    yield from _serving(ServeHandle(tmp, settings=settings))


def chat_client(record: dict[str, Any], token: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{record['url']}/openai/v1", api_key=token, max_retries=0, timeout=300
    )


def held_while_waking(serve: ServeHandle, endpoint_id: str, call: Callable[[], T]) -> T:
    """`call()` (a request to an endpoint at zero replicas) answers; while it
    was held, the endpoint's record said `initializing`, with the progress of
    the replica on its way (`starting` or `loading`, since when)."""
    progress: list[dict[str, Any]] = []
    watcher = threading.Thread(
        target=lambda: progress.append(
            serve.wait_record(endpoint_id, lambda r: r["status"] == "initializing", timeout=60)
        )
    )
    watcher.start()
    result = call()
    watcher.join()
    (held_view,) = progress
    (coming,) = held_view["replicas"]
    assert coming["status"] in ("starting", "loading") and coming["since"]
    return result


def test_chat_endpoint_lifecycle(any_store_serve: ServeHandle) -> None:
    serve = any_store_serve
    created = serve.create_endpoint(
        name="chat",
        modelName="tiny-chat",
        minReplicas=0,
        maxReplicas=2,
        scaleToZeroRetentionPeriodSeconds=RETENTION_S,
    )
    endpoint_id, token = created["id"], created["accessToken"]
    assert created["status"] == "scaledToZero" and created["currentReplicas"] == 0

    # First request: held while a replica starts from zero, then answered.
    client = chat_client(created, token)
    completion = held_while_waking(
        serve,
        endpoint_id,
        lambda: client.chat.completions.create(
            model="tiny-chat",
            messages=[{"role": "user", "content": "Hello!"}],
            max_tokens=8,
            extra_body={"ignore_eos": True},
        ),
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    assert isinstance(completion.choices[0].message.content, str)

    stream = client.chat.completions.create(
        model="tiny-chat",
        messages=[{"role": "user", "content": "Stream, please."}],
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # Completions, through the same gateway path (vLLM's own serving code).
    text = client.completions.create(
        model="tiny-chat",
        prompt="Once upon",
        max_tokens=5,
        echo=True,
        logprobs=2,
        extra_body={"ignore_eos": True},
    )
    assert text.usage is not None and text.usage.completion_tokens == 5
    assert text.choices[0].text.startswith("Once upon")
    assert text.choices[0].logprobs is not None and text.choices[0].logprobs.top_logprobs
    pieces = list(
        client.completions.create(
            model="tiny-chat",
            prompt=["a", "b"],
            max_tokens=3,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert {c.choices[0].index for c in pieces if c.choices} == {0, 1, 2, 3}
    assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 12

    # The agents' APIs through the endpoint URL, each with its own client:
    # OpenAI's Responses API and Anthropic's Messages API (vLLM's serving code).
    response = client.responses.create(
        model="tiny-chat", input="Hello!", max_output_tokens=4, temperature=0
    )
    assert response.usage is not None and response.usage.output_tokens > 0
    kinds = [
        event.type
        for event in client.responses.create(
            model="tiny-chat", input="Stream, please.", max_output_tokens=4, stream=True
        )
    ]
    assert kinds[0] == "response.created", kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    messages = anthropic.Anthropic(
        base_url=created["url"], api_key=token, max_retries=0, timeout=300
    )
    hello = [{"role": "user", "content": "Hello!"}]
    message = messages.messages.create(model="tiny-chat", max_tokens=4, messages=hello)  # type: ignore[arg-type]
    assert message.type == "message" and message.usage.output_tokens > 0
    with messages.messages.stream(model="tiny-chat", max_tokens=4, messages=hello) as streamed:  # type: ignore[arg-type]
        assert isinstance("".join(streamed.text_stream), str)
        assert streamed.get_final_message().usage.output_tokens > 0

    # The record matches what runs.
    record = serve.record(endpoint_id)
    assert record["status"] == "running"
    assert record["currentReplicas"] == 1
    assert [(r["gpus"], r["status"]) for r in record["replicas"]] == [(1, "ready")]
    assert (record["gpuType"], record["gpuCount"], record["locationName"]) == ("cpu", 1, "local")
    assert record["hourlyPrice"] == 0.0
    assert len(serve.replica_pids()) == 1
    # Every process of the replica carries the launcher's mark: its own, and
    # vLLM's engine core and worker, so "no process left" below means all.
    assert len(serve.launched_pids()) >= 3

    # Idle past the retention period: to zero, and the process is gone.
    record = serve.wait_record(
        endpoint_id, lambda r: r["status"] == "scaledToZero", timeout=RETENTION_S + 60
    )
    assert record["currentReplicas"] == 0 and record["replicas"] == []
    deadline = time.monotonic() + 30
    while serve.launched_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert serve.launched_pids() == []

    # The next request wakes it and is answered, not lost: held meanwhile.
    again = held_while_waking(
        serve,
        endpoint_id,
        lambda: client.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "Again"}], max_tokens=3
        ),
    )
    assert again.choices[0].message.content is not None

    # A re-issued token works; the old one is refused at once.
    with serve.api() as api:
        new_token = api.post(f"/inference/endpoints/{endpoint_id}/access-token").json()[
            "accessToken"
        ]
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
    fresh = chat_client(created, new_token).chat.completions.create(
        model="tiny-chat", messages=[{"role": "user", "content": "x"}], max_tokens=1
    )
    assert fresh.choices[0].finish_reason in ("length", "stop")

    # This endpoint's token opens no other endpoint.
    other = serve.create_endpoint(name="other", modelName="tiny-chat", minReplicas=0)
    with pytest.raises(openai.AuthenticationError):
        chat_client(other, new_token).chat.completions.create(
            model="tiny-chat", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )

    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{endpoint_id}").status_code == 204
        assert api.delete(f"/inference/endpoints/{other['id']}").status_code == 204
    # Delete returns once the replica is gone: vLLM's engine core and worker too.
    assert serve.launched_pids() == []


def test_embedding_endpoint_answers_the_openai_embeddings_client(serve: ServeHandle) -> None:
    created = serve.create_endpoint(name="embed", modelName="tiny-embed", minReplicas=0)
    assert created["exampleCommand"].count("/openai/v1/embeddings") == 1
    client = chat_client(created, created["accessToken"])
    # The client asks for base64 and decodes it; held while the replica starts.
    answer = client.embeddings.create(model="tiny-embed", input=["Hello", "the sea"])
    assert [len(item.embedding) for item in answer.data] == [64, 64]
    assert answer.usage.prompt_tokens > 0
    floats = client.embeddings.create(
        model="tiny-embed", input="Hello", encoding_format="float"
    ).data[0]
    assert floats.embedding == pytest.approx(answer.data[0].embedding, abs=1e-5)
    # Scores of pairs, through the same endpoint (vLLM's bi-encoder score).
    with httpx.Client(headers={"Authorization": f"Bearer {created['accessToken']}"}) as http:
        ranked = http.post(
            f"{created['url']}/v1/rerank",
            json={"model": "tiny-embed", "query": "sea", "documents": ["the sea", "bread"]},
            timeout=60,
        )
        assert ranked.status_code == 200, ranked.text
        assert sorted(r["index"] for r in ranked.json()["results"]) == [0, 1]
    # What the endpoint does not serve is a 400 saying what it serves.
    with pytest.raises(openai.BadRequestError, match="embeddings at /openai/v1/embeddings"):
        client.chat.completions.create(
            model="tiny-embed", messages=[{"role": "user", "content": "x"}], max_tokens=1
        )
    with pytest.raises(openai.BadRequestError, match="512"):
        client.embeddings.create(model="tiny-embed", input="word " * 600)
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.embeddings.create(model="tiny-embed", input=[])
    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{created['id']}").status_code == 204


def test_engine_settings_reach_vllm(serve: ServeHandle) -> None:
    """An endpoint's engine settings start its replica's vLLM engine with
    them: its context is the 128 tokens they set (the model's own is 2048),
    so a 300-token prompt the model could take is refused by the engine; and
    it decodes with a draft model (tiny-chat drafting for itself, resolved
    and built on the replica's side like the model)."""
    draft = {"draftModel": "tiny-chat", "numSpeculativeTokens": 2}
    settings = {"maxModelLen": 128, "maxNumSeqs": 2, "speculativeDecoding": draft}
    created = serve.create_endpoint(
        name="short", modelName="tiny-chat", minReplicas=0, maxReplicas=1,
        scaleToZeroRetentionPeriodSeconds=RETENTION_S, engineSettings=settings,
    )  # fmt: skip
    assert created["engineSettings"] == settings
    client = chat_client(created, created["accessToken"])
    hello = [{"role": "user", "content": "Hello!"}]
    # Held while the replica starts, then answered.
    reply = client.chat.completions.create(model="tiny-chat", messages=hello, max_tokens=4)
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    long = [{"role": "user", "content": "word " * 300}]
    with pytest.raises(openai.BadRequestError, match="context is 128 tokens"):
        client.chat.completions.create(model="tiny-chat", messages=long, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="context of 128 tokens"):
        client.chat.completions.create(model="tiny-chat", messages=hello, max_tokens=200)
    (card,) = client.models.list().data
    assert card.model_dump()["max_model_len"] == 128
    # vLLM's own account of the engine it started (its warnings reach the
    # replica's log): it decodes with the draft.
    (replica,) = serve.record(created["id"])["replicas"]
    log = serve.state_dir / "state" / "logs" / f"replica-{replica['id']}.log"
    text = log.read_text(errors="replace")
    assert "based on the speculative decoding settings" in text
    assert "won't work with speculative decoding" in text
    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{created['id']}").status_code == 204


def test_image_endpoint_answers_the_openai_images_client(serve: ServeHandle) -> None:
    from PIL import Image

    created = serve.create_endpoint(
        name="images", modelName="tiny-sdxl", minReplicas=0, maxReplicas=1
    )
    token = created["accessToken"]
    # Base URL `{url}/v1` (the spec's path) ...
    client = openai.OpenAI(
        base_url=f"{created['url']}/v1", api_key=token, max_retries=0, timeout=300
    )
    result = client.images.generate(prompt="a lighthouse at dusk")
    assert result.data is not None and result.data[0].b64_json is not None
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert image.format == "PNG" and image.size == (1024, 1024)
    # ... and the endpoint URL itself as base URL.
    plain = openai.OpenAI(base_url=created["url"], api_key=token, max_retries=0, timeout=300)
    assert plain.images.generate(prompt="a fox", size="256x256").data
    with serve.api() as api:
        assert api.delete(f"/inference/endpoints/{created['id']}").status_code == 204
    assert serve.launched_pids() == []


def test_stopping_serve_stops_its_replicas(tmp_path: Path) -> None:
    handle = ServeHandle(
        tmp_path, settings={"replica_args": "--engine fake", "health_period_seconds": "0.5"}
    ).start()
    try:
        created = handle.create_endpoint(name="warm", modelName="tiny-chat", minReplicas=2)
        handle.wait_record(created["id"], lambda r: r["status"] == "running", timeout=60)
        assert len(handle.replica_pids()) == 2
        assert handle.stop() == 0
        assert handle.launched_pids() == []
    finally:
        handle.cleanup()
