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
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from inferd.catalog.registered import ProfilePoint
from inferd.control.records import example_path


@dataclass(frozen=True)
class BenchPlan:
    concurrencies: tuple[int, ...] = (1, 4, 16)
    requests: int = 32  # per concurrency level
    prompt_tokens: int = 256
    output_tokens: int = 64
    image_size: str = ""  # "" : the model's default
    image_steps: int | None = None
    timeout_s: float = 300.0


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


async def _chat_once(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], model: str, plan: BenchPlan
) -> Sample:
    body = {
        "model": model,
        # About one token per word for a byte-level BPE tokenizer.
        "messages": [{"role": "user", "content": " ".join(["hello"] * plan.prompt_tokens)}],
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
            raise BenchError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
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
        raise BenchError(f"HTTP {resp.status_code}: {resp.text[:300]}")
    return Sample(elapsed, elapsed, len(resp.json().get("data") or []))


async def run_level(
    record: dict[str, Any], token: str, concurrency: int, plan: BenchPlan
) -> ProfilePoint:
    """`plan.requests` requests at `concurrency` against the endpoint `record`."""
    kind = "image" if example_path("image") in record["exampleCommand"] else "chat"
    url = record["url"] + example_path(kind)
    headers = {"Authorization": f"Bearer {token}"}
    once = _image_once if kind == "image" else _chat_once
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
    point = image_point if kind == "image" else chat_point
    return point(concurrency, samples, wall)


def run_bench(record: dict[str, Any], token: str, plan: BenchPlan) -> list[ProfilePoint]:
    return [asyncio.run(run_level(record, token, c, plan)) for c in plan.concurrencies]


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
