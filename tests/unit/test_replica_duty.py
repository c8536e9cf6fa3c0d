"""The leader's start-up duty: adopt what the store records, then remove
the cluster's replicas nobody recorded, but only while still leading."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from inferd.control.cluster.duties import LeaderDutySet, LeaderFlag, ReplicaDuty
from inferd.control.cluster.ports import Deposed
from inferd.control.cluster.solo import Solo
from inferd.control.fakes import FakeLauncher
from inferd.control.model import ReplicaRecord
from inferd.control.stores.memory import MemoryStore
from inferd.server.compose import build
from inferd.settings import load_settings


class SweepingLauncher(FakeLauncher):
    """A launcher whose cluster holds replicas `stray` the store never
    recorded (as a Ray cluster can)."""

    def __init__(self, stray: list[str]) -> None:
        super().__init__()
        self.stray = stray
        self.kept: set[str] = set()
        self.removed: list[str] = []

    async def sweep_orphans(
        self, keep: Iterable[str], confirm: Callable[[], Awaitable[None]] | None = None
    ) -> list[str]:
        self.kept = set(keep)
        for replica_id in [r for r in self.stray if r not in self.kept]:
            if confirm is not None:
                await confirm()
            self.removed.append(replica_id)
        return self.removed


class DeposedStore(MemoryStore):
    """A store shared with a successor that leads with term 8 now."""

    current = 7

    async def confirm_term(self, term: int) -> None:
        if term != self.current:
            raise Deposed(term, self.current)


def _duty(tmp_path: Path, store: MemoryStore, launcher: FakeLauncher) -> tuple[ReplicaDuty, object]:
    settings = load_settings(env={}, overrides={"state_dir": tmp_path, "admin_key": "k" * 24})
    server = asyncio.run(build(settings, store=store, launcher=launcher, run_replicas=False))
    duty = ReplicaDuty(
        store,
        server.registry,
        launcher,
        server.reconciler,
        server.endpoint_commands,
        server.meter_feed,
    )
    return duty, server


def test_the_leader_removes_unrecorded_replicas(tmp_path: Path) -> None:
    store, launcher = DeposedStore(), SweepingLauncher(["stray-1", "stray-2"])
    duty, server = _duty(tmp_path, store, launcher)

    async def run() -> None:
        await duty.start(7)
        await duty.stop()

    asyncio.run(run())
    assert launcher.removed == ["stray-1", "stray-2"]
    asyncio.run(server.close())  # type: ignore[attr-defined]


def test_a_deposed_leader_removes_nothing(tmp_path: Path) -> None:
    """Its successor may have placed those replicas a moment ago."""
    store, launcher = DeposedStore(), SweepingLauncher(["placed-by-successor"])
    store.current = 8
    duty, server = _duty(tmp_path, store, launcher)
    with pytest.raises(Deposed):
        asyncio.run(duty.start(7))
    assert launcher.removed == []
    asyncio.run(server.close())  # type: ignore[attr-defined]


class SuccessorRecordsMeanwhile(DeposedStore):
    """Between the duty's first read of the replicas and its sweep, another
    writer records a replica (a successor, had this instance lost the lead
    unnoticed): its actor must be kept whatever the term check says."""

    reads = 0

    async def list_replicas(self) -> list[ReplicaRecord]:
        self.reads += 1
        recorded = await super().list_replicas()
        if self.reads >= 2:
            at = datetime(2026, 11, 23, tzinfo=UTC)
            recorded.append(ReplicaRecord("late", "e1", 1, "cpu", 1, b"d", "starting", at, at))
        return recorded


def test_replicas_recorded_after_the_first_read_are_kept(tmp_path: Path) -> None:
    store, launcher = SuccessorRecordsMeanwhile(), SweepingLauncher(["late", "stray"])
    duty, server = _duty(tmp_path, store, launcher)

    async def run() -> None:
        await duty.start(7)
        await duty.stop()

    asyncio.run(run())
    assert "late" in launcher.kept and launcher.removed == ["stray"]
    asyncio.run(server.close())  # type: ignore[attr-defined]


def test_a_cluster_of_one_runs_the_duty_at_once_and_stops_it_on_leaving(tmp_path: Path) -> None:
    store, launcher = DeposedStore(), SweepingLauncher(["stray"])
    store.current = 0  # the term a cluster of one leads under
    duty, server = _duty(tmp_path, store, launcher)
    flag = LeaderFlag()
    solo = Solo("only", on_wake=lambda endpoint_id: None)

    async def run() -> None:
        await solo.start(LeaderDutySet([flag, duty]))
        assert flag.leading() and solo.term == 0
        assert server.reconciler.running() == []  # type: ignore[attr-defined]
        await solo.stop()
        assert not flag.leading() and solo.term is None

    asyncio.run(run())
    assert launcher.removed == ["stray"]
    asyncio.run(server.close())  # type: ignore[attr-defined]
