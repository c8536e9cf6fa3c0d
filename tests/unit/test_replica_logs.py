"""A replica's log, read by its launcher: the end of it, from a line start;
nothing when there is no file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from inferd.control.launchers.local import LocalLauncher
from inferd.control.launchers.logs import log_name, read_tail
from inferd.replica.config import ReplicaSettings


def test_the_tail_starts_at_a_line_and_a_missing_file_is_none(tmp_path: Path) -> None:
    path = tmp_path / log_name("r-1")
    assert read_tail(path, 100) is None
    path.write_text("first line\nsecond line\nthird\n")
    assert read_tail(path, 1000) == "first line\nsecond line\nthird\n"
    assert read_tail(path, 15) == "third\n"  # the cut line is dropped


def test_the_local_launcher_reads_the_file_it_writes(tmp_path: Path) -> None:
    launcher = LocalLauncher(
        settings=ReplicaSettings(registry_url="http://127.0.0.1:9/internal/registry"),
        log_dir=tmp_path,
    )
    (tmp_path / log_name("r-2")).write_text("loading\nreplica ready\n")
    assert asyncio.run(launcher.log_tail("r-2", 1000)) == "loading\nreplica ready\n"
    assert asyncio.run(launcher.log_tail("r-3", 1000)) is None
