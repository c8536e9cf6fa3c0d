"""Reading a model's own files: config.json / model_index.json from a
directory and from a Hugging Face cache laid out as huggingface_hub lays it
out, and what is derived from them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from inferd.catalog import load_catalog
from inferd.catalog.inspect import InspectError, count_parameters, inspect_chat, quantization_of
from inferd.catalog.registered import RegisteredModel, default_name, describe
from inferd.catalog.sources import (
    ModelSource,
    parse_source,
    read_directory,
    read_model_files,
    safetensors_parameters,
)
from inferd.catalog.support import EngineSupport

SUPPORT = EngineSupport.fixed(
    {"LlamaForCausalLM", "Qwen2ForCausalLM"}, {"StableDiffusionXLPipeline"}
)
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

# Qwen2.5-7B-Instruct's config.json (the fields that matter).
QWEN_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def test_parameter_count_matches_every_catalog_chat_model() -> None:
    for spec in load_catalog().models:
        if spec.kind != "chat":
            continue
        a = spec.chat
        config = {
            "model_type": a.family,
            "hidden_size": a.hidden_size,
            "num_hidden_layers": a.layers,
            "num_attention_heads": a.attention_heads,
            "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim,
            "vocab_size": a.vocab_size,
            "intermediate_size": a.intermediate_size,
            "tie_word_embeddings": a.tie_word_embeddings,
        }
        assert count_parameters(config) == a.parameters, spec.name


@pytest.mark.parametrize(
    ("quant", "method", "bits"),
    [
        (None, None, None),
        ({"quant_method": "awq", "bits": 4, "group_size": 128}, "awq", 4.16),
        ({"quant_method": "gptq", "bits": 8}, "gptq", 8.0),
        ({"quant_method": "fp8"}, "fp8", 8.0),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes", 4.16),
    ],
)
def test_quantization_sets_bytes_per_parameter(
    quant: dict[str, Any] | None, method: str | None, bits: float | None
) -> None:
    config = {**QWEN_7B, **({"quantization_config": quant} if quant else {})}
    q = quantization_of(config)
    assert (q.method if q else None) == method
    arch = inspect_chat(config, {"chat_template": TEMPLATE}).architecture
    assert arch.parameters == 7_615_616_512
    if bits is None:
        assert arch.weight_bytes == arch.parameters * 2
    else:
        assert q is not None and q.bits == pytest.approx(bits)
        embeddings = 2 * 152064 * 3584
        expected = (arch.parameters - embeddings) * bits / 8 + embeddings * 2
        assert arch.weight_bytes == pytest.approx(expected)
        assert arch.weight_bytes < arch.parameters * 2


def test_derived_architecture_and_hints() -> None:
    tool_template = "{% if tools %}<tool_call>{% endif %}<think></think>" + TEMPLATE
    qwen3 = {**QWEN_7B, "model_type": "qwen3", "head_dim": 128}
    chat = inspect_chat(qwen3, {"chat_template": tool_template})
    a = chat.architecture
    assert (a.layers, a.kv_heads, a.head_dim, a.context_length, a.dtype) == (
        28, 4, 128, 32768, "bf16",
    )  # fmt: skip
    assert chat.hints.chat_template == "tokenizer_config.json"
    assert chat.hints.tool_call_parser == "hermes"
    assert chat.hints.reasoning_parser == "qwen3"
    plain = inspect_chat(QWEN_7B, None, TEMPLATE)
    assert plain.hints.chat_template == "chat_template.jinja"
    assert plain.hints.tool_call_parser is None and plain.hints.reasoning_parser is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({k: v for k, v in QWEN_7B.items() if k != "architectures"}, "architectures"),
        ({**QWEN_7B, "num_key_value_heads": 5}, "not a multiple"),
        ({**QWEN_7B, "torch_dtype": "int3"}, "dtype"),
        ({k: v for k, v in QWEN_7B.items() if k != "vocab_size"}, "vocab_size"),
    ],
)
def test_bad_configs_say_why(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InspectError, match=message):
        inspect_chat(config)


def _write_checkpoint(root: Path, config: dict[str, Any], template: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    if template:
        (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return root


def _hub_cache(cache: Path, repo_id: str, files: dict[str, str], revision: str = "main") -> str:
    """A Hugging Face cache entry as huggingface_hub writes one."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / revision).write_text(commit)
    for name, text in files.items():
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_text(text)
    return commit


def test_directory_source_registers_a_chat_model(tmp_path: Path) -> None:
    root = _write_checkpoint(tmp_path / "My_Model", QWEN_7B)
    source = parse_source(str(root))
    files = read_model_files(source)
    model = describe(files, source, default_name(source), SUPPORT, project_id=None, created_at="t")
    assert model.name == "my_model"
    assert model.spec.source == str(root.resolve())
    assert model.spec.chat.parameters == 7_615_616_512
    assert RegisteredModel.from_dict(model.to_dict()) == model


def test_hugging_face_cache_source_at_a_revision(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    commit = _hub_cache(
        cache,
        "Qwen/Qwen2.5-7B-Instruct",
        {"config.json": json.dumps(QWEN_7B),
         "tokenizer_config.json": json.dumps({"chat_template": TEMPLATE})},
        revision="v1",
    )  # fmt: skip
    source = parse_source("Qwen/Qwen2.5-7B-Instruct", "v1")
    files = read_model_files(source, hf_cache_dir=cache, offline=True)
    assert files.commit == commit
    model = describe(files, source, default_name(source), SUPPORT, project_id="p1", created_at="t")
    assert model.name == "qwen2.5-7b-instruct"
    assert model.spec.source == "Qwen/Qwen2.5-7B-Instruct@v1"
    assert model.project_id == "p1"
    # The main branch is not in this cache: offline, that is a clear error.
    with pytest.raises(
        InspectError, match="is in the local Hugging Face cache, and it cannot be fetched"
    ):
        read_model_files(parse_source("Qwen/Qwen2.5-7B-Instruct"), hf_cache_dir=cache, offline=True)


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header = json.dumps(
        {n: {"dtype": "F16", "shape": s, "data_offsets": [0, 0]} for n, s in shapes.items()}
    ).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_pipeline_directory_counts_components_from_safetensors_headers(tmp_path: Path) -> None:
    root = tmp_path / "pipe"
    root.mkdir()
    (root / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    _safetensors(root / "unet" / "diffusion_pytorch_model.safetensors", {"a": [10, 10], "b": [5]})
    _safetensors(root / "vae" / "diffusion_pytorch_model.safetensors", {"c": [3, 3]})
    assert safetensors_parameters(root / "unet" / "diffusion_pytorch_model.safetensors") == 105
    source = parse_source(str(root))
    model = describe(read_directory(root), source, "pipe", SUPPORT, project_id=None, created_at="t")
    assert model.spec.kind == "image"
    assert model.spec.image.parameters == 114
    assert dict(model.spec.image.components) == {"unet": 105, "vae": 9}
    assert RegisteredModel.from_dict(model.to_dict()) == model


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: _write_checkpoint(d, {**QWEN_7B, "architectures": ["BertModel"]}),
         "not in vLLM's model registry"),
        (lambda d: _write_checkpoint(d, QWEN_7B, template=False), "no chat template"),
        (lambda d: d.mkdir() or d, "neither a diffusers pipeline"),
    ],
)  # fmt: skip
def test_unsupported_models_are_refused_with_the_reason(
    tmp_path: Path, make: Any, message: str
) -> None:
    root = make(tmp_path / "m")
    source = parse_source(str(root))
    with pytest.raises(InspectError, match=message):
        describe(read_model_files(source), source, "m", SUPPORT, project_id=None, created_at="t")


@pytest.mark.parametrize(
    ("text", "revision", "message"),
    [
        ("", None, "empty"),
        ("not a repo id!", None, "neither"),
        ("/no/such/dir", None, "does not exist"),
        ("Qwen/Qwen2.5-7B-Instruct", "bad rev;", "revision"),
    ],
)
def test_bad_sources(text: str, revision: str | None, message: str) -> None:
    with pytest.raises(InspectError, match=message):
        parse_source(text, revision)


def test_engine_support_without_the_library_says_so() -> None:
    support = EngineSupport.fixed(None, None)
    with pytest.raises(InspectError, match="vLLM is not installed"):
        support.check_chat("LlamaForCausalLM")
    with pytest.raises(InspectError, match="diffusers is not installed"):
        support.check_image("StableDiffusionXLPipeline")
    assert ModelSource(repo_id="a/b").reference == "a/b"
