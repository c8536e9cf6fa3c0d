"""GPU types, locations and prices: `configs/gpus.yaml` and `configs/locations.yaml`.

`hourlyPrice` of an endpoint is `GpuCatalog.hourly_price(location, type,
count)`: the per-GPU price the location's table names times the GPUs of one
replica, in `GpuCatalog.currency`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from inferd.catalog.models import CatalogError, Entry, camel_dict, read_yaml

INTERCONNECTS = ("nvlink", "pcie", "none")
# Tensor-core generations the performance model tells apart (FP8 from ada on).
GENERATIONS = ("ampere", "ada", "hopper", "cpu")
DEFAULT_ALLOWED_COUNTS = (1, 2, 4, 8)
_MIB = 1024 * 1024


@dataclass(frozen=True)
class GpuType:
    name: str  # identifier used in requests: "H100-80GB"
    display_name: str
    memory_gb: float  # datasheet figure
    memory_bandwidth_gbps: float  # GB/s
    bf16_tflops: float  # dense
    interconnect: str = "pcie"
    # Total memory as the driver reports it; None: memory_gb is exact.
    memory_mib: int | None = None
    generation: str = "ampere"

    @property
    def total_memory_gb(self) -> float:
        """Device memory in GB of 10^9 bytes, the unit of every fit figure."""
        if self.memory_mib is None:
            return self.memory_gb
        return self.memory_mib * _MIB / 1e9

    @property
    def is_cpu(self) -> bool:
        return self.interconnect == "none"

    def to_dict(self) -> dict[str, Any]:
        out = camel_dict(self)
        out["totalMemoryGb"] = round(self.total_memory_gb, 2)
        return out


@dataclass(frozen=True)
class Location:
    name: str
    description: str
    offers: Mapping[str, float] = field(hash=False)  # gpu type -> price per GPU-hour

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "offers": dict(self.offers)}


@dataclass(frozen=True)
class GpuCatalog:
    gpu_types: Mapping[str, GpuType] = field(hash=False)
    locations: Mapping[str, Location] = field(hash=False)
    currency: str
    allowed_counts: tuple[int, ...] = DEFAULT_ALLOWED_COUNTS
    # Types whose counts differ from `allowed_counts` (cpu: 1 only).
    count_overrides: Mapping[str, tuple[int, ...]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for loc in self.locations.values():
            for gpu in loc.offers:
                if gpu not in self.gpu_types:
                    raise CatalogError(
                        f"location {loc.name!r} offers unknown GPU type {gpu!r}; "
                        f"known: {', '.join(self.gpu_types)}"
                    )

    def gpu_type(self, name: str) -> GpuType:
        try:
            return self.gpu_types[name]
        except KeyError:
            known = ", ".join(self.gpu_types)
            raise KeyError(f"unknown GPU type {name!r}; known GPU types: {known}") from None

    def location(self, name: str) -> Location:
        try:
            return self.locations[name]
        except KeyError:
            known = ", ".join(self.locations)
            raise KeyError(f"unknown location {name!r}; known locations: {known}") from None

    def allowed_counts_for(self, gpu_type: str) -> tuple[int, ...]:
        self.gpu_type(gpu_type)
        return self.count_overrides.get(gpu_type, self.allowed_counts)

    def price_per_gpu(self, location: str, gpu_type: str) -> float:
        loc = self.location(location)
        self.gpu_type(gpu_type)
        if gpu_type not in loc.offers:
            offered = ", ".join(loc.offers) or "(nothing)"
            raise KeyError(
                f"GPU type {gpu_type!r} is not offered in location {location!r}; "
                f"offered there: {offered}"
            )
        return loc.offers[gpu_type]

    def hourly_price(self, location: str, gpu_type: str, gpu_count: int) -> float:
        """Price of one replica-hour: per-GPU price times the replica's GPUs."""
        per_gpu = self.price_per_gpu(location, gpu_type)
        allowed = self.allowed_counts_for(gpu_type)
        if gpu_count not in allowed:
            raise ValueError(
                f"{gpu_count} x {gpu_type} is not allowed; GPUs per replica for "
                f"{gpu_type}: {', '.join(map(str, allowed))}"
            )
        return per_gpu * gpu_count

    def to_dict(self) -> dict[str, Any]:
        return {
            "currency": self.currency,
            "allowedCounts": list(self.allowed_counts),
            "gpuTypes": [
                {**g.to_dict(), "allowedCounts": list(self.allowed_counts_for(g.name))}
                for g in self.gpu_types.values()
            ],
            "locations": [loc.to_dict() for loc in self.locations.values()],
        }


def _counts(values: list[Any], where: str) -> tuple[int, ...]:
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CatalogError(f"{where}: allowedCounts must be a non-empty list of integers")
    if min(values) < 1 or len(set(values)) != len(values):
        raise CatalogError(f"{where}: allowedCounts must be distinct positive integers")
    return tuple(sorted(values))


def _gpu_type(data: Any, where: str) -> tuple[GpuType, tuple[int, ...] | None]:
    e = Entry(data, where)
    mib = e.integer("memoryMib", 0) or None
    gpu = GpuType(
        name=e.text("name"),
        display_name=e.text("displayName"),
        memory_gb=e.number("memoryGb"),
        memory_bandwidth_gbps=e.number("memoryBandwidthGbps"),
        bf16_tflops=e.number("bf16Tflops"),
        interconnect=e.choice("interconnect", INTERCONNECTS),
        memory_mib=mib,
        generation=e.choice("generation", GENERATIONS) if "generation" in e.data else "ampere",
    )
    if min(gpu.memory_gb, gpu.memory_bandwidth_gbps, gpu.bf16_tflops) <= 0:
        raise CatalogError(f"{where}: memory, bandwidth and TFLOP/s must be positive")
    counts = _counts(e.items("allowedCounts"), where) if "allowedCounts" in e.data else None
    return gpu, counts


def _location(data: Any, where: str) -> Location:
    e = Entry(data, where)
    offers = e.mapping("offers")
    prices = {str(gpu): offers.number(str(gpu)) for gpu in offers.data}
    return Location(
        name=e.text("name"),
        description=e.text("description"),
        offers=MappingProxyType(prices),
    )


def load_gpus(configs_dir: Path) -> GpuCatalog:
    gpus_path, locations_path = configs_dir / "gpus.yaml", configs_dir / "locations.yaml"
    for path in (gpus_path, locations_path):
        if not path.is_file():
            raise CatalogError(f"{path} does not exist")
    g = Entry(read_yaml(gpus_path), str(gpus_path))
    allowed = _counts(g.items("allowedCounts", list(DEFAULT_ALLOWED_COUNTS)), str(gpus_path))
    types: dict[str, GpuType] = {}
    overrides: dict[str, tuple[int, ...]] = {}
    for i, item in enumerate(g.items("gpuTypes")):
        gpu, counts = _gpu_type(item, f"{gpus_path}: gpuTypes[{i}]")
        if gpu.name in types:
            raise CatalogError(f"{gpus_path}: duplicate GPU type {gpu.name!r}")
        types[gpu.name] = gpu
        if counts is not None:
            overrides[gpu.name] = counts

    loc_entry = Entry(read_yaml(locations_path), str(locations_path))
    locations: dict[str, Location] = {}
    for i, item in enumerate(loc_entry.items("locations")):
        loc = _location(item, f"{locations_path}: locations[{i}]")
        if loc.name in locations:
            raise CatalogError(f"{locations_path}: duplicate location {loc.name!r}")
        locations[loc.name] = loc
    return GpuCatalog(
        gpu_types=MappingProxyType(types),
        locations=MappingProxyType(locations),
        currency=loc_entry.text("currency"),
        allowed_counts=allowed,
        count_overrides=MappingProxyType(overrides),
    )
