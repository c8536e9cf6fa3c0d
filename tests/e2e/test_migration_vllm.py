"""Stream migration with the real engine: the vLLM replica serving a greedy
stream is SIGKILLed mid-answer, the gateway continues the stream on the
shared tiny-chat replica by replaying the token ids already streamed: one
stream, no error, the fault-free text in full (the random model's token
sequences do not survive decode and re-encode, so a continuation from the
text would differ past the kill), and the usage of the fault-free run.

Cost: one extra tiny-chat vLLM load (the replica that is killed; the
survivor is the session's shared `vllm_replica`), about 40-70 s on a 2-core
CI machine, and three 200-token generations."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.gateway.directory import EndpointRoute
from inferd.gateway.routing import Policy
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.testing import ReplicaHandle
from tests.integration.test_gateway import CHAT, CHAT_EP, GatewayServer, auth, replica_of
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow, pytest.mark.timeout(900)]

TOKENS = 200


def greedy(max_tokens: int = TOKENS) -> dict[str, Any]:
    return {
        "model": "tiny-chat",
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read(
    url: str, kill: ReplicaHandle | None = None, after: int = 0
) -> tuple[str, dict[str, Any], int]:
    """(the streamed text, the usage, the characters read when `kill` was
    SIGKILLed) of one request; `kill` is SIGKILLed once at least `after`
    chunks with some text have arrived. At least, not exactly: under load
    vLLM puts several tokens in one chunk, so a 200-token answer can come in
    fewer chunks than any fixed count, and the engine runs ahead of the
    reader: the earlier the kill, the surer it lands mid-generation."""
    parts: list[str] = []
    usage: dict[str, Any] = {}
    done = 0
    seam = 0
    killed = False
    with httpx.stream("POST", url, json=greedy(), headers=auth(), timeout=300) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done += 1
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            for choice in chunk.get("choices") or ():
                parts.append(choice["delta"].get("content") or "")
            usage = chunk.get("usage") or usage
            if kill is not None and not killed and len(parts) >= after and any(parts):
                seam = len("".join(parts))
                kill.process.send_signal(signal.SIGKILL)
                killed = True
    assert done == 1
    return "".join(parts), usage, seam


@pytest.fixture
def doomed(tiny_chat_dir: Path) -> Iterator[ReplicaHandle]:
    handle = ReplicaHandle(
        str(tiny_chat_dir),
        [
            *("--engine", "vllm", "--device", "cpu", "--served-model-name", "tiny-chat"),
            *("--tool-call-parser", "hermes", "--no-warmup"),
        ],
    )
    try:
        yield handle.wait_ready(timeout=600)
    finally:
        handle.stop()


def test_a_greedy_stream_whose_replica_is_killed_goes_on_as_one_stream(
    vllm_replica: ReplicaHandle, doomed: ReplicaHandle, caplog: pytest.LogCaptureFixture
) -> None:
    directory = StaticDirectory()
    # The shared replica looks busy, so the stream starts on the doomed one.
    directory.add_endpoint(
        EndpointRoute(CHAT_EP, "chat", "tiny-chat"),
        [replica_of(doomed, "r-doomed"), replica_of(vllm_replica, "r-shared", 50)],
    )
    gateway = GatewayServer(directory, GatewaySettings(routing_policy=Policy.LEAST_LOADED))
    try:
        url = gateway.url() + CHAT
        faultless = GatewayServer(StaticDirectory(), GatewaySettings())
        faultless.directory.add_endpoint(
            EndpointRoute(CHAT_EP, "chat", "tiny-chat"), [replica_of(vllm_replica, "r-shared")]
        )
        try:
            reference, reference_usage, _ = read(faultless.url() + CHAT)
        finally:
            faultless.stop()
        text, usage, seam = read(url, kill=doomed, after=3)
        assert doomed.process.wait(30) == -signal.SIGKILL
        assert 0 < seam < len(text)
        assert text == reference
        # By the token ids the doomed replica named (the gateway's log says).
        assert "resumed by token_ids" in caplog.text
        assert usage == reference_usage
        assert usage["completion_tokens"] == TOKENS
        metrics = gateway.gateway.metrics.render().decode()
        series = f'{{endpoint="{CHAT_EP}",reason="connection_lost"}} 1.0'
        assert "inferd_gateway_migrations_total" + series in metrics
    finally:
        gateway.stop()
