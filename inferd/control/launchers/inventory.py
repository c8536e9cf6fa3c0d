"""This machine's GPUs, and which catalog GPU type each one is.

Read with `nvidia-smi` (present wherever the NVIDIA driver is) rather than
NVML bindings or torch: the control plane stays free of both, and a machine
without the driver simply has no GPUs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LocalGpu:
    index: int
    name: str
    memory_mib: int


def parse_nvidia_smi(output: str) -> list[LocalGpu]:
    """Lines of `nvidia-smi --query-gpu=index,name,memory.total
    --format=csv,noheader,nounits`."""
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        gpus.append(LocalGpu(int(parts[0]), parts[1], int(float(parts[2]))))
    return gpus


def detect_gpus(run: Callable[..., Any] = subprocess.run) -> list[LocalGpu]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        result = run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    return parse_nvidia_smi(result.stdout)


def match_gpu_type(gpu: LocalGpu, gpu_types: Mapping[str, Any]) -> str | None:
    """The catalog type whose family appears in the device name as a word
    ("H100" in "NVIDIA H100 80GB HBM3", but "L4" not in "L40S") and whose
    memory is within 10% of the device's."""
    best = None
    for name, gpu_type in gpu_types.items():
        if getattr(gpu_type, "is_cpu", False):
            continue
        family = name.split("-")[0]
        if not re.search(rf"(?<![A-Za-z0-9]){re.escape(family)}(?![A-Za-z0-9])", gpu.name):
            continue
        expected_mib = getattr(gpu_type, "memory_mib", None) or gpu_type.memory_gb * 1024
        if abs(gpu.memory_mib - expected_mib) <= 0.1 * expected_mib:
            best = name
    return best


def parse_declared_gpu_types(text: str, gpu_types: Mapping[str, Any]) -> dict[int, str]:
    """The `gpu_types` setting: `L40S` (every GPU of this machine; index -1)
    or `0=H100-80GB,1=L4` (by nvidia-smi index). Types must be catalog GPU
    types, so that a typo is an error at start, not an endpoint pending for ever."""
    declared: dict[int, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        index_text, sep, name = part.rpartition("=")
        if sep and not index_text.strip().isdigit():
            raise ValueError(f"{part!r}: use TYPE or INDEX=TYPE, e.g. 0=H100-80GB")
        name = name.strip()
        if name not in gpu_types or getattr(gpu_types[name], "is_cpu", False):
            known = ", ".join(t for t, v in gpu_types.items() if not getattr(v, "is_cpu", False))
            raise ValueError(f"unknown GPU type {name!r}; known: {known}")
        declared[int(index_text) if sep else -1] = name
    return declared
