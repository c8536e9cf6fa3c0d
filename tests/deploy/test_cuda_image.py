"""The CUDA image (Dockerfile.cuda), built from this tree by
scripts/build_image.sh, on a machine with no GPU: its pip install pulls the
CUDA wheels (torch, vLLM, the nvidia-* runtime libraries), which need no GPU
to install, and its control plane must start without one, say so in its
banner, and serve an endpoint whose replicas run the fake engine (a real
engine needs the GPU this machine lacks).

Cost: the first build downloads and unpacks several GB of CUDA wheels (see
docs/kubernetes.md for the measured time and size); a rebuild after a code
change reuses the dependency layer. Like the CPU image's test, it needs
buildah, which CI does not require (`OPTIONAL_IN_CI` in tests/support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from inferd import __version__
from inferd.engines.fake import WORDS
from inferd.testing import free_port
from tests.deploy.image_support import Container, ImageServer, build
from tests.support import needs

pytestmark = [needs("buildah"), pytest.mark.slow, pytest.mark.timeout(7200)]

TAG = "localhost/inferd:cuda-test"
ADMIN_KEY = "infd_admin_image_test_0123456789abcdef"


@pytest.fixture(scope="module")
def container(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Container]:
    log = tmp_path_factory.mktemp("build") / "build.log"
    output = build("cuda", TAG, log, timeout=7000)
    assert "MiB  in all" in output, output[-3000:]
    print(output[output.rfind("built ") :])
    made = Container(TAG)
    try:
        yield made
    finally:
        made.remove()


@pytest.fixture(scope="module")
def server(container: Container, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ImageServer]:
    env = {"INFERD_ADMIN_KEY": ADMIN_KEY, "INFERD_REPLICA_ARGS": "--engine fake"}
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    running = ImageServer(container, free_port(), log, env)
    try:
        running.wait_healthy()
        yield running
    finally:
        running.stop()


def test_the_cuda_image_holds_the_cuda_builds_and_runs_as_a_user(container: Container) -> None:
    done = container.run("inferd", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"inferd {__version__}"
    assert container.run("id", "-u").stdout.strip() == "10001"
    # torch and vLLM are the CUDA builds, importable without a GPU.
    script = "import torch, vllm; print(torch.version.cuda, torch.cuda.is_available())"
    probe = container.run("python", "-c", script, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    cuda, available = probe.stdout.split()[-2:]
    assert cuda != "None" and available == "False", probe.stdout


def test_the_control_plane_starts_without_a_gpu_and_serves_the_fake_engine(
    server: ImageServer,
) -> None:
    assert httpx.get(f"{server.url}/healthz", timeout=10).json()["status"] == "ok"
    # The banner of a machine without a GPU.
    assert "no GPUs" in server.log(), server.log()
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=300
    ) as api:
        created = api.post(
            "/inference/endpoints",
            json={"name": "chat", "modelName": "tiny-chat", "minReplicas": 0, "maxReplicas": 1},
        )
        assert created.status_code == 201, created.text
        endpoint = created.json()
        answer = httpx.post(
            f"{endpoint['url']}/openai/v1/chat/completions",
            headers={"Authorization": f"Bearer {endpoint['accessToken']}"},
            json={"model": "tiny-chat", "messages": [{"role": "user", "content": "Hi"}],
                  "max_tokens": 6},
            timeout=300,
        )  # fmt: skip
        assert answer.status_code == 200, f"{answer.text}\n{server.log()}"
        body = answer.json()
        assert body["usage"]["completion_tokens"] == 6
        # The fake engine's words: the replica ran, and ran the fake engine.
        words = body["choices"][0]["message"]["content"].split()
        assert words and set(words) <= set(WORDS), words
        assert api.delete(f"/inference/endpoints/{endpoint['id']}").status_code == 204
