"""Image generation: the OpenAI images protocol translated to `ImageEngine` calls."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid

from starlette.requests import Request
from starlette.responses import Response

from inferd.api.openai import ImageGenerationRequest
from inferd.engines.base import ImageEngine, ImageRequest
from inferd.http import read_model
from inferd.replica.answering import Answering
from inferd.replica.chat import ServedModel, _unless_disconnected
from inferd.replica.metrics import ReplicaMetrics
from inferd.replica.state import ReplicaState

ROUTE = "images"
# Below this, base64 inline is cheaper than a hop to a thread.
_INLINE_B64_BYTES = 256 * 1024


def to_image_request(body: ImageGenerationRequest, default_size: tuple[int, int]) -> ImageRequest:
    width, height = body.dimensions(default_size)
    return ImageRequest(
        request_id=f"img-{uuid.uuid4().hex}",
        prompt=body.prompt,
        n=body.n,
        width=width,
        height=height,
        negative_prompt=body.negative_prompt,
        num_inference_steps=body.num_inference_steps,
        guidance_scale=body.guidance_scale,
        seed=body.seed,
    )


async def _b64(png: bytes) -> bytes:
    if len(png) < _INLINE_B64_BYTES:
        return base64.b64encode(png)
    return await asyncio.to_thread(base64.b64encode, png)


def images_body(created: int, b64_pngs: list[bytes]) -> bytes:
    """The OpenAI images response as JSON bytes, written out directly: base64
    text needs no escaping, and `json.dumps` of megabytes of it costs tens of
    milliseconds per 1024x1024 image."""
    items = b",".join(b'{"b64_json":"' + b64 + b'"}' for b64 in b64_pngs)
    return b'{"created":%d,"data":[%s]}' % (created, items)


class ImagesHandler:
    def __init__(
        self,
        engine: ImageEngine,
        state: ReplicaState,
        metrics: ReplicaMetrics,
        model: ServedModel,
        max_body_bytes: int,
    ) -> None:
        self.engine = engine
        self.state = state
        self.metrics = metrics
        self.model = model
        self.max_body_bytes = max_body_bytes

    async def handle(self, request: Request) -> Response:
        with Answering(self.state, self.metrics, ROUTE, request) as answer:
            body = await read_model(request, ImageGenerationRequest, self.max_body_bytes)
            self.model.check(body.model)
            image_request = to_image_request(body, self.engine.info.default_size)
            pngs = await _unless_disconnected(request, self.engine.generate(image_request))
            if pngs is None:
                answer.status = 499
                return Response(status_code=499)
            self.metrics.images.inc(len(pngs))
            data = [await _b64(png) for png in pngs]
            answer.status = 200
            return Response(images_body(int(time.time()), data), media_type="application/json")
