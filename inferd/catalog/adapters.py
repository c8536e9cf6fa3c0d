"""LoRA adapters, checked against the base model they are registered on.

What is read: the adapter's `adapter_config.json` (PEFT's) and the header of
its `adapter_model.safetensors` (names and shapes only, never the weights),
and the headers of the base model's safetensors files. The check is a pure
function of those facts: an adapter fits a base when every matrix it adds
has the shape of the base weight it adapts (which is what the architecture
means to vLLM: the same module names, the same dimensions), its target
modules exist in the base, and its rank is within what the endpoint's
replicas reserve room for (`maxLoraRank`).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# A safetensors header is a JSON document; an adapter's is a few KB, a
# large model's a few MB.
_MAX_HEADER_BYTES = 64 * 1024 * 1024
# PEFT names the matrices `base_model.model.<module>.lora_A.weight` (and
# `lora_B`, `lora_embedding_A`, ...); the base weight is `<module>.weight`.
_LORA_KEY = re.compile(
    r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$"
)


class AdapterRejected(ValueError):
    """The adapter cannot serve on this base: `param` names what is wrong."""

    def __init__(self, message: str, param: str = "source") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class AdapterFacts:
    """What an adapter directory says about itself."""

    rank: int
    target_modules: tuple[str, ...]
    # PEFT's `base_model_name_or_path`: what it was trained on, as its
    # trainer named it (a repository id or a path); informative only.
    base_model: str | None
    # The adapted module (the base weight's name without `.weight`) ->
    # (rows of lora_B, columns of lora_A): the base weight's (out, in).
    modules: Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class BaseFacts:
    """What the base model's weights say: every weight's shape by name."""

    name: str
    architectures: tuple[str, ...]
    weights: Mapping[str, tuple[int, ...]]


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from a safetensors file's header alone."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise AdapterRejected(f"{path.name} is not a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER_BYTES:
            raise AdapterRejected(f"{path.name}: a safetensors header of {size} bytes")
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise AdapterRejected(f"{path.name}: the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise AdapterRejected(f"{path.name}: the safetensors header is not a JSON object")
    return {
        name: tuple(int(d) for d in entry.get("shape", ()))
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict)
    }


def _json_object(path: Path) -> Mapping[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterRejected(f"{path.name} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AdapterRejected(f"{path.name} is not a JSON object")
    return data


def read_adapter(directory: Path) -> AdapterFacts:
    """The facts of a PEFT LoRA adapter directory (a blocking call)."""
    config_path = directory / ADAPTER_CONFIG
    if not config_path.is_file():
        raise AdapterRejected(
            f"{directory} has no {ADAPTER_CONFIG}: not a PEFT adapter (save it with "
            "PeftModel.save_pretrained)"
        )
    config = _json_object(config_path)
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise AdapterRejected(f"the adapter is a {peft_type} adapter; only LoRA is served")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterRejected(f"{ADAPTER_CONFIG}: 'r' (the rank) is {rank!r}, not a positive int")
    ranks = [rank, *(v for v in (config.get("rank_pattern") or {}).values() if isinstance(v, int))]
    targets = config.get("target_modules") or ()
    if isinstance(targets, str):  # PEFT allows a regular expression; kept as one name
        targets = (targets,)
    weights_path = directory / ADAPTER_WEIGHTS
    if not weights_path.is_file():
        raise AdapterRejected(f"{directory} has no {ADAPTER_WEIGHTS}")
    modules: dict[str, list[int]] = {}
    for name, shape in safetensors_shapes(weights_path).items():
        match = _LORA_KEY.match(name)
        if match is None or len(shape) != 2:
            continue
        dims = modules.setdefault(match["module"], [0, 0])
        if match["ab"] == "A":
            dims[1] = shape[1]  # lora_A: (rank, in)
        else:
            dims[0] = shape[0]  # lora_B: (out, rank)
    if not modules:
        raise AdapterRejected(f"{ADAPTER_WEIGHTS} holds no LoRA matrices")
    base = config.get("base_model_name_or_path")
    return AdapterFacts(
        rank=max(ranks),
        target_modules=tuple(str(t) for t in targets),
        base_model=str(base) if base else None,
        modules={m: (d[0], d[1]) for m, d in modules.items()},
    )


def read_base(name: str, directory: Path) -> BaseFacts:
    """The facts of a base model directory: weight shapes from the headers of
    its safetensors files."""
    weights: dict[str, tuple[int, ...]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        weights.update(safetensors_shapes(path))
    config_path = directory / "config.json"
    architectures: tuple[str, ...] = ()
    if config_path.is_file():
        archs = _json_object(config_path).get("architectures") or ()
        architectures = tuple(str(a) for a in archs)
    return BaseFacts(name, architectures, weights)


def check_adapter(adapter: AdapterFacts, base: BaseFacts, max_rank: int) -> None:
    """Raises `AdapterRejected` naming the first thing that does not fit."""
    if adapter.rank > max_rank:
        raise AdapterRejected(
            f"the adapter's rank is {adapter.rank}, above the endpoint's "
            f"engineSettings.maxLoraRank {max_rank}: raise it (a rolling replacement) or use a "
            "smaller adapter",
            param="rank",
        )
    if not base.weights:
        return  # the base's weights are not on this machine: the rank is all we can check
    module_names = {w.rsplit(".", 2)[-2] for w in base.weights if w.count(".") >= 2}
    missing = [t for t in adapter.target_modules if t not in module_names and not _is_pattern(t)]
    if missing:
        raise AdapterRejected(
            f"target module(s) {', '.join(map(repr, missing))} do not exist in "
            f"'{base.name}' ({', '.join(base.architectures) or 'its architecture'}); "
            f"its modules include {', '.join(sorted(module_names)[:12])}",
            param="targetModules",
        )
    for module, (out_dim, in_dim) in sorted(adapter.modules.items()):
        shape = base.weights.get(f"{module}.weight")
        if shape is None:
            raise AdapterRejected(
                f"the adapter adapts '{module}', which '{base.name}' "
                f"({', '.join(base.architectures) or 'its architecture'}) does not have: "
                f"it was made for another base model"
                + (f" ({adapter.base_model})" if adapter.base_model else ""),
                param="architecture",
            )
        if len(shape) == 2 and (out_dim, in_dim) != (shape[0], shape[1]):
            raise AdapterRejected(
                f"the adapter's '{module}' is {out_dim}x{in_dim}, the base model "
                f"'{base.name}' has {shape[0]}x{shape[1]} there: it was made for another "
                "base model" + (f" ({adapter.base_model})" if adapter.base_model else ""),
                param="architecture",
            )


def _is_pattern(target: str) -> bool:
    return any(c in target for c in "*^$[]()|\\")
