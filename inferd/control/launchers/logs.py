"""A replica's log file, where its launcher runs it: one name, one reader,
for the local launcher and the Ray actor that hosts a replica on its node."""

from __future__ import annotations

from pathlib import Path


def log_name(replica_id: str) -> str:
    return f"replica-{replica_id}.log"


def read_tail(path: Path, max_bytes: int) -> str | None:
    """The last `max_bytes` of the file, from a line start; None when there
    is no such file."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return None
    text = data.decode("utf-8", errors="replace")
    return text if size <= max_bytes else text.split("\n", 1)[-1]
