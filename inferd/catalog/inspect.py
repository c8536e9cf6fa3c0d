"""What a model's own files say about it: `config.json` (a transformers
checkpoint) or `model_index.json` (a diffusers pipeline).

Pure functions over parsed JSON: they derive the architecture facts the GPU
recommender needs (parameters, layers, KV heads, head size, context length,
dtype, quantization) and the serving hints vLLM needs (chat template,
tool-call and reasoning parsers). Finding the files (a directory, the
Hugging Face cache, the Hub) is `inferd.catalog.sources`' job.

Every refusal is an `InspectError` whose message says what is missing or
unsupported, so the API can answer it as a 400 as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from inferd.catalog.models import ChatArchitecture, ImageArchitecture

# transformers' torch_dtype names -> the catalog's dtype names.
_TORCH_DTYPES: Mapping[str, str] = MappingProxyType(
    {
        "bfloat16": "bf16",
        "float16": "fp16",
        "half": "fp16",
        "float32": "fp32",
        "float": "fp32",
        "float8_e4m3fn": "fp8",
    }
)
# Bits of a quantized weight, by quant_method, when the config does not say.
_DEFAULT_BITS: Mapping[str, int] = MappingProxyType(
    {"awq": 4, "gptq": 4, "fp8": 8, "fbgemm_fp8": 8, "bitsandbytes": 4, "compressed-tensors": 8}
)
# Scales and zero points of group-wise quantization: one fp16 scale and a
# packed zero point per group of 128 weights adds ~0.16 bits per weight.
_GROUP_OVERHEAD_BITS = 0.16


class InspectError(ValueError):
    """The files do not describe a model inferd can serve; the message says why."""


@dataclass(frozen=True)
class Quantization:
    method: str  # "awq", "gptq", "fp8", ...
    bits: float  # per quantized weight, group scales included

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "bits": self.bits}


@dataclass(frozen=True)
class ServingHints:
    """What vLLM needs besides the weights, where the files tell."""

    chat_template: str | None  # where it was found, None: no template
    tool_call_parser: str | None
    reasoning_parser: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "chatTemplate": self.chat_template,
            "toolCallParser": self.tool_call_parser,
            "reasoningParser": self.reasoning_parser,
        }


@dataclass(frozen=True)
class ChatInspection:
    architecture_class: str  # "LlamaForCausalLM"
    architecture: ChatArchitecture
    hints: ServingHints


@dataclass(frozen=True)
class ImageInspection:
    pipeline_class: str  # "StableDiffusionXLPipeline"
    architecture: ImageArchitecture
    default_size: tuple[int, int]
    default_steps: int
    default_guidance_scale: float


def _int(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    if default is not None:
        return default
    raise InspectError(f"config.json has no {' / '.join(keys)}: cannot size the model")


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (multimodal models nest it)."""
    nested = config.get("text_config") or config.get("llm_config")
    if isinstance(nested, Mapping):
        # Top-level keys (architectures, quantization) stay visible.
        return {**config, **nested}
    return config


def dtype_of(config: Mapping[str, Any]) -> str:
    raw = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    name = str(raw).removeprefix("torch.")
    if name not in _TORCH_DTYPES:
        raise InspectError(f"config.json names dtype {raw!r}, which inferd cannot size")
    return _TORCH_DTYPES[name]


def quantization_of(config: Mapping[str, Any]) -> Quantization | None:
    q = config.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method") or "").lower()
    if not method:
        raise InspectError("config.json has a quantization_config without quant_method")
    if method == "bitsandbytes":
        bits = 8 if q.get("load_in_8bit") else 4
    elif method == "compressed-tensors":
        bits = _compressed_tensors_bits(q)
    else:
        raw_bits = q.get("bits", q.get("w_bit", _DEFAULT_BITS.get(method)))
        if not isinstance(raw_bits, int | float) or isinstance(raw_bits, bool):
            raise InspectError(
                f"config.json: quantization {method!r} without a weight bit width; "
                "inferd cannot size it"
            )
        bits = int(raw_bits)
    overhead = _GROUP_OVERHEAD_BITS if bits < 8 else 0.0
    return Quantization(method=method, bits=bits + overhead)


def _compressed_tensors_bits(q: Mapping[str, Any]) -> int:
    groups = q.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and isinstance(weights.get("num_bits"), int):
                return int(weights["num_bits"])
    return _DEFAULT_BITS["compressed-tensors"]


def _experts(c: Mapping[str, Any]) -> tuple[int, int]:
    """(routed experts, their intermediate size); (0, 0) for a dense model."""
    experts = _int(c, "num_local_experts", "num_experts", "n_routed_experts", default=0)
    if experts <= 1:
        return 0, 0
    size = _int(c, "moe_intermediate_size", "intermediate_size")
    return experts, size


def count_parameters(c: Mapping[str, Any]) -> int:
    """Weights of a decoder-only transformer of the Llama family (Llama,
    Qwen, Mistral, Gemma, Phi-3, Mixtral, Qwen-MoE ...), from its config.

    Embeddings, per layer: q/k/v/o projections (biases where the config or
    the family has them), a gated MLP (three matrices) or the routed experts
    plus their router and shared experts, two norms; a final norm and the
    LM head unless it is tied to the embeddings.
    """
    hidden = _int(c, "hidden_size", "d_model", "n_embd")
    layers = _int(c, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(c, "num_attention_heads", "n_head")
    kv_heads = _int(c, "num_key_value_heads", "num_kv_heads", default=heads)
    head_dim = _int(c, "head_dim", default=hidden // heads)
    vocab = _int(c, "vocab_size")
    intermediate = _int(c, "intermediate_size", "ffn_dim", default=4 * hidden)
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    attention += heads * head_dim * hidden
    # Qwen2 always has q/k/v biases; others say so with attention_bias.
    if c.get("attention_bias") or c.get("model_type") in ("qwen2", "qwen2_moe"):
        attention += (heads + 2 * kv_heads) * head_dim
    experts, expert_size = _experts(c)
    if experts:
        mlp = experts * 3 * hidden * expert_size + hidden * experts
        shared = _int(c, "shared_expert_intermediate_size", default=0)
        shared += _int(c, "n_shared_experts", default=0) * expert_size
        mlp += 3 * hidden * shared
    else:
        mlp = 3 * hidden * intermediate
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden
    head = 0 if c.get("tie_word_embeddings", False) else vocab * hidden
    return embeddings + layers * per_layer + hidden + head


def unquantized_parameters(c: Mapping[str, Any]) -> int:
    """Weights quantization leaves in the activation dtype: embeddings and
    the LM head (AWQ, GPTQ and FP8 checkpoints all keep them)."""
    hidden = _int(c, "hidden_size", "d_model", "n_embd")
    vocab = _int(c, "vocab_size")
    return vocab * hidden * (1 if c.get("tie_word_embeddings", False) else 2)


def context_length_of(c: Mapping[str, Any]) -> int:
    return _int(c, "max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


def inspect_chat(
    config: Mapping[str, Any],
    tokenizer_config: Mapping[str, Any] | None = None,
    chat_template_file: str | None = None,
) -> ChatInspection:
    """A transformers `config.json` as catalog facts; `tokenizer_config` and
    `chat_template_file` (the text of a `chat_template.jinja`) give the hints."""
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise InspectError(
            "config.json has no 'architectures' list: it does not name the model class, so "
            "inferd cannot tell whether vLLM serves it"
        )
    c = text_config(config)
    heads = _int(c, "num_attention_heads", "n_head")
    kv_heads = _int(c, "num_key_value_heads", "num_kv_heads", default=heads)
    hidden = _int(c, "hidden_size", "d_model", "n_embd")
    if kv_heads <= 0 or heads % kv_heads:
        raise InspectError(
            f"config.json: {heads} attention heads are not a multiple of {kv_heads} KV heads"
        )
    quant = quantization_of(c)
    dtype = dtype_of(c)
    if quant is not None and quant.method == "fp8" and dtype == "fp8":
        dtype = "bf16"  # the activations and KV cache of an FP8 checkpoint
    arch = ChatArchitecture(
        family=str(c.get("model_type") or archs[0]),
        parameters=count_parameters(c),
        layers=_int(c, "num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=hidden,
        intermediate_size=_int(c, "intermediate_size", "ffn_dim", default=4 * hidden),
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=_int(c, "head_dim", default=hidden // heads),
        vocab_size=_int(c, "vocab_size"),
        context_length=context_length_of(c),
        dtype=dtype,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        quantization=quant.method if quant else None,
        weight_bits=quant.bits if quant else None,
        unquantized_parameters=unquantized_parameters(c) if quant else 0,
    )
    return ChatInspection(archs[0], arch, serving_hints(c, tokenizer_config, chat_template_file))


def _template_text(tokenizer_config: Mapping[str, Any] | None) -> str | None:
    if not tokenizer_config:
        return None
    template = tokenizer_config.get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # named templates: [{"name", "template"}]
        texts = [t.get("template", "") for t in template if isinstance(t, Mapping)]
        return "\n".join(str(t) for t in texts)
    return None


def serving_hints(
    c: Mapping[str, Any],
    tokenizer_config: Mapping[str, Any] | None,
    chat_template_file: str | None,
) -> ServingHints:
    """Chat template location and vLLM's tool-call and reasoning parser names.

    Parsers are inferred only where the template shows the feature (a tool
    call section, a <think> block) and the family's format is known; else None
    (vLLM then serves plain chat).
    """
    text = _template_text(tokenizer_config)
    if chat_template_file is not None:
        where: str | None = "chat_template.jinja"
        template = chat_template_file
    else:
        where = "tokenizer_config.json" if text else None
        template = text or ""
    family = str(c.get("model_type") or "")
    tools = "tool" in template
    tool_parser: str | None = None
    if tools:
        if family == "llama" and ("<|python_tag|>" in template or "ipython" in template):
            tool_parser = "llama3_json"
        elif family.startswith("qwen") or "<tool_call>" in template:
            tool_parser = "hermes"
        elif family in ("mistral", "mixtral") or "[TOOL_CALLS]" in template:
            tool_parser = "mistral"
        elif family.startswith("deepseek_v3"):
            tool_parser = "deepseek_v3"
        elif family.startswith("granite"):
            tool_parser = "granite"
    reasoning: str | None = None
    if "<think>" in template or "</think>" in template:
        reasoning = "qwen3" if family.startswith("qwen3") else "deepseek_r1"
    return ServingHints(where, tool_parser, reasoning)


# --- diffusers pipelines -------------------------------------------------------------


@dataclass(frozen=True)
class PipelineFamily:
    """Reference figures of a pipeline family, for sizes and FLOPs that a
    model_index.json cannot give. A registered pipeline's UNet cost is scaled
    from these by its own denoiser's parameter count."""

    family: str
    denoiser_parameters: int
    tflops_per_step: float  # one denoiser evaluation at `default_size`
    vae_decode_tflops: float
    activation_gb_per_image: float
    default_size: tuple[int, int]
    default_steps: int
    guidance_scale: float


# SDXL's figures are models/catalog/sdxl-base-1.0.yaml's (counted with
# torch.utils.flop_counter); SD 1.5's by the same method at 512x512.
PIPELINE_FAMILIES: Mapping[str, PipelineFamily] = MappingProxyType(
    {
        "StableDiffusionXLPipeline": PipelineFamily(
            "sdxl", 2_567_463_684, 6.76, 10.47, 3.7, (1024, 1024), 30, 5.0
        ),
        "StableDiffusionPipeline": PipelineFamily(
            "sd15", 859_520_964, 0.68, 2.5, 1.0, (512, 512), 50, 7.5
        ),
    }
)
_DENOISERS = ("unet", "transformer", "prior", "decoder")


def inspect_pipeline(
    model_index: Mapping[str, Any],
    component_parameters: Mapping[str, int],
    defaults: Mapping[str, Any] | None = None,
) -> ImageInspection:
    """A diffusers `model_index.json` as catalog facts.

    `component_parameters`: weights per component, counted from the
    safetensors headers where the weights are present (empty: the family's
    reference figures). `defaults`: an optional `inferd.json` with
    defaultSize/defaultSteps/defaultGuidanceScale.
    """
    cls = model_index.get("_class_name")
    if not isinstance(cls, str) or not cls:
        raise InspectError("model_index.json has no '_class_name': not a diffusers pipeline")
    family = PIPELINE_FAMILIES.get(cls)
    if family is None:
        known = ", ".join(PIPELINE_FAMILIES)
        raise InspectError(
            f"pipeline class {cls!r} has no cost model in inferd (known: {known}); "
            "the recommender cannot size it"
        )
    components = {k: v for k, v in component_parameters.items() if v > 0}
    denoiser = next((components[n] for n in _DENOISERS if n in components), None)
    if denoiser is None:
        denoiser = family.denoiser_parameters
        components = {}
    scale = denoiser / family.denoiser_parameters
    d = defaults or {}
    size = _size(d.get("defaultSize"), family.default_size)
    pixels = size[0] * size[1] / (family.default_size[0] * family.default_size[1])
    raw_dtype = model_index.get("torch_dtype") or d.get("dtype") or "float16"
    dtype = _TORCH_DTYPES.get(str(raw_dtype).removeprefix("torch."), "fp16")
    arch = ImageArchitecture(
        family=family.family,
        parameters=sum(components.values()) or denoiser,
        components=MappingProxyType({_camel(k): v for k, v in components.items()}),
        dtype=dtype,
        unet_tflops_per_step=round(family.tflops_per_step * scale * pixels, 6),
        vae_decode_tflops=round(family.vae_decode_tflops * pixels, 6),
        guidance_evaluations=2,
        activation_gb_per_image=round(family.activation_gb_per_image * pixels, 3),
    )
    steps = d.get("defaultSteps", family.default_steps)
    guidance = d.get("defaultGuidanceScale", family.guidance_scale)
    return ImageInspection(cls, arch, size, int(steps), float(guidance))


def _size(value: Any, default: tuple[int, int]) -> tuple[int, int]:
    if isinstance(value, str) and "x" in value:
        w, _, h = value.partition("x")
        if w.isdigit() and h.isdigit():
            return int(w), int(h)
    if isinstance(value, list | tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    return default


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)
