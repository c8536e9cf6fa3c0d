"""A recommendation held to the machines the server places replicas on.

The recommender sizes every (location, GPU type, count) of the catalog as if
any number of replicas could run there. Where the server's launcher knows a
location's machines (this machine as `local`, a Ray cluster's nodes), an
option that needs more of a GPU type (or more CPU replica slots) than the
location holds in all cannot be served there: it moves to `rejected`,
saying what it needs and what there is. Locations the launcher does not know
(priced elsewhere) keep their options."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferd.catalog.recommend import Recommendation
from inferd.catalog.workload import WorkloadRecommendation

CPU = "cpu"
# (location, GPU type) -> placement units there in all (CPU replica slots or GPUs).
Totals = Mapping[tuple[str, str], int]
# As the recommender returns it: without a workload, or sized for one.
AnyRecommendation = Recommendation | WorkloadRecommendation


@dataclass(frozen=True)
class _Shape:
    """What an option asks of a location, in either form (API or typed)."""

    location: str
    gpu_type: str
    gpu_count: int
    replicas: int  # a recommendation without a workload sizes one replica
    basis: str = ""

    @property
    def need(self) -> int:
        return self.replicas * self.gpu_count

    def shortfall(self, have: int) -> str:
        # Sized from a measurement: say so, as the options' basis does.
        measured = f" ({self.basis})" if self.basis.startswith("measured") else ""
        if self.gpu_type == CPU:
            return (
                f"needs {self.replicas} CPU replica(s){measured}; the machines of "
                f"{self.location} run {have} (cpu_replica_slots)"
            )
        return (
            f"needs {self.need} {self.gpu_type} GPU(s) ({self.replicas} replica(s) x "
            f"{self.gpu_count}){measured}; the machines of {self.location} have {have}"
        )


def _beyond(shape: _Shape, totals: Totals) -> str | None:
    """Why an option cannot be served where the launcher knows the
    location's machines; None where it can, or where the location's
    machines are not known."""
    if not any(location == shape.location for location, _ in totals):
        return None
    have = totals.get((shape.location, shape.gpu_type), 0)
    return None if shape.need <= have else shape.shortfall(have)


def within_capacity(answer: dict[str, Any], totals: Totals) -> dict[str, Any]:
    """`answer` (a recommendation as the API gives it) with the options that
    need more than `totals` (location, GPU type -> placement units in all)
    holds moved to its rejected ones; `best` follows (the first option)."""
    kept: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for option in answer["options"]:
        shape = _Shape(
            option["location"],
            option["gpuType"],
            int(option["gpuCount"]),
            int(option.get("replicas") or 1),
            option.get("basis") or "",
        )
        why = _beyond(shape, totals)
        if why is None:
            kept.append(option)
            continue
        moved = {**option, "reasons": [why]}
        if "fits" in moved:
            moved["fits"] = False
        refused.append(moved)
    if not refused:
        return answer
    held = {**answer, "options": kept, "rejected": [*refused, *answer["rejected"]]}
    if "best" in answer:
        held["best"] = kept[0] if kept else None
    return held


def held_to_capacity(rec: AnyRecommendation, totals: Totals) -> AnyRecommendation:
    """`within_capacity` for a recommendation as the recommender returns it
    (the console's tables read these): the options beyond `totals` move to
    `rejected`, first, with the shortfall as their reason."""
    # GpuOption or WorkloadOption, as `rec` holds.
    kept: list[Any] = []
    refused: list[Any] = []
    for option in rec.options:
        shape = _Shape(
            option.location,
            option.gpu_type,
            option.gpu_count,
            getattr(option, "replicas", 0) or 1,
            getattr(option, "basis", ""),
        )
        why = _beyond(shape, totals)
        if why is None:
            kept.append(option)
        else:
            refused.append(dataclasses.replace(option, fits=False, reasons=(why,)))
    if not refused:
        return rec
    options, rejected = tuple(kept), (*refused, *rec.rejected)
    # The same call for each type: mypy types `replace` over one dataclass, not a union.
    if isinstance(rec, Recommendation):
        return dataclasses.replace(rec, options=options, rejected=rejected)
    return dataclasses.replace(rec, options=options, rejected=rejected)
