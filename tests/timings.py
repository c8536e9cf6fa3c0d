"""Timings that tests observe but do not judge.

A test asserts what must hold however slow the machine is (the stream ended
with an error event, the replica was ejected, the request was answered) and
waits with a generous bound that only catches a hang. How fast it happened is
a goal, and goals live in benchmarks: `benchmarks/fault_timings.py` runs these
tests on a quiet machine with `INFERD_TIMINGS_OUT` set and compares what they
recorded here with the goals it states.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Long enough that only a hang (not a busy two-core CI machine) reaches it.
HANG_S = 60.0


def record_timing(name: str, seconds: float) -> None:
    """Print `seconds` under `name` and, where the benchmark asks, append it to
    its JSON-lines file."""
    record_figure(name, seconds, "s")


def record_figure(name: str, value: float, unit: str) -> None:
    print(f"measured {name}: {value:.3f} {unit}")
    out = os.environ.get("INFERD_TIMINGS_OUT")
    if out:
        with Path(out).open("a") as file:
            line = {"name": name, "value": round(value, 4), "unit": unit}
            file.write(json.dumps(line) + "\n")
