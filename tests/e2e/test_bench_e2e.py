"""A registered model served for real and measured: register the tiny-chat
directory through a live `inferd serve`, create an endpoint from it (its
replica loads the registered directory with vLLM), run `inferd bench` against
it, and see the recommendation use the measured profile."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd.cli import main
from inferd.testing import ServeHandle
from tests.support import needs

# The profile recorded is vLLM's: a replica that fell back to transformers
# would measure another engine under the same name.
pytestmark = [needs("vllm"), pytest.mark.slow]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeHandle]:
    handle = ServeHandle(
        tmp_path_factory.mktemp("serve"),
        settings={"reconcile_period_seconds": "0.2", "replica_args": "--cpu-kv-cache-gib 1"},
    ).start()
    try:
        yield handle
    finally:
        handle.cleanup()
        assert handle.launched_pids() == []


def test_bench_a_registered_model_and_recommend_from_the_measurement(
    serve: ServeHandle, tiny_chat_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = ["--api-url", serve.url, "--admin-key", str(serve.admin_key)]
    assert main(["models", "add", "--source", str(tiny_chat_dir), "--name", "my-tiny", *api]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    # Registered models are listed with the catalog's, and recommended from.
    assert main(["models", "list", *api]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("my-tiny"))
    assert "registered (global)" in row
    assert main(["recommend", "my-tiny", "--server", "--location", "local", *api]) == 0
    assert "Recommended: local 1 x cpu" in capsys.readouterr().out

    created = serve.create_endpoint(name="bench-me", modelName="my-tiny", minReplicas=1)
    record = serve.wait_record(created["id"], lambda r: r["status"] == "running", timeout=600)
    assert record["modelName"] == "my-tiny"
    assert [r["engine"] for r in record["replicas"]] == ["vllm"]

    # The model cannot go while the endpoint uses it.
    assert main(["models", "delete", "my-tiny", *api]) == 1
    assert "model_in_use" in capsys.readouterr().err

    status = main([
        "bench", "bench-me", "--token", created["accessToken"], "--concurrency", "1,2",
        "--requests", "4", "--prompt-tokens", "64", "--output-tokens", "8", "--json", *api,
    ])  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    profile = json.loads(out)
    # Each level reported as it starts and ends, on stderr (stdout is the JSON).
    progress = [
        (line.split(":")[0], "starts" if line.endswith("...") else "ends")
        for line in err.splitlines()
        if line.startswith("concurrency ")
    ]
    assert progress == [
        ("concurrency 1", "starts"), ("concurrency 1", "ends"),
        ("concurrency 2", "starts"), ("concurrency 2", "ends"),
    ]  # fmt: skip
    assert profile["promptTokens"] == 64
    assert (profile["gpuType"], profile["gpuCount"]) == ("cpu", 1)
    assert [p["concurrency"] for p in profile["points"]] == [1, 2]
    for point in profile["points"]:
        assert point["requests"] == 4
        assert point["outputTokensPerS"] > 0
        assert 0 < point["ttftP95S"] < 60 and 0 < point["tpotP95S"] < 10

    assert main([
        "recommend", "my-tiny", "--server", "--location", "local", "--requests-per-second",
        "0.1", "--prompt-tokens", "64", "--output-tokens", "8", "--json", *api,
    ]) == 0  # fmt: skip
    rec = json.loads(capsys.readouterr().out)
    (option,) = rec["options"]
    assert option["basis"].startswith("measured on 1 x cpu, ")
    assert option["batch"] in (1, 2) and option["replicas"] >= 1
