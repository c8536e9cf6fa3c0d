"""The model catalog and the GPU/location/price tables: contents and loading."""

from __future__ import annotations

import json
from pathlib import Path
from types import MappingProxyType

import pytest

from inferd.catalog import (
    Catalog,
    CatalogError,
    ChatArchitecture,
    GpuCatalog,
    GpuType,
    Location,
    load_catalog,
)
from inferd.catalog.gpus import load_gpus
from inferd.catalog.models import load_models
from inferd.engines.base import ImageModelInfo
from inferd.paths import default_configs_dir, default_models_dir


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def decoder_parameters(arch: ChatArchitecture) -> int:
    """Parameters of a Llama/Qwen2 decoder from its config, as transformers builds it."""
    h, q, kv = arch.hidden_size, arch.attention_heads * arch.head_dim, arch.kv_heads * arch.head_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * arch.intermediate_size + 2 * h
    if arch.family == "qwen2":  # q, k and v projections carry biases
        per_layer += q + 2 * kv
    embeddings = arch.vocab_size * h * (1 if arch.tie_word_embeddings else 2)
    return embeddings + arch.layers * per_layer + h


def test_chat_models_span_half_a_billion_to_seventy(catalog: Catalog) -> None:
    chat = [m for m in catalog.models.all() if m.kind == "chat" and m.source.count("/") == 1]
    sizes = sorted(m.chat.parameters for m in chat)
    assert len(chat) >= 4
    assert sizes[0] <= 0.5e9 and sizes[-1] >= 70e9


@pytest.mark.parametrize(
    ("name", "parameters", "layers", "kv_heads", "context"),
    [
        # Published totals: 0.49B, 1.54B, 7.61B, 72.7B, 8.03B, 70.6B.
        ("qwen2.5-0.5b-instruct", 494_032_768, 24, 2, 32768),
        ("qwen2.5-1.5b-instruct", 1_543_714_304, 28, 2, 32768),
        ("qwen2.5-7b-instruct", 7_615_616_512, 28, 4, 32768),
        ("qwen2.5-72b-instruct", 72_706_203_648, 80, 8, 32768),
        ("llama-3.1-8b-instruct", 8_030_261_248, 32, 8, 131072),
        ("llama-3.1-70b-instruct", 70_553_706_496, 80, 8, 131072),
        ("tiny-chat", 471_680, 2, 1, 2048),
    ],
)
def test_chat_architectures_add_up(
    catalog: Catalog, name: str, parameters: int, layers: int, kv_heads: int, context: int
) -> None:
    arch = catalog.models.get(name).chat
    assert (arch.parameters, arch.layers, arch.kv_heads, arch.context_length) == (
        parameters,
        layers,
        kv_heads,
        context,
    )
    # The parameter count is the one the config's shapes give, to the parameter.
    assert decoder_parameters(arch) == arch.parameters


def test_tiny_chat_matches_its_builder(catalog: Catalog) -> None:
    from inferd.catalog.tiny_chat import TINY_CHAT_ARCH

    arch = catalog.models.get("tiny-chat").chat
    assert catalog.models.get("tiny-chat").source == "builtin:tiny-chat"
    assert arch.hidden_size == TINY_CHAT_ARCH["hidden_size"]
    assert arch.layers == TINY_CHAT_ARCH["num_hidden_layers"]
    assert arch.attention_heads == TINY_CHAT_ARCH["num_attention_heads"]
    assert arch.kv_heads == TINY_CHAT_ARCH["num_key_value_heads"]
    assert arch.head_dim == TINY_CHAT_ARCH["head_dim"]
    assert arch.context_length == TINY_CHAT_ARCH["max_position_embeddings"]
    assert arch.dtype == "fp32"


def test_image_models(catalog: Catalog) -> None:
    sdxl = catalog.models.get("sdxl-base-1.0")
    assert sdxl.source == "stabilityai/stable-diffusion-xl-base-1.0"
    assert (sdxl.default_size, sdxl.default_steps) == ((1024, 1024), 30)
    assert sdxl.image.components["unet"] == 2_567_463_684
    assert sum(sdxl.image.components.values()) == sdxl.image.parameters
    assert sdxl.image.guidance_evaluations == 2
    turbo = catalog.models.get("sdxl-turbo")
    assert turbo.default_steps is not None and turbo.default_steps <= 4
    assert turbo.image.guidance_evaluations == 1 and turbo.default_guidance_scale == 0.0
    # The same UNet at a quarter of the pixels: about a quarter of the FLOPs.
    ratio = turbo.image.unet_tflops_per_step / sdxl.image.unet_tflops_per_step
    assert 0.2 < ratio < 0.3
    tiny = catalog.models.get("tiny-sdxl")
    assert tiny.source == "builtin:tiny-sdxl"
    assert tiny.image_info() == ImageModelInfo(
        name="tiny-sdxl",
        default_size=(1024, 1024),
        max_n=4,
        min_side=256,
        max_side=2048,
        side_multiple=64,  # one more UNet level than SDXL keeps 1024² cheap on a CPU
        default_steps=2,
    )
    with pytest.raises(TypeError, match="chat model"):
        catalog.models.get("tiny-chat").image_info()


def test_tiny_sdxl_defaults_match_its_builder(catalog: Catalog) -> None:
    from inferd.catalog import tiny_sdxl

    spec = catalog.models.get("tiny-sdxl")
    assert spec.default_size == (tiny_sdxl.DEFAULT_SIZE, tiny_sdxl.DEFAULT_SIZE)
    assert spec.default_steps == tiny_sdxl.DEFAULT_STEPS
    assert spec.default_guidance_scale == tiny_sdxl.DEFAULT_GUIDANCE_SCALE


def test_model_to_dict_is_camel_case_json(catalog: Catalog) -> None:
    chat = json.loads(json.dumps(catalog.models.get("llama-3.1-8b-instruct").to_dict()))
    assert chat["architecture"]["kvHeads"] == 8
    assert chat["architecture"]["contextLength"] == 131072
    assert chat["parameters"] == 8_030_261_248
    assert "defaultSize" not in chat
    assert chat["toolCallParser"] == "llama3_json" and chat["reasoningParser"] is None
    image = json.loads(json.dumps(catalog.models.get("sdxl-base-1.0").to_dict()))
    assert image["defaultSize"] == "1024x1024" and image["maxN"] == 4
    assert image["architecture"]["components"]["textEncoder2"] == 694_659_840


def test_catalog_lookup(catalog: Catalog) -> None:
    assert "tiny-chat" in catalog.models and "gpt-5" not in catalog.models
    with pytest.raises(KeyError, match=r"unknown model 'gpt-5'; known models: .*tiny-chat"):
        catalog.models.get("gpt-5")
    names = [m.name for m in catalog.models.all()]
    assert names == sorted(names)
    # Frozen entries hash (their mappings are left out), so they can key caches.
    assert len(set(catalog.models.all())) == len(names)
    assert len(set(catalog.gpus.locations.values())) == len(catalog.gpus.locations)


GOOD_CHAT = {
    "name": "m",
    "kind": "chat",
    "source": "org/m",
    "description": "d",
    "architecture": {
        "family": "llama",
        "parameters": 1,
        "layers": 1,
        "hiddenSize": 1,
        "intermediateSize": 1,
        "attentionHeads": 2,
        "kvHeads": 1,
        "headDim": 1,
        "vocabSize": 1,
        "contextLength": 1,
        "dtype": "bf16",
    },
}


def _with(path: tuple[str, ...], value: object) -> dict[str, object]:
    data = json.loads(json.dumps(GOOD_CHAT))
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ((("source",), None), r"m\.yaml: missing required field 'source'"),
        ((("kind",), "audio"), r"field 'kind' is 'audio'; choose one of chat, image"),
        ((("name",), "Bad Name"), r"name 'Bad Name' must be lowercase"),
        (
            (("architecture", "layers"), "many"),
            r"m\.yaml\.architecture: field 'layers' must be int",
        ),
        ((("architecture", "layers"), -1), r"field 'layers' must not be negative"),
        ((("architecture", "dtype"), "fp64"), r"field 'dtype' is 'fp64'"),
        ((("architecture", "kvHeads"), 3), r"attentionHeads must be a multiple of kvHeads"),
    ],
)
def test_bad_entries_name_file_and_field(
    tmp_path: Path, change: tuple[tuple[str, ...], object], message: str
) -> None:
    import yaml

    (tmp_path / "m.yaml").write_text(yaml.safe_dump(_with(*change)))
    with pytest.raises(CatalogError, match=message):
        load_models(tmp_path)


def test_duplicate_names_and_bad_yaml(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "a.yaml").write_text(yaml.safe_dump(GOOD_CHAT))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(GOOD_CHAT))
    with pytest.raises(CatalogError, match="duplicate model name 'm'"):
        load_models(tmp_path)
    (tmp_path / "b.yaml").write_text("name: [unclosed")
    with pytest.raises(CatalogError, match=r"b\.yaml: not valid YAML"):
        load_models(tmp_path)
    with pytest.raises(CatalogError, match="does not exist"):
        load_models(tmp_path / "missing")


# --- GPU types, locations, prices ------------------------------------------------------

DATASHEET = [
    # name, memory GB, bandwidth GB/s, dense bf16 TFLOP/s, interconnect
    ("H200", 141, 4800, 989, "nvlink"),
    ("H100-80GB", 80, 3350, 989, "nvlink"),
    ("A100-80GB", 80, 2039, 312, "nvlink"),
    ("A100-40GB", 40, 1555, 312, "nvlink"),
    ("L40S", 48, 864, 362, "pcie"),
    ("L4", 24, 300, 121, "pcie"),
    ("A10G", 24, 600, 70, "pcie"),
]


@pytest.mark.parametrize(("name", "memory", "bandwidth", "tflops", "link"), DATASHEET)
def test_gpu_types_carry_datasheet_figures(
    catalog: Catalog, name: str, memory: int, bandwidth: int, tflops: int, link: str
) -> None:
    gpu = catalog.gpus.gpu_types[name]
    assert (gpu.memory_gb, gpu.memory_bandwidth_gbps, gpu.bf16_tflops, gpu.interconnect) == (
        memory,
        bandwidth,
        tflops,
        link,
    )
    # What the driver reports is within 10% of the datasheet and never below 95% of it.
    assert 0.95 * memory <= gpu.total_memory_gb <= 1.1 * memory
    assert catalog.gpus.allowed_counts_for(name) == (1, 2, 4, 8)


def test_cpu_type_and_local_location(catalog: Catalog) -> None:
    gpus = catalog.gpus
    assert gpus.currency == "USD"
    assert gpus.gpu_types["cpu"].is_cpu
    assert gpus.allowed_counts_for("cpu") == (1,)
    assert gpus.locations["local"].offers["cpu"] == 0.0
    assert {"us-east", "eu-west", "ap-northeast", "local"} <= set(gpus.locations)
    data = json.loads(json.dumps(gpus.to_dict()))
    assert data["gpuTypes"][-1]["allowedCounts"] == [1]
    assert data["locations"][0]["offers"]["H100-80GB"] == 2.99


@pytest.mark.parametrize(
    ("location", "gpu_type", "count", "price"),
    [
        ("us-east", "H100-80GB", 1, 2.99),
        ("us-east", "H100-80GB", 2, 2 * 2.99),
        ("us-east", "H100-80GB", 4, 4 * 2.99),
        ("us-east", "H100-80GB", 8, 8 * 2.99),
        ("eu-west", "H200", 2, 2 * 4.19),
        ("ap-northeast", "L4", 4, 4 * 0.95),
        ("local", "cpu", 1, 0.0),
    ],
)
def test_hourly_price_is_per_gpu_price_times_count(
    catalog: Catalog, location: str, gpu_type: str, count: int, price: float
) -> None:
    per_gpu = catalog.gpus.locations[location].offers[gpu_type]
    assert catalog.gpus.hourly_price(location, gpu_type, count) == per_gpu * count == price


def test_hourly_price_errors(catalog: Catalog) -> None:
    gpus = catalog.gpus
    with pytest.raises(KeyError, match="'H200' is not offered in location 'ap-northeast'"):
        gpus.hourly_price("ap-northeast", "H200", 1)
    with pytest.raises(KeyError, match="unknown location 'mars'"):
        gpus.hourly_price("mars", "L4", 1)
    with pytest.raises(KeyError, match="unknown GPU type 'TPU'"):
        gpus.hourly_price("us-east", "TPU", 1)
    with pytest.raises(ValueError, match="3 x L4 is not allowed"):
        gpus.hourly_price("us-east", "L4", 3)
    with pytest.raises(ValueError, match="GPUs per replica for cpu: 1"):
        gpus.hourly_price("local", "cpu", 2)


def test_a_location_cannot_offer_an_unknown_type() -> None:
    gpu = GpuType("X", "X", 1, 1, 1)
    with pytest.raises(CatalogError, match="offers unknown GPU type 'Y'"):
        GpuCatalog(
            gpu_types=MappingProxyType({"X": gpu}),
            locations=MappingProxyType({"l": Location("l", "", MappingProxyType({"Y": 1.0}))}),
            currency="USD",
        )


def test_bad_gpu_config_names_the_entry(tmp_path: Path) -> None:
    configs = tmp_path
    text = (default_configs_dir() / "gpus.yaml").read_text()
    (configs / "gpus.yaml").write_text(text.replace("bf16Tflops: 121", "bf16Tflops: fast"))
    (configs / "locations.yaml").write_text((default_configs_dir() / "locations.yaml").read_text())
    with pytest.raises(
        CatalogError, match=r"gpuTypes\[5\]: field 'bf16Tflops' must be int or float"
    ):
        load_gpus(configs)


def test_load_catalog_defaults_to_the_bundled_files() -> None:
    assert default_models_dir().is_dir() and (default_configs_dir() / "gpus.yaml").is_file()
    catalog = load_catalog(default_models_dir(), default_configs_dir())
    assert len(catalog.models) >= 8
