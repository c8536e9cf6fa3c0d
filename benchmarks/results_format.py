"""The JSON every benchmark writes under `benchmarks/results/`, from which
`benchmarks/report.py` generates `benchmarks/RESULTS.md`.

A result file is one run of one benchmark. `common.write_report` fills in the
provenance (format, benchmark, command, commit, date, machine, load); the
benchmark supplies what it measured:

    {
      "format": 1,
      "benchmark": "fault_timings",            # the file name, benchmarks/results/<benchmark>.json
      "title": "Fault reaction times",         # the section heading in RESULTS.md
      "command": "python benchmarks/fault_timings.py --rounds 3",
      "commit": "2d2ceec...", "dirty": false,  # the tree the run measured
      "date": "2026-11-27T10:00:00+00:00",
      "machine": {"cpus": 2, "platform": ..., "gpu": ...},
      "load": {"start": [1.9, 2.1, 2.3], "end": [...]},   # os.getloadavg() at start and end
      "workload": "tiny-chat, 64 requests x 3 rounds",   # the load the tables ran under
      "tables": [{"title": ..., "columns": [...], "rows": [{column: value}, ...]}],
      "goals": [{"goal": ..., "target": "<= 2 s", "figure": 1.3, "status": "met", "why": ...}],
      "notes": ["a paragraph of Markdown", ...],
      ...                                       # anything else: raw figures, kept, not rendered
    }

Rules the report holds every file to (`problems()` lists what is wrong):
- every goal has a status: "met", "not met" or "not measured"; "not met" and
  "not measured" carry a `why`, and "not measured" has no figure. A goal a run
  could not measure is written as "not measured", never left out.
- a table's rows are objects keyed by its columns (a missing key shows "-").

Benchmarks that still write their own layout (no `tables` / `goals`) are
rendered by `report.py` from their top-level lists of objects; their goals
then read "not measured" with that reason, so nothing is claimed that the
file does not state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

FORMAT = 1

Status = Literal["met", "not met", "not measured"]
STATUSES: tuple[str, ...] = ("met", "not met", "not measured")


def table(title: str, columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One table of a result: `rows` keyed by `columns`, rendered in that order."""
    return {"title": title, "columns": list(columns), "rows": [dict(row) for row in rows]}


def goal(
    name: str,
    target: str,
    figure: float | str | None,
    met: bool | None,
    why: str = "",
) -> dict[str, Any]:
    """A goal and how the run judged it. `met=None` (or no figure) is "not
    measured", and `why` then says why there is no figure."""
    status: Status
    if figure is None or met is None:
        status = "not measured"
        figure = None
    else:
        status = "met" if met else "not met"
    return {"goal": name, "target": target, "figure": figure, "status": status, "why": why}


def not_measured(name: str, target: str, why: str) -> dict[str, Any]:
    return goal(name, target, None, None, why)


def all_met(goals: Sequence[Mapping[str, Any]]) -> bool:
    """True only when there are goals and every one was measured and met."""
    return bool(goals) and all(g["status"] == "met" for g in goals)


def problems(result: Mapping[str, Any]) -> list[str]:
    """What makes `result` not a valid result file (empty when it is one)."""
    found: list[str] = []
    for key in ("benchmark", "command", "commit", "date", "machine"):
        if not result.get(key):
            found.append(f"no {key!r}")
    for index, entry in enumerate(result.get("goals", [])):
        label = f"goal {index} ({entry.get('goal')!r})"
        status = entry.get("status")
        if status not in STATUSES:
            found.append(f"{label}: status {status!r} is not one of {STATUSES}")
        if status in ("not met", "not measured") and not entry.get("why"):
            found.append(f"{label}: {status!r} needs a 'why'")
        if status == "not measured" and entry.get("figure") is not None:
            found.append(f"{label}: 'not measured' with a figure")
        if status in ("met", "not met") and entry.get("figure") is None:
            found.append(f"{label}: {status!r} without a figure")
    for index, entry in enumerate(result.get("tables", [])):
        columns = entry.get("columns")
        if not columns or not isinstance(entry.get("rows"), list):
            found.append(f"table {index}: needs 'columns' and a list of 'rows'")
            continue
        for row in entry["rows"]:
            if not isinstance(row, dict):
                found.append(f"table {index}: a row is not an object")
                break
    return found
