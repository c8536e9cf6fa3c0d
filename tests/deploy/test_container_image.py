"""The CPU image (Dockerfile.cpu), built from this tree by
scripts/build_image.sh as a user would, and run: `inferd --version`,
`inferd serve` answering /healthz and the console, a tiny-chat endpoint
answering a chat through the gateway (vLLM's CPU build in the image), and a
tiny-sdxl endpoint an image. It runs the server as the image's user, with
no key baked in.

Cost, measured on the shared 2-core build machine (docs/kubernetes.md): a
first build took 52 min, a rebuild of the dependency layer 17 min; with the
layers in buildah's cache the build takes 17 s and the tests about 8 min
(vLLM's CPU engine starting in the image). That is why CI does not require
buildah (see `OPTIONAL_IN_CI` in tests/support.py)."""

from __future__ import annotations

import base64
import io
import json
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from inferd import __version__
from inferd.testing import free_port
from tests.deploy.image_support import Container, ImageServer, build
from tests.support import needs

pytestmark = [needs("buildah"), pytest.mark.slow, pytest.mark.timeout(5400)]

TAG = "localhost/inferd:cpu-test"
ADMIN_KEY = "infd_admin_image_test_0123456789abcdef"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("build") / "build.log"
    output = build("cpu", TAG, log)
    # The script ends by listing the layers with their sizes.
    assert "MiB  in all" in output, output[-3000:]
    print(output[output.rfind("built ") :])
    yield TAG


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[Container]:
    made = Container(image)
    try:
        yield made
    finally:
        made.remove()


def test_the_image_runs_inferd_as_a_user_without_secrets(container: Container) -> None:
    done = container.run("inferd", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"inferd {__version__}"
    who = container.run("id", "-u")
    assert who.stdout.strip() == "10001", who
    env = container.run("env")
    assert "INFERD_ADMIN_KEY" not in env.stdout and "TOKEN" not in env.stdout


@pytest.fixture(scope="module")
def server(container: Container, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageServer]:
    env = {
        "INFERD_ADMIN_KEY": ADMIN_KEY,
        "INFERD_REPLICA_ARGS": "--cpu-kv-cache-gib 1",
        # vLLM's start on a busy 2-core machine can pass the default hold.
        "INFERD_GATEWAY_HOLD_TIMEOUT_SECONDS": "900",
        "INFERD_REPLICA_START_TIMEOUT_SECONDS": "900",
        "HF_HUB_OFFLINE": "1",
    }
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    running = ImageServer(container, free_port(), log, env)
    try:
        running.wait_healthy()
        yield running
    finally:
        running.stop()


def _api(server: ImageServer) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=900
    )


def test_serve_in_the_image_answers_healthz_and_the_console(server: ImageServer) -> None:
    health = httpx.get(f"{server.url}/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    console = httpx.get(f"{server.url}/console/", timeout=30, follow_redirects=True)
    assert console.status_code == 200, console.text[:500]
    assert "<html" in console.text.lower()
    # The banner of a machine without a GPU.
    assert "no GPUs" in server.log(), server.log()


def test_a_tiny_chat_endpoint_answers_through_the_gateway(server: ImageServer) -> None:
    with _api(server) as api:
        created = api.post(
            "/inference/endpoints",
            json={"name": "chat", "modelName": "tiny-chat", "minReplicas": 0, "maxReplicas": 1},
        )
        assert created.status_code == 201, created.text
        endpoint = created.json()
        # Held while the replica (vLLM CPU, in the image) builds the model and loads.
        answer = httpx.post(
            f"{endpoint['url']}/openai/v1/chat/completions",
            headers={"Authorization": f"Bearer {endpoint['accessToken']}"},
            json={
                "model": "tiny-chat",
                "messages": [{"role": "user", "content": "Hello!"}],
                "max_tokens": 8,
                "ignore_eos": True,
            },
            timeout=900,
        )
        assert answer.status_code == 200, f"{answer.text}\n{server.log()}"
        body = answer.json()
        assert body["usage"]["completion_tokens"] == 8
        assert isinstance(body["choices"][0]["message"]["content"], str)
        assert api.delete(f"/inference/endpoints/{endpoint['id']}").status_code == 204


def test_a_tiny_sdxl_endpoint_draws_an_image(server: ImageServer) -> None:
    from PIL import Image

    with _api(server) as api:
        created = api.post(
            "/inference/endpoints",
            json={"name": "pictures", "modelName": "tiny-sdxl", "minReplicas": 0},
        )
        assert created.status_code == 201, created.text
        endpoint = created.json()
        answer = httpx.post(
            f"{endpoint['url']}/openai/v1/images/generations",
            headers={"Authorization": f"Bearer {endpoint['accessToken']}"},
            json={"prompt": "a lighthouse at dusk", "size": "256x256"},
            timeout=900,
        )
        assert answer.status_code == 200, f"{answer.text}\n{server.log()}"
        png = base64.b64decode(answer.json()["data"][0]["b64_json"])
        picture = Image.open(io.BytesIO(png))
        assert picture.format == "PNG" and picture.size == (256, 256)
        assert api.delete(f"/inference/endpoints/{endpoint['id']}").status_code == 204


def test_volumes_hold_the_state_and_the_caches(image: str) -> None:
    config = json.loads(
        subprocess.run(
            ["buildah", "inspect", "--type", "image", image], capture_output=True, check=True
        ).stdout
    )["OCIv1"]["config"]
    assert set(config["Volumes"]) == {
        "/var/lib/inferd", "/var/cache/inferd", "/var/cache/huggingface",
    }  # fmt: skip
    assert config["User"] == "10001"
    env = dict(item.split("=", 1) for item in config["Env"])
    assert (
        env["INFERD_STATE_DIR"] == "/var/lib/inferd" and env["HF_HOME"] == "/var/cache/huggingface"
    )
