"""`inferd bench ENDPOINT`: a bounded load against a live endpoint at a few
concurrencies, recorded as the model's measured profile on that GPU type
and count (`POST /inference/models/{model}/profiles`).

At each concurrency C, C clients send requests back to back until
`requests` have completed (so the load is bounded in requests, not time).
Chat requests stream, with `ignore_eos` and `max_tokens` so every answer
has the stated length: TTFT is the time to the first content chunk, TPOT
the rest of the answer's time over its remaining tokens. Image requests
time the whole call. Throughput is completed output over the level's wall
time. Percentiles are nearest-rank over the level's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from inferd.catalog.registered import ProfilePoint
from inferd.control.endpoints.records import example_path
from inferd.vocab import ModelKind


@dataclass(frozen=True)
class BenchPlan:
    concurrencies: tuple[int, ...] = (1, 4, 16)
    requests: int = 32  # per concurrency level
    prompt_tokens: int = 256
    output_tokens: int = 64
    image_size: str = ""  # "" : the model's default
    image_steps: int | None = None
    timeout_s: float = 300.0
    # Words of the prompt text; None: `prompt_tokens` (found by `calibrate`,
    # since how many tokens a word is depends on the model's tokenizer).
    prompt_words: int | None = None


@dataclass(frozen=True)
class Sample:
    ttft_s: float
    total_s: float
    output_tokens: int

    @property
    def tpot_s(self) -> float:
        return (self.total_s - self.ttft_s) / max(1, self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def chat_point(concurrency: int, samples: Sequence[Sample], wall_s: float) -> ProfilePoint:
    tokens = sum(s.output_tokens for s in samples)
    return ProfilePoint(
        concurrency=concurrency,
        requests=len(samples),
        output_tokens_per_s=tokens / wall_s,
        ttft_p95_s=percentile([s.ttft_s for s in samples], 95),
        tpot_p95_s=percentile([s.tpot_s for s in samples], 95),
    )


def image_point(concurrency: int, samples: Sequence[Sample], wall_s: float) -> ProfilePoint:
    images = sum(s.output_tokens for s in samples)
    return ProfilePoint(
        concurrency=concurrency,
        requests=len(samples),
        images_per_s=images / wall_s,
        seconds_per_image_p95=percentile([s.total_s for s in samples], 95),
    )


class BenchError(RuntimeError):
    """A benchmark request failed; the message has the endpoint's answer."""


def _answer(status: int, body: bytes) -> str:
    """An error answer as text: the JSON error body as JSON, anything else
    decoded, cut to a readable length."""
    text = body.decode("utf-8", "replace")
    with contextlib.suppress(ValueError):
        text = json.dumps(json.loads(text))
    return f"HTTP {status}: {text[:1000]}"


def _prompt(words: int) -> str:
    return " ".join(["hello"] * max(1, words))


async def _prompt_tokens_of(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, words: int
) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(words)}],
        "max_tokens": 1,
    }
    resp = await http.post(url, json=body, headers=headers)
    if resp.status_code != 200:
        raise BenchError(_answer(resp.status_code, resp.content))
    return int(resp.json()["usage"]["prompt_tokens"])


async def calibrate(record: dict[str, Any], token: str, plan: BenchPlan) -> BenchPlan:
    """The plan with `prompt_words` set so that the prompt is `prompt_tokens`
    long in the endpoint's own tokenizer (two short probes: the tokens per
    word, and the chat template's own tokens)."""
    url = record["url"] + example_path("chat")
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=plan.timeout_s) as http:
        model = record["modelName"]
        short = await _prompt_tokens_of(http, url, headers, model, 16)
        long = await _prompt_tokens_of(http, url, headers, model, 64)
    per_word = max(1e-3, (long - short) / 48)
    overhead = short - 16 * per_word
    words = math.floor((plan.prompt_tokens - overhead) / per_word)
    if words < 1:
        raise BenchError(
            f"--prompt-tokens {plan.prompt_tokens} is shorter than the chat template alone "
            f"({overhead:.0f} tokens)"
        )
    return replace(plan, prompt_words=words)


async def _chat_once(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, plan: BenchPlan
) -> Sample:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(plan.prompt_words or plan.prompt_tokens)}],
        "max_tokens": plan.output_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    async with http.stream("POST", url, json=body, headers=headers) as resp:
        if resp.status_code != 200:
            raise BenchError(_answer(resp.status_code, await resp.aread()))
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage_tokens = int(event["usage"].get("completion_tokens") or 0)
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter()
    end = time.perf_counter()
    if first is None:
        raise BenchError("the stream carried no content")
    return Sample(first - start, end - start, usage_tokens or chunks)


async def _image_once(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, plan: BenchPlan
) -> Sample:
    body: dict[str, Any] = {"model": model, "prompt": "a lighthouse at dusk", "n": 1}
    if plan.image_size:
        body["size"] = plan.image_size
    start = time.perf_counter()
    resp = await http.post(url, json=body, headers=headers)
    elapsed = time.perf_counter() - start
    if resp.status_code != 200:
        raise BenchError(_answer(resp.status_code, resp.content))
    return Sample(elapsed, elapsed, len(resp.json().get("data") or []))


async def run_level(
    record: dict[str, Any], token: str, concurrency: int, plan: BenchPlan
) -> ProfilePoint:
    """`plan.requests` requests at `concurrency` against the endpoint `record`."""
    kind = "image" if is_image_endpoint(record) else "chat"
    url = record["url"] + example_path(kind)
    headers = {"Authorization": f"Bearer {token}"}
    once = _image_once if kind == ModelKind.IMAGE else _chat_once
    samples: list[Sample] = []
    remaining = plan.requests
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits) as http:

        async def client() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                samples.append(await once(http, url, headers, record["modelName"], plan))

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - start
    point = image_point if kind == ModelKind.IMAGE else chat_point
    return point(concurrency, samples, wall)


def is_image_endpoint(record: dict[str, Any]) -> bool:
    return example_path("image") in record["exampleCommand"]


def run_bench(
    record: dict[str, Any],
    token: str,
    plan: BenchPlan,
    on_level: Callable[[int, ProfilePoint | None], None] = lambda c, p: None,
) -> list[ProfilePoint]:
    """Every level in turn; `on_level(c, None)` as level c starts and
    `on_level(c, point)` when it is done (the CLI's progress)."""
    if not is_image_endpoint(record) and plan.prompt_words is None:
        plan = asyncio.run(calibrate(record, token, plan))
    points = []
    for concurrency in plan.concurrencies:
        on_level(concurrency, None)
        point = asyncio.run(run_level(record, token, concurrency, plan))
        on_level(concurrency, point)
        points.append(point)
    return points


def profile_body(
    record: dict[str, Any], plan: BenchPlan, points: Sequence[ProfilePoint]
) -> dict[str, Any]:
    """The body of `POST /inference/models/{model}/profiles`."""
    image = any(p.images_per_s for p in points)
    return {
        "gpuType": record["gpuType"],
        "gpuCount": record["gpuCount"],
        "promptTokens": 0 if image else plan.prompt_tokens,
        "outputTokens": (plan.image_steps or 1) if image else plan.output_tokens,
        "imageSize": plan.image_size,
        "endpoint": record["name"],
        "points": [p.to_dict() for p in points],
    }
