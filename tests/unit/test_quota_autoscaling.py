"""Autoscaling stops at the project's quota (reconciler with fakes, clock
injected), the reason is what the endpoint status shows, and raising the
quota lets it grow again."""

from __future__ import annotations

from typing import Any

import pytest

from inferd.control.accounts.model import utc_now
from inferd.control.accounts.plane import ProjectQuotaCap
from inferd.control.accounts.principals import PrincipalResolver
from inferd.control.accounts.quota import Quota
from inferd.control.accounts.service import AccountService
from inferd.control.endpoints.records import ReplicaView, derive_status
from inferd.control.stores.memory import MemoryStore
from tests.unit.test_reconciler import World, endpoint

pytestmark = pytest.mark.anyio


async def capped_world(quota: Quota, **row: Any) -> tuple[World, AccountService]:
    w = await World(endpoint(**row)).open()
    store = MemoryStore()
    accounts = AccountService(store, PrincipalResolver(store, lambda key: False), utc_now)
    accounts.quotas["default"] = quota
    w.reconciler.replica_cap = ProjectQuotaCap(accounts, w.registry)
    return w, accounts


async def test_scale_up_stops_at_the_replica_quota() -> None:
    w, accounts = await capped_world(Quota(replicas=2), min_replicas=1, max_replicas=3)
    await w.tick()
    w.report_all()
    w.traffic.set("e1", in_flight=12, last_request_at=0.0)  # the autoscaler wants 3
    await w.tick(1)
    await w.tick(2)
    w.report_all()
    await w.tick(1)
    assert len(w.live()) == 2  # exactly at the quota, not one over
    reason = w.reconciler.capacity_reason("e1")
    assert reason is not None and "quota 'replicas'" in reason and "limit 2" in reason
    views = [ReplicaView(gpus=1, status=r.status) for r in w.registry.of_endpoint("e1")]
    derived = derive_status(w.rows[0], views, reason)
    assert derived.status.value == "running" and derived.reason == reason
    # Raised quota: the third replica comes.
    accounts.quotas["default"] = Quota(replicas=3)
    await w.tick(1)
    assert len(w.live()) == 3
    assert w.reconciler.capacity_reason("e1") is None


async def test_other_endpoints_of_the_project_use_the_quota_up() -> None:
    w, _ = await capped_world(Quota(replicas=2), min_replicas=0, max_replicas=3)
    other = endpoint(id="e2", name="other", min_replicas=1, max_replicas=1)
    w.rows.append(other)
    await w.records.insert_endpoint(other, b"o" * 32)
    await w.tick()
    w.report_all()
    w.traffic.set("e1", held=1, in_flight=8, last_request_at=0.0)
    await w.tick(1)
    await w.tick(2)
    assert len(w.live()) == 1  # e2 holds one of the two
    assert "in use 2" in (w.reconciler.capacity_reason("e1") or "")


async def test_gpu_quota_caps_by_type() -> None:
    w, _ = await capped_world(Quota(gpus={"cpu": 2}), min_replicas=1, max_replicas=4, gpu_count=1)
    await w.tick()
    w.report_all()
    w.traffic.set("e1", in_flight=16, last_request_at=0.0)
    await w.tick(1)
    await w.tick(2)
    assert len(w.live()) == 2
    assert "gpus:cpu" in (w.reconciler.capacity_reason("e1") or "")


async def test_another_projects_quota_does_not_apply() -> None:
    w, accounts = await capped_world(Quota(), min_replicas=1, max_replicas=3)
    accounts.quotas["elsewhere"] = Quota(replicas=0)
    await w.tick()
    w.report_all()
    w.traffic.set("e1", in_flight=12, last_request_at=0.0)
    await w.tick(1)
    await w.tick(2)
    assert len(w.live()) == 3
