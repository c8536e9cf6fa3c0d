"""A real replica process serving tiny-sdxl through diffusers, called with
the official `openai` client (only a prompt) and raw HTTP."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from inferd.testing import ReplicaHandle
from tests.support import needs

pytestmark = [needs("diffusers"), pytest.mark.slow]


def decode_png(b64: str) -> tuple[int, int]:
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(b64)))
    assert image.format == "PNG"
    image.load()
    return image.size


def test_openai_client_generates_png_with_only_a_prompt(diffusers_replica: ReplicaHandle) -> None:
    client = openai.OpenAI(base_url=f"{diffusers_replica.url}/v1", api_key="unused", max_retries=0)
    result = client.images.generate(prompt="a lighthouse at dusk")
    assert len(result.data) == 1
    assert result.data[0].b64_json is not None
    assert decode_png(result.data[0].b64_json) == (1024, 1024)


def test_n_and_size(diffusers_replica: ReplicaHandle) -> None:
    response = httpx.post(
        f"{diffusers_replica.url}/v1/images/generations",
        json={"prompt": "two cats", "n": 2, "size": "512x256"},
        timeout=120,
    )
    assert response.status_code == 200
    assert [decode_png(d["b64_json"]) for d in response.json()["data"]] == [(512, 256)] * 2


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "x", "size": "1000x1000"}, "size"),
        ({"prompt": "x", "size": "16x16"}, "size"),
        ({"prompt": "x", "n": 100}, "n"),
        ({"n": 1}, "prompt"),
    ],
)
def test_limits_are_400_and_the_replica_keeps_serving(
    diffusers_replica: ReplicaHandle, body: dict[str, object], param: str
) -> None:
    url = f"{diffusers_replica.url}/v1/images/generations"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    ok = httpx.post(url, json={"prompt": "ok", "size": "256x256"}, timeout=120)
    assert ok.status_code == 200


def test_concurrent_requests_all_succeed(diffusers_replica: ReplicaHandle) -> None:
    url = f"{diffusers_replica.url}/v1/images/generations"

    def call(i: int) -> int:
        body = {"prompt": f"image {i}", "size": "256x256", "seed": i}
        return httpx.post(url, json=body, timeout=300).status_code

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, range(8))) == [200] * 8
