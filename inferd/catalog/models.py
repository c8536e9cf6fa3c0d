"""The model catalog: one YAML file per model under `models/catalog/`.

Each entry names a model, where its weights come from (`source`: a Hugging
Face repository id, `builtin:NAME` for a tiny local model, or a directory)
and the architecture facts the GPU recommender needs. Keys are camelCase in
YAML and in `to_dict()` (the JSON of `GET /inference/models`); snake_case in
Python. `models/README.md` describes every field.

Loading validates every entry and names the file and field that is wrong,
so a bad catalog fails at start-up, not at the first recommendation.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from inferd.vocab import ModelKind

if TYPE_CHECKING:
    from inferd.engines.base import ImageModelInfo

# The kinds as the catalog's files spell them; `ModelKind` is the vocabulary.
KINDS = tuple(kind.value for kind in ModelKind)
TEXT_KINDS = tuple(kind.value for kind in ModelKind if kind.reads_text)
# Bytes per parameter (and per KV-cache element) for each weight dtype.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
)
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class CatalogError(ValueError):
    """A catalog or configuration file is malformed; the message says where."""


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def camel_dict(obj: Any) -> dict[str, Any]:
    """A frozen dataclass as a JSON-able dict with camelCase keys."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        out[camel(f.name)] = _jsonable(getattr(obj, f.name))
    return out


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value.to_dict() if hasattr(value, "to_dict") else camel_dict(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


class Entry:
    """Typed access to one YAML mapping, with errors that say file and key."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise CatalogError(f"{where}: expected a mapping, got {type(data).__name__}")
        self.data = data
        self.where = where

    def _get(self, key: str, types: tuple[type, ...], default: Any, required: bool) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise CatalogError(f"{self.where}: missing required field '{key}'")
            return default
        value = self.data[key]
        # bool is an int in Python; a YAML `true` is never a valid number here.
        if isinstance(value, bool) and bool not in types:
            raise CatalogError(f"{self.where}: field '{key}' must not be a boolean")
        if not isinstance(value, types):
            names = " or ".join(t.__name__ for t in types)
            raise CatalogError(
                f"{self.where}: field '{key}' must be {names}, got {type(value).__name__}"
            )
        return value

    def text(self, key: str, default: str | None = None) -> str:
        return str(self._get(key, (str,), default, default is None))

    def optional_text(self, key: str) -> str | None:
        value = self._get(key, (str,), None, False)
        return None if value is None else str(value)

    def integer(self, key: str, default: int | None = None) -> int:
        value = int(self._get(key, (int,), default, default is None))
        if value < 0:
            raise CatalogError(f"{self.where}: field '{key}' must not be negative")
        return value

    def number(self, key: str, default: float | None = None) -> float:
        value = float(self._get(key, (int, float), default, default is None))
        if value < 0:
            raise CatalogError(f"{self.where}: field '{key}' must not be negative")
        return value

    def flag(self, key: str, default: bool) -> bool:
        return bool(self._get(key, (bool,), default, False))

    def mapping(self, key: str) -> Entry:
        return Entry(self._get(key, (dict,), None, True), f"{self.where}.{key}")

    def items(self, key: str, default: list[Any] | None = None) -> list[Any]:
        return list(self._get(key, (list,), default, default is None))

    def choice(self, key: str, choices: tuple[str, ...] | Mapping[str, Any]) -> str:
        value = self.text(key)
        if value not in choices:
            raise CatalogError(
                f"{self.where}: field '{key}' is {value!r}; choose one of {', '.join(choices)}"
            )
        return value


def read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML: {exc}") from None


@dataclass(frozen=True)
class ChatArchitecture:
    """Decoder-only transformer facts, as in the model's `config.json`."""

    family: str  # "llama", "qwen2", ...
    parameters: int
    layers: int
    hidden_size: int
    intermediate_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    dtype: str
    tie_word_embeddings: bool
    # Weight-only quantization (AWQ, GPTQ, FP8): the method, bits per
    # quantized weight (group scales included), and the weights it leaves in
    # `dtype` (embeddings, LM head). None: every weight is in `dtype`.
    quantization: str | None = None
    weight_bits: float | None = None
    unquantized_parameters: int = 0
    # KV-cache element type when an endpoint's engine settings choose one
    # (fp8); None: the weights' dtype. Never read from a catalog file.
    kv_cache_dtype: str | None = None

    @property
    def bytes_per_param(self) -> int:
        """Bytes of an activation or KV-cache element (and of an unquantized weight)."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights as loaded: quantized ones at their bit width."""
        if self.weight_bits is None:
            return float(self.parameters * self.bytes_per_param)
        quantized = self.parameters - self.unquantized_parameters
        return quantized * self.weight_bits / 8 + self.unquantized_parameters * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        # A key and a value vector per layer and KV head, in the cache's dtype.
        element = DTYPE_BYTES[self.kv_cache_dtype or self.dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * element

    def to_dict(self) -> dict[str, Any]:
        out = camel_dict(self)
        if self.kv_cache_dtype is None:
            del out["kvCacheDtype"]  # a setting of an endpoint, not a fact of the model
        return out


@dataclass(frozen=True)
class ImageArchitecture:
    """Latent-diffusion pipeline facts.

    FLOP figures are for one image at the model's default size: one UNet
    evaluation, and one VAE decode. Classifier-free guidance evaluates the
    UNet twice per step (`guidance_evaluations` = 2); guidance-free distilled
    models once. `activation_gb_per_image` is peak memory beyond the weights
    per image in a batch at the default size.
    """

    family: str  # "sdxl"
    parameters: int
    # unet, textEncoder, textEncoder2, vae -> parameters. (Mappings stay out
    # of the hash, so that the frozen dataclasses hash.)
    components: Mapping[str, int] = dataclasses.field(hash=False)
    dtype: str
    unet_tflops_per_step: float
    vae_decode_tflops: float
    guidance_evaluations: int
    activation_gb_per_image: float

    @property
    def bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def unet_parameters(self) -> int:
        return self.components.get("unet", self.parameters)

    def to_dict(self) -> dict[str, Any]:
        return camel_dict(self)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # "chat" | "image" | "embedding" | "rerank"
    source: str  # HF repo id, builtin:NAME, or a directory
    description: str
    architecture: ChatArchitecture | ImageArchitecture
    # Image models only (None for chat): the request defaults and limits the
    # image engine enforces (see `inferd.engines.base.ImageModelInfo`).
    default_size: tuple[int, int] | None = None
    default_steps: int | None = None
    default_guidance_scale: float | None = None
    max_n: int | None = None
    min_side: int | None = None
    max_side: int | None = None
    side_multiple: int | None = None
    # Chat models only: vLLM's tool-call parser (`--tool-call-parser`) and
    # reasoning parser (`--reasoning-parser`) for the model's output format;
    # None: the model's requests with tools (or reasoning) are refused.
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    @property
    def chat(self) -> ChatArchitecture:
        if not isinstance(self.architecture, ChatArchitecture):
            raise TypeError(f"model {self.name!r} is a {self.kind} model, not chat")
        return self.architecture

    @property
    def image(self) -> ImageArchitecture:
        if not isinstance(self.architecture, ImageArchitecture):
            raise TypeError(f"model {self.name!r} is a {self.kind} model, not image")
        return self.architecture

    def image_info(self) -> ImageModelInfo:
        """The engine-side limits of an image model, from its catalog entry."""
        from inferd.engines.base import ImageModelInfo

        if self.kind != ModelKind.IMAGE:
            raise TypeError(f"model {self.name!r} is a {self.kind} model, not image")
        assert self.default_size and self.default_steps and self.max_n
        assert self.min_side and self.max_side and self.side_multiple
        return ImageModelInfo(
            name=self.name,
            default_size=self.default_size,
            max_n=self.max_n,
            min_side=self.min_side,
            max_side=self.max_side,
            side_multiple=self.side_multiple,
            default_steps=self.default_steps,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "description": self.description,
            "parameters": self.architecture.parameters,
            "architecture": self.architecture.to_dict(),
        }
        if self.kind == ModelKind.CHAT:
            out.update(toolCallParser=self.tool_call_parser, reasoningParser=self.reasoning_parser)
        if self.kind == ModelKind.IMAGE:
            assert self.default_size is not None
            out.update(
                defaultSize=f"{self.default_size[0]}x{self.default_size[1]}",
                defaultSteps=self.default_steps,
                defaultGuidanceScale=self.default_guidance_scale,
                maxN=self.max_n,
                minSide=self.min_side,
                maxSide=self.max_side,
                sideMultiple=self.side_multiple,
            )
        return out


class ModelCatalog:
    """Models by name, in the order of their file names."""

    def __init__(self, specs: list[ModelSpec] | tuple[ModelSpec, ...]) -> None:
        self._specs: dict[str, ModelSpec] = {}
        for spec in specs:
            if spec.name in self._specs:
                raise CatalogError(f"duplicate model name {spec.name!r} in the catalog")
            self._specs[spec.name] = spec

    def get(self, name: str) -> ModelSpec:
        try:
            return self._specs[name]
        except KeyError:
            known = ", ".join(self._specs) or "(none)"
            raise KeyError(f"unknown model {name!r}; known models: {known}") from None

    def all(self) -> list[ModelSpec]:
        return list(self._specs.values())

    def add(self, spec: ModelSpec) -> None:
        """A model registered at run time joins the catalog (placement and
        the recommender then find it like any other)."""
        if spec.name in self._specs:
            raise CatalogError(f"duplicate model name {spec.name!r} in the catalog")
        self._specs[spec.name] = spec

    def remove(self, name: str) -> None:
        self._specs.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)


def parse_size(text: str, where: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match:
        raise CatalogError(f"{where}: size {text!r} must be written WIDTHxHEIGHT, e.g. 1024x1024")
    return int(match.group(1)), int(match.group(2))


def chat_architecture(e: Entry) -> ChatArchitecture:
    arch = ChatArchitecture(
        family=e.text("family"),
        parameters=e.integer("parameters"),
        layers=e.integer("layers"),
        hidden_size=e.integer("hiddenSize"),
        intermediate_size=e.integer("intermediateSize"),
        attention_heads=e.integer("attentionHeads"),
        kv_heads=e.integer("kvHeads"),
        head_dim=e.integer("headDim"),
        vocab_size=e.integer("vocabSize"),
        context_length=e.integer("contextLength"),
        dtype=e.choice("dtype", DTYPE_BYTES),
        tie_word_embeddings=e.flag("tieWordEmbeddings", False),
        quantization=e.text("quantization") if e.data.get("quantization") else None,
        weight_bits=e.number("weightBits") if e.data.get("weightBits") else None,
        unquantized_parameters=e.integer("unquantizedParameters", 0),
    )
    if arch.kv_heads == 0 or arch.attention_heads % arch.kv_heads:
        raise CatalogError(f"{e.where}: attentionHeads must be a multiple of kvHeads")
    return arch


def _image_architecture(e: Entry) -> ImageArchitecture:
    components = e.mapping("components")
    counts = {str(k): components.integer(str(k)) for k in components.data}
    arch = ImageArchitecture(
        family=e.text("family"),
        parameters=e.integer("parameters"),
        components=MappingProxyType(counts),
        dtype=e.choice("dtype", DTYPE_BYTES),
        unet_tflops_per_step=e.number("unetTflopsPerStep"),
        vae_decode_tflops=e.number("vaeDecodeTflops"),
        guidance_evaluations=e.integer("guidanceEvaluations"),
        activation_gb_per_image=e.number("activationGbPerImage"),
    )
    if counts and sum(counts.values()) != arch.parameters:
        raise CatalogError(
            f"{e.where}: parameters ({arch.parameters}) must equal the sum of components "
            f"({sum(counts.values())})"
        )
    if arch.guidance_evaluations not in (1, 2):
        raise CatalogError(f"{e.where}: guidanceEvaluations must be 1 or 2")
    return arch


def parse_model(data: Any, where: str) -> ModelSpec:
    e = Entry(data, where)
    name = e.text("name")
    if not _NAME.match(name):
        raise CatalogError(
            f"{where}: name {name!r} must be lowercase letters, digits, '.', '_' or '-'"
        )
    kind = e.choice("kind", KINDS)
    common: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "source": e.text("source"),
        "description": e.text("description"),
    }
    if kind in TEXT_KINDS:
        return ModelSpec(
            architecture=chat_architecture(e.mapping("architecture")),
            tool_call_parser=e.optional_text("toolCallParser"),
            reasoning_parser=e.optional_text("reasoningParser"),
            **common,
        )
    size = parse_size(e.text("defaultSize"), f"{where}.defaultSize")
    spec = ModelSpec(
        architecture=_image_architecture(e.mapping("architecture")),
        default_size=size,
        default_steps=e.integer("defaultSteps"),
        default_guidance_scale=e.number("defaultGuidanceScale"),
        max_n=e.integer("maxN"),
        min_side=e.integer("minSide"),
        max_side=e.integer("maxSide"),
        side_multiple=e.integer("sideMultiple"),
        **common,
    )
    assert spec.min_side is not None and spec.max_side is not None
    assert spec.side_multiple is not None and spec.max_n is not None
    if spec.max_n < 1 or spec.side_multiple < 1 or spec.min_side > spec.max_side:
        raise CatalogError(f"{where}: need maxN >= 1, sideMultiple >= 1, minSide <= maxSide")
    for side in size:
        if not spec.min_side <= side <= spec.max_side or side % spec.side_multiple:
            raise CatalogError(f"{where}: defaultSize is outside the model's own size limits")
    return spec


def load_models(models_dir: Path) -> ModelCatalog:
    """Every `*.yaml` in `models_dir`, sorted by file name."""
    if not models_dir.is_dir():
        raise CatalogError(f"model catalog directory {models_dir} does not exist")
    specs = [parse_model(read_yaml(path), str(path)) for path in sorted(models_dir.glob("*.yaml"))]
    return ModelCatalog(specs)
