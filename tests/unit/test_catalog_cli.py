"""`inferd recommend`, `inferd models list|build` and models/build_tiny.py, in-process."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from inferd.cli import main
from inferd.paths import PROJECT_ROOT


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_recommend_table(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["recommend", "llama-3.1-70b-instruct", "--location", "us-east"], capsys)
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("llama-3.1-70b-instruct in us-east: ")
    header = next(line for line in lines if line.startswith("option"))
    columns = ["option", "fits", "hourly price", "memory needed", "est. speed", "cost", "error"]
    assert [c.strip() for c in header.split("  ") if c.strip()] == columns
    # First row: the recommended option, fitting, priced in the file's currency.
    first = lines[lines.index(header) + 1]
    assert first.split()[:5] == ["us-east", "2", "x", "H200", "yes"]
    assert "7.58 USD/h" in first and "tokens/s" in first and "USD /1M tokens" in first
    assert first.split()[-1].startswith("±") and first.split()[-1].endswith("%")
    assert "rests on: ±" in out
    assert "Recommended: us-east 2 x H200" in out
    rejected = out[out.index("\nRejected:\n") :]
    assert "us-east 1 x H100-80GB: needs 166.9 GB" in rejected


def test_recommend_image_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["recommend", "sdxl-base-1.0", "--location", "us-east", "--json"], capsys)
    assert status == 0
    data = json.loads(out)
    assert data["currency"] == "USD" and data["location"] == "us-east"
    assert all(o["fits"] and o["estSecondsPerImage"] > 0 for o in data["options"])
    assert {o["gpuType"] for o in data["rejected"]} >= {"L4", "A10G"}


def test_recommend_an_embedding_load(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["recommend", "bge-base-en-v1.5", "--location", "us-east"]
    status, out, _ = run([*base, "--requests-per-second", "50", "--prompt-tokens", "256",
                          "--json"], capsys)  # fmt: skip
    assert status == 0
    sized = json.loads(out)
    assert sized["workload"]["inputTokensPerS"] == 50 * 256
    prices = [o["totalHourlyPrice"] for o in sized["options"]]
    assert prices == sorted(prices) and all(o["replicas"] >= 1 for o in sized["options"])
    status, _, err = run([*base, "--requests-per-second", "5", "--prompt-tokens", "8",
                          "--output-tokens", "9"], capsys)  # fmt: skip
    assert status != 0 and "decodes nothing" in err


def test_recommend_image_table_shows_seconds_per_image(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(["recommend", "sdxl-turbo", "--gpu-type", "L4"], capsys)
    assert status == 0
    assert "s/image" in out and "USD /image" in out and "in every location" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["recommend", "gpt-5"], "unknown model 'gpt-5'"),
        (["recommend", "tiny-chat", "--location", "mars"], "unknown location 'mars'"),
        (["recommend", "tiny-chat", "--concurrency", "0"], "concurrency"),
        (["models", "build", "llama-3.1-8b-instruct"], "only the built-in tiny models"),
    ],
)
def test_errors_go_to_stderr(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(argv, capsys)
    assert status == 2 and out == ""
    assert err.startswith("inferd: ") and message in err


def test_models_list(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INFERD_API_KEY", "INFERD_ADMIN_KEY"):
        monkeypatch.delenv(name, raising=False)
    status, out, _ = run(["models", "list"], capsys)
    # Without a key the server's registered models cannot be listed: said so.
    assert status == 0 and "include the models registered on the server" in out
    status, out, _ = run(["models", "list", "--catalog"], capsys)
    assert status == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["llama-3.1-70b-instruct"][1:4] == ["chat", "70.6B", "bf16"]
    assert rows["tiny-sdxl"][-1] == "builtin:tiny-sdxl"
    status, out, _ = run(["models", "list", "--json"], capsys)
    names = [m["name"] for m in json.loads(out)]
    assert {"sdxl-base-1.0", "sdxl-turbo", "tiny-chat", "qwen2.5-0.5b-instruct"} <= set(names)


def test_models_build_and_the_script(
    tiny_chat_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Built already this session: both return the cached directory at once.
    cache = str(tiny_chat_dir.parent)
    status, out, _ = run(["models", "build", "tiny-chat", "--cache-dir", cache], capsys)
    assert (status, out.strip()) == (0, str(tiny_chat_dir))
    script = PROJECT_ROOT / "models" / "build_tiny.py"
    monkeypatch.setattr(sys, "argv", [str(script), "builtin:tiny-chat", "--cache-dir", cache])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == str(tiny_chat_dir)


def test_recommend_sizes_with_engine_settings(capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--location", "us-east", "--gpu-type", "H200", "--gpu-count", "1"]
    status, out, _ = run(["recommend", "llama-3.1-70b-instruct", *where], capsys)
    assert status == 0 and "0 option(s) fit" in out
    status, out, _ = run(["recommend", "llama-3.1-70b-instruct", *where, "--quantization", "fp8",
                          "--kv-cache-dtype", "fp8"], capsys)  # fmt: skip
    assert status == 0 and "weights 72.7 GB + KV cache 10.7 GB" in out
    status, _, err = run(["recommend", "tiny-chat", "--max-num-seqs", "0"], capsys)
    assert status != 0 and "maxNumSeqs" in err
