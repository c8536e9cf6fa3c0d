"""Which CPU cores each CPU replica slot of this machine computes on.

vLLM's CPU engine binds its compute threads itself, and left to itself
(`VLLM_CPU_OMP_THREADS_BIND=auto`) every engine on a machine takes the same
cores: the first NUMA node's, less one it reserves. Two replicas of an
endpoint on one machine would then share cores while others idle, and
serve no faster than one. So each CPU slot gets its own share of the cores
this process may use, and a replica in that slot is told to bind there.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

# vLLM's own variable: a core list ("0-3", "0,2") for its one CPU rank.
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity: a container's or a
    `taskset`'s limit, not the machine's count)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def slot_cores(slot: int, slots: int, cores: Sequence[int]) -> list[int]:
    """The cores of slot `slot` of `slots`: an even, contiguous share (the
    first slots take one more when they do not divide), or one core each,
    shared round-robin, when there are more slots than cores."""
    if not cores or slots <= 0:
        return []
    if slots >= len(cores):
        return [cores[slot % len(cores)]]
    share, extra = divmod(len(cores), slots)
    start = slot * share + min(slot, extra)
    return list(cores[start : start + share + (1 if slot < extra else 0)])


def bind_environment(
    slot: int, slots: int, cores: Sequence[int], inherited: Mapping[str, str]
) -> dict[str, str]:
    """What a replica in `slot` adds to its environment: its cores for
    vLLM's binding, unless the operator set the binding themselves."""
    if BIND_ENV in inherited:
        return {}
    mine = slot_cores(slot, slots, cores)
    return {BIND_ENV: ",".join(str(c) for c in mine)} if mine else {}
