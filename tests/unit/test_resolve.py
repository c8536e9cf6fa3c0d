"""Model references: catalog names, built-in tiny models, local directories,
and Hugging Face ids on a machine with no network.

tiny-chat is really built (once per session, shared with every other test
through conftest's `tiny_chat_dir`).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from inferd.catalog import (
    ChatArchitecture,
    ModelCatalog,
    ModelSpec,
    ModelUnavailable,
    load_catalog,
    resolve_model,
)


@pytest.fixture(scope="module")
def models() -> ModelCatalog:
    return load_catalog().models


def _safetensors_parameters(path: Path) -> int:
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(math.prod(t["shape"]) for key, t in header.items() if key != "__metadata__")


def test_catalog_name_builds_the_builtin_model(models: ModelCatalog, tiny_chat_dir: Path) -> None:
    resolved = resolve_model("tiny-chat", models, cache_dir=tiny_chat_dir.parent)
    assert resolved.path == tiny_chat_dir
    assert (resolved.name, resolved.kind) == ("tiny-chat", "chat")
    assert resolved.spec is models.get("tiny-chat")
    assert (resolved.path / "config.json").is_file()
    # The catalog's facts are those of the model the builder writes.
    config = json.loads((resolved.path / "config.json").read_text())
    arch = resolved.spec.chat
    assert config["vocab_size"] == arch.vocab_size
    assert config["num_key_value_heads"] == arch.kv_heads
    assert _safetensors_parameters(resolved.path / "model.safetensors") == arch.parameters


def test_tiny_sdxl_entry_matches_the_built_pipeline(
    models: ModelCatalog, tiny_sdxl_dir: Path
) -> None:
    resolved = resolve_model("tiny-sdxl", models, cache_dir=tiny_sdxl_dir.parent)
    assert (resolved.path, resolved.kind) == (tiny_sdxl_dir, "image")
    assert resolved.spec is not None
    folders = {
        "unet": "unet",
        "textEncoder": "text_encoder",
        "textEncoder2": "text_encoder_2",
        "vae": "vae",
    }
    for component, count in resolved.spec.image.components.items():
        files = sorted((resolved.path / folders[component]).glob("*.safetensors"))
        assert files, component
        assert sum(_safetensors_parameters(f) for f in files) == count, component
    served = json.loads((resolved.path / "inferd.json").read_text())
    assert tuple(served["default_size"]) == resolved.spec.default_size
    assert served["default_steps"] == resolved.spec.default_steps


def test_builtin_reference_finds_its_catalog_entry(
    models: ModelCatalog, tiny_chat_dir: Path
) -> None:
    resolved = resolve_model("builtin:tiny-chat", models, cache_dir=tiny_chat_dir.parent)
    assert resolved.path == tiny_chat_dir
    assert resolved.spec is not None and resolved.spec.name == "tiny-chat"


def test_local_directory(models: ModelCatalog, tiny_chat_dir: Path, tmp_path: Path) -> None:
    resolved = resolve_model(str(tiny_chat_dir), models)
    assert (resolved.kind, resolved.path, resolved.spec) == ("chat", tiny_chat_dir, None)
    assert resolved.name == tiny_chat_dir.name
    pipeline = tmp_path / "my-pipeline"
    pipeline.mkdir()
    (pipeline / "model_index.json").write_text("{}")
    image = resolve_model(str(pipeline), models)
    assert (image.kind, image.name, image.spec) == ("image", "my-pipeline", None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: str(tmp / "missing"), "does not exist"),
        (lambda tmp: str(tmp), "neither a diffusers pipeline"),
    ],
)
def test_unusable_directories(
    models: ModelCatalog, tmp_path: Path, make: object, message: str
) -> None:
    with pytest.raises(ModelUnavailable, match=message):
        resolve_model(make(tmp_path), models)  # type: ignore[operator]


def test_hugging_face_id_offline_says_what_to_do(
    models: ModelCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailable) as info:
        resolve_model("inferd-test/no-such-model", models)
    message = str(info.value)
    assert "'inferd-test/no-such-model'" in message
    assert "HF_HUB_OFFLINE" in message
    assert "cannot fetch the weights" in message
    assert "pass that local directory" in message


def test_catalog_entry_with_a_hub_source_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arch = ChatArchitecture("llama", 1, 1, 1, 1, 1, 1, 1, 1, 1, "bf16", False)
    catalog = ModelCatalog([ModelSpec("hosted", "chat", "inferd-test/not-cached", "d", arch)])
    with pytest.raises(
        ModelUnavailable, match=r"Model 'hosted': .*'inferd-test/not-cached' is not in the local"
    ):
        resolve_model("hosted", catalog)


def test_hub_out_of_reach_fails_at_once_with_the_hf_command(
    models: ModelCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Hub that refuses connections (nothing listens on port 1): the answer
    # comes from the connection check, not from huggingface_hub's retries.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ModelUnavailable) as info:
        resolve_model("inferd-test/no-such-model", models)
    message = str(info.value)
    assert "the Hugging Face Hub cannot be reached (cannot connect to 127.0.0.1:1" in message
    assert "hf download inferd-test/no-such-model --local-dir DIR" in message
    assert "huggingface-cli" not in message


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("builtin:huge-chat", "no built-in model 'huge-chat'; built-in: tiny-chat, tiny-sdxl"),
        ("not a model!", "not a catalog model, a built-in model"),
    ],
)
def test_references_that_name_nothing(models: ModelCatalog, ref: str, message: str) -> None:
    with pytest.raises(ModelUnavailable, match=message):
        resolve_model(ref, models)
