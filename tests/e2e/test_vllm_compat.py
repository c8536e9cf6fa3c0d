"""inferd held against vLLM's own OpenAI server.

Both serve tiny-chat with the same engine arguments and the same parser flags
(`--enable-auto-tool-choice --tool-call-parser hermes`). A table of request
variants covers every chat-completions field the official `openai` client can
send, plus the vLLM extensions inferd accepts. Each variant goes to vLLM's
server, to an inferd replica and through inferd's gateway: each must be
accepted by all or refused by all (a 4xx), except where `DIFFERENCES` says
why inferd deliberately differs; every accepted answer, streamed or not, must
validate against the `openai` client's response types."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from inferd.engines.base import EngineOptions
from inferd.testing import WEATHER_TOOL, ReplicaHandle, free_port
from tests.integration.test_gateway import CHAT_EP, GatewayServer, auth
from tests.support import needs

pytestmark = [needs("vllm"), pytest.mark.slow]

HELLO: list[dict[str, Any]] = [{"role": "user", "content": "Hello"}]
TOOLS: list[dict[str, Any]] = [WEATHER_TOOL]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
HISTORY: list[dict[str, Any]] = [
    *HELLO,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
]


@dataclass(frozen=True)
class Variant:
    name: str
    body: dict[str, Any]
    # The openai client's parameters (or vLLM extensions) this variant sends.
    covers: tuple[str, ...] = ()
    messages: list[dict[str, Any]] = field(default_factory=lambda: HELLO)


def v(name: str, covers: tuple[str, ...] = (), **body: Any) -> Variant:
    messages = body.pop("messages", HELLO)
    return Variant(name, body, covers or tuple(body), messages)


VARIANTS = [
    v("plain", ("messages", "model", "max_tokens")),
    v("stream", stream=True),
    v("stream usage", stream=True, stream_options={"include_usage": True}),
    v("max_completion_tokens", max_completion_tokens=3),
    v("sampling", temperature=0.5, top_p=0.9),
    v("penalties", frequency_penalty=0.5, presence_penalty=0.5),
    v("n", n=2),
    v("n streamed", n=2, stream=True),
    v("stop string", stop="\n"),
    v("stop list", stop=["a", "b"]),
    v("seed", seed=7),
    v("logit_bias", logit_bias={"10": 5}),
    v("json_object", response_format={"type": "json_object"}),
    v(
        "json_schema",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
    ),
    v("logprobs", logprobs=True, top_logprobs=2),
    v(
        "logprobs streamed",
        ("logprobs", "top_logprobs"),
        logprobs=True,
        top_logprobs=1,
        stream=True,
    ),
    v("top_logprobs over the limit", ("top_logprobs",), logprobs=True, top_logprobs=21),
    v("top_logprobs without logprobs", ("top_logprobs",), top_logprobs=2),
    v("tools auto", ("tools",), tools=TOOLS),
    v("tools none", tools=TOOLS, tool_choice="none"),
    v("tools required", ("tools", "tool_choice"), tools=TOOLS, tool_choice="required"),
    v("tools named", ("tools", "tool_choice"), tools=TOOLS, tool_choice=NAMED),
    v(
        "tools named streamed",
        ("tools", "tool_choice"),
        tools=TOOLS,
        tool_choice=NAMED,
        stream=True,
    ),
    v("parallel_tool_calls", tools=TOOLS, tool_choice="required", parallel_tool_calls=False),
    v("tool_choice without tools", ("tool_choice",), tool_choice="required"),
    v(
        "named tool not offered",
        ("tool_choice",),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "nope"}},
    ),
    v("tool turns", ("messages", "tools"), tools=TOOLS, messages=HISTORY),
    v(
        "developer and parts",
        ("messages",),
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ],
    ),
    v("user and metadata", user="u1", metadata={"k": "v"}, store=False),
    v("service_tier", service_tier="auto"),
    v("reasoning_effort", reasoning_effort="low"),
    v("modalities", modalities=["text"]),
    v("verbosity", verbosity="low"),
    v("prompt_cache_key", prompt_cache_key="k", safety_identifier="s"),
    v("prediction", prediction={"type": "content", "content": "Hello"}),
    v("web_search_options", web_search_options={}),
    v("audio", audio={"voice": "alloy", "format": "wav"}),
    v("moderation", moderation={"categories": []}),
    v("prompt_cache_options", prompt_cache_options={}, prompt_cache_retention="in-memory"),
    v(
        "functions (deprecated)",
        functions=[{"name": "f", "parameters": {"type": "object"}}],
        function_call="auto",
    ),
    # vLLM's extensions that inferd accepts under the same names.
    v("ignore_eos and min_tokens", ignore_eos=True, min_tokens=2),
    v("stop_token_ids", stop_token_ids=[5]),
    v("structured_outputs", structured_outputs={"regex": "[a-z]+"}),
    v("request_id", request_id="compat-1"),
    # Bad input: both refuse.
    v("temperature below 0", ("temperature",), temperature=-1),
    v("no messages", ("messages",), messages=[]),
    v("max_tokens 0", ("max_tokens",), max_tokens=0),
    v("max_tokens past the context", ("max_tokens",), max_tokens=100_000),
    v("temperature above 2", ("temperature",), temperature=2.5),
    # inferd's own bound (see DIFFERENCES).
    v("n above 8", ("n",), n=9),
]

# Where inferd accepts or refuses differently on purpose, and why. (Answers
# differ in one more way: a reasoning model's message carries its reasoning
# as `reasoning_content`, the name DeepSeek's API and most clients read, as
# well as under vLLM's current name `reasoning`.)
DIFFERENCES: dict[str, str] = {
    "n above 8": "inferd caps n at 8 (MAX_CHAT_N): each choice is one more engine request "
    "behind a single HTTP request, a cheap way to multiply a client's load; vLLM has no cap",
}


def body_of(variant: Variant) -> dict[str, Any]:
    return {"model": "tiny-chat", "messages": variant.messages, "max_tokens": 4, **variant.body}


def outcome(url: str, variant: Variant, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, the parsed answer): a completion, the stream's chunks, or the error body."""
    body = body_of(variant)
    response = httpx.post(url, json=body, headers=headers or {}, timeout=120)
    if response.status_code != 200:
        return response.status_code, response.text
    if not body.get("stream"):
        return 200, ChatCompletion.model_validate(response.json())
    chunks = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            data = json.loads(line[len("data: ") :])
            assert "error" not in data, data
            chunks.append(ChatCompletionChunk.model_validate(data))
    assert response.text.rstrip().endswith("data: [DONE]")
    return 200, chunks


def start_reference(
    args: dict[str, Any], port: int, log: Path, extra: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """vLLM's own server with these engine arguments (inferd's, for the model)."""
    flags = []
    for key, value in args.items():
        if key == "model" or value is False or value is None:
            continue
        flags += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(args["model"]), "--host", "127.0.0.1", "--port", str(port),
        *extra, *flags,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def running_reference(
    args: dict[str, Any], port: int, tmp: Path, extra: tuple[str, ...] = ()
) -> Iterator[str]:
    """vLLM's server, started, waited for and stopped: yields its base URL."""
    log = tmp / "server.log"
    process = start_reference(args, port, log, extra)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "vLLM's server did not start"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.fixture(scope="module")
def reference(tiny_chat_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's server for tiny-chat, with inferd's engine arguments and the
    catalog entry's parser flags; yields its chat completions URL."""
    from inferd.engines.vllm import engine_args_for

    args = engine_args_for(tiny_chat_dir, "tiny-chat", EngineOptions(engine="vllm", device="cpu"))
    parsers = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    tmp = tmp_path_factory.mktemp("vllm-reference")
    for url in running_reference(args, free_port(), tmp, parsers):
        yield f"{url}/v1/chat/completions"


@pytest.fixture(scope="module")
def gateway(vllm_replica: ReplicaHandle) -> Iterator[GatewayServer]:
    from inferd.gateway.directory import EndpointRoute, RoutableReplica
    from inferd.gateway.settings import GatewaySettings
    from inferd.gateway.static import StaticDirectory

    directory = StaticDirectory()
    directory.add_endpoint(
        EndpointRoute(CHAT_EP, "chat", "tiny-chat"), [RoutableReplica("r-1", vllm_replica.url)]
    )
    server = GatewayServer(directory, GatewaySettings())
    try:
        yield server
    finally:
        server.stop()


def test_the_table_covers_every_field_the_openai_client_sends() -> None:
    from openai.resources.chat.completions import Completions

    sent = set(inspect.signature(Completions.create).parameters) - {
        "self",
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
    }
    covered = {name for variant in VARIANTS for name in variant.covers}
    assert sent - covered == set(), f"not covered: {sorted(sent - covered)}"
    assert openai.__version__


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.name)
def test_accepted_or_refused_alike(
    variant: Variant, reference: str, vllm_replica: ReplicaHandle, gateway: GatewayServer
) -> None:
    ref_status, ref_answer = outcome(reference, variant)
    ours_status, ours_answer = outcome(f"{vllm_replica.url}/openai/v1/chat/completions", variant)
    via_status, _ = outcome(f"{gateway.url()}/openai/v1/chat/completions", variant, auth())
    accepted = {
        "vllm": ref_status == 200,
        "replica": ours_status == 200,
        "gateway": via_status == 200,
    }
    assert ref_status < 500 and ours_status < 500 and via_status < 500, (ref_answer, ours_answer)
    if variant.name in DIFFERENCES:
        assert accepted["replica"] != accepted["vllm"], DIFFERENCES[variant.name]
    else:
        assert accepted["replica"] == accepted["vllm"], (ref_answer, ours_answer)
    assert accepted["gateway"] == accepted["replica"]
    if ours_status != 200:
        error = json.loads(ours_answer)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]


# -- completions -------------------------------------------------------------------------

# Every field of the openai client's `completions.create`, and vLLM's
# extensions. Greedy variants (temperature 0) must give the very same text
# as vLLM's server: both run vLLM's serving code on the same weights.
COMPLETION_VARIANTS = [
    v("plain", ("prompt", "model", "max_tokens"), temperature=0),
    v("stream", ("stream",), stream=True),
    v("stream usage", ("stream_options",), stream=True, stream_options={"include_usage": True},
      ignore_eos=True),
    v("echo", temperature=0, echo=True),
    v("logprobs", temperature=0, logprobs=2),
    v("echo and logprobs", ("echo", "logprobs"), temperature=0, echo=True, logprobs=1),
    v("logprobs streamed", ("logprobs",), logprobs=1, stream=True),
    v("stop string", ("stop",), stop="\n"),
    v("stop list", ("stop",), stop=["a", "b"]),
    v("n", n=2),
    v("n streamed", ("n",), n=2, stream=True),
    v("best_of", best_of=1),
    v("prompt list", ("prompt",), prompt=["Hello", "World"], temperature=0),
    v("prompt token ids", ("prompt",), prompt=[1, 2, 3], temperature=0),
    v("sampling", ("temperature", "top_p", "seed"), temperature=0.5, top_p=0.9, seed=3),
    v("penalties", ("frequency_penalty", "presence_penalty"), frequency_penalty=0.5,
      presence_penalty=0.5),
    v("logit_bias", logit_bias={"10": 5}),
    v("user", user="u1"),
    v("ignore_eos and min_tokens", ignore_eos=True, min_tokens=2),
    # Bad input or what the model cannot do: both refuse.
    v("suffix", suffix="!"),
    v("logprobs over the limit", ("logprobs",), logprobs=50),
    v("max_tokens past the context", ("max_tokens",), max_tokens=100_000),
    v("temperature below 0", ("temperature",), temperature=-1),
    v("empty prompt list", ("prompt",), prompt=[]),
    v("unknown model", ("model",), model="nope"),
]  # fmt: skip


def completion_body(variant: Variant) -> dict[str, Any]:
    return {"model": "tiny-chat", "prompt": "Hello", "max_tokens": 4, **variant.body}


def completion_outcome(
    url: str, variant: Variant, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    from openai.types import Completion, CompletionUsage

    body = completion_body(variant)
    response = httpx.post(url, json=body, headers=headers or {}, timeout=120)
    if response.status_code != 200:
        return response.status_code, response.text
    if not body.get("stream"):
        return 200, Completion.model_validate(with_echoed_logprobs_filled(response.json()))
    chunks = []
    for line in response.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            data = json.loads(line[len("data: ") :])
            assert "error" not in data, data
            # The openai client builds stream chunks unvalidated (a chunk's
            # finish_reason is null until the last); the shape is checked here.
            for item in data["choices"]:
                assert isinstance(item["index"], int) and isinstance(item["text"], str), item
            if data.get("usage"):
                CompletionUsage.model_validate(data["usage"])
            chunks.append(Completion.model_construct(**data))
    assert response.text.rstrip().endswith("data: [DONE]")
    return 200, chunks


def with_echoed_logprobs_filled(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer, with the null logprob of an echoed prompt's first token
    (it has no context to be predicted from: OpenAI's API answers null too,
    but the openai client's type says a number) set to 0 for validation."""
    for item in answer.get("choices", ()):
        logprobs = item.get("logprobs")
        if logprobs and logprobs.get("token_logprobs"):
            logprobs["token_logprobs"] = [lp or 0.0 for lp in logprobs["token_logprobs"]]
            logprobs["top_logprobs"] = [top or {} for top in logprobs["top_logprobs"]]
    return answer


def test_the_completions_table_covers_every_field_the_openai_client_sends() -> None:
    from openai.resources.completions import Completions

    sent = set(inspect.signature(Completions.create).parameters) - {
        "self",
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
    }
    covered = {name for variant in COMPLETION_VARIANTS for name in variant.covers}
    assert sent - covered == set(), f"not covered: {sorted(sent - covered)}"


@pytest.mark.parametrize("variant", COMPLETION_VARIANTS, ids=lambda variant: variant.name)
def test_completions_accepted_or_refused_alike(
    variant: Variant, reference: str, vllm_replica: ReplicaHandle, gateway: GatewayServer
) -> None:
    base = reference.removesuffix("/chat/completions")
    ref_status, ref_answer = completion_outcome(f"{base}/completions", variant)
    ours_status, ours_answer = completion_outcome(
        f"{vllm_replica.url}/openai/v1/completions", variant
    )
    via_status, via_answer = completion_outcome(
        f"{gateway.url()}/openai/v1/completions", variant, auth()
    )
    assert ref_status < 500 and ours_status < 500 and via_status < 500, (ref_answer, ours_answer)
    assert (ours_status == 200) == (ref_status == 200), (ref_answer, ours_answer)
    assert via_status == ours_status, (via_answer, ours_answer)
    if ours_status != 200:
        error = json.loads(ours_answer)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        return
    if variant.body.get("temperature") == 0:
        # Greedy: the same weights through the same serving code, the same text.
        assert [c.text for c in ours_answer.choices] == [c.text for c in ref_answer.choices]
        assert [c.text for c in via_answer.choices] == [c.text for c in ref_answer.choices]
    if variant.name == "stream":
        # Usage is counted for every stream, but relayed only when asked for.
        assert all(not chunk.usage for chunk in ours_answer)
    if variant.name == "stream usage":
        assert ours_answer[-1].usage is not None and ours_answer[-1].usage.completion_tokens == 4
