"""A recommendation held to the machines the server places replicas on.

The recommender sizes every (location, GPU type, count) of the catalog as if
any number of replicas could run there. Where the server's launcher knows a
location's machines (this machine as `local`, a Ray cluster's nodes), an
option that needs more of a GPU type (or more CPU replica slots) than the
location holds in all cannot be served there: it moves to `rejected`,
saying what it needs and what there is. Locations the launcher does not know
(priced elsewhere) keep their options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CPU = "cpu"


def _need(option: Mapping[str, Any]) -> int:
    # A recommendation without a workload sizes one replica.
    replicas = option.get("replicas") or 1
    return int(replicas) * int(option["gpuCount"])


def _shortfall(option: Mapping[str, Any], have: int) -> str:
    location, gpu_type = option["location"], option["gpuType"]
    replicas = option.get("replicas") or 1
    # Sized from a measurement: say so, as the options' basis does.
    basis = option.get("basis") or ""
    measured = f" ({basis})" if basis.startswith("measured") else ""
    if gpu_type == CPU:
        return (
            f"needs {replicas} CPU replica(s){measured}; the machines of {location} run "
            f"{have} (cpu_replica_slots)"
        )
    return (
        f"needs {_need(option)} {gpu_type} GPU(s) ({replicas} replica(s) x "
        f"{option['gpuCount']}){measured}; the machines of {location} have {have}"
    )


def within_capacity(
    answer: dict[str, Any], totals: Mapping[tuple[str, str], int]
) -> dict[str, Any]:
    """`answer` (a recommendation as the API gives it) with the options that
    need more than `totals` (location, GPU type -> placement units in all)
    holds moved to its rejected ones; `best` follows (the first option)."""
    known = {location for location, _ in totals}
    kept: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for option in answer["options"]:
        location = option["location"]
        have = totals.get((location, option["gpuType"]), 0)
        if location not in known or _need(option) <= have:
            kept.append(option)
            continue
        moved = {**option, "reasons": [_shortfall(option, have)]}
        if "fits" in moved:
            moved["fits"] = False
        refused.append(moved)
    if not refused:
        return answer
    held = {**answer, "options": kept, "rejected": [*refused, *answer["rejected"]]}
    if "best" in answer:
        held["best"] = kept[0] if kept else None
    return held
