"""A batch's `capacity` setting: `wake` (the default) lets it wake its
endpoint and keep a replica up, as any request; `running` uses only
replicas up for other reasons. Checked with fakes: the field through the
API (memory store), the runner holding a `running` batch's requests while
no replica is ready, and the gateway leaving its requests out of what the
autoscaler reads (no wake, no load, no activity)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from inferd.control.batches.model import Batch, BatchStatus, Capacity, Counts
from inferd.control.batches.runner import Answer
from inferd.control.batches.service import BatchService
from inferd.control.endpoints.tokens import TokenVerifier, hash_token, new_endpoint_token
from inferd.control.replicas.autoscaler import Observations, ScalerState, ScalingSettings, decide
from inferd.control.replicas.load import MergedLoad, ReplicaCount
from inferd.control.stores.memory import MemoryStore
from inferd.errors import ServiceUnavailable
from inferd.gateway.app import Gateway
from inferd.gateway.caller import InProcessCaller
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.hold import Dispatcher
from inferd.gateway.inprocess import InProcessGrant
from inferd.gateway.settings import GatewaySettings
from inferd.gateway.static import StaticDirectory
from inferd.gateway.traffic import EndpointTraffic, TrafficSnapshot
from inferd.http_errors import EXCEPTION_HANDLERS
from inferd.server.batch_executor import GatewayExecutor
from inferd.server.batch_routes import BatchRoutes
from tests.records import T0, endpoint_row
from tests.unit.test_batches import SETTINGS, FakeExecutor, World, final


async def soon(check: Callable[[], bool], within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not check():
        if loop.time() > deadline:
            raise AssertionError("never happened")
        await asyncio.sleep(0.001)


CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
R = RoutableReplica("r", "http://r")
NONE: frozenset[str] = frozenset()

# --- the field through the API ------------------------------------------------------------


def test_capacity_round_trips_through_the_api_and_a_bad_value_is_a_400() -> None:
    store = MemoryStore()
    row = endpoint_row(1)
    token = new_endpoint_token()
    verifier = TokenVerifier(store)
    verifier.set_active(row.id, hash_token(token))
    service = BatchService(store, {row.id: row}.get, SETTINGS, lambda: T0)
    app = Starlette(
        routes=BatchRoutes(service, verifier, lambda: T0, 1 << 20).routes(),
        exception_handlers=EXCEPTION_HANDLERS,
    )
    base = f"/endpoints/{row.id}/openai/v1"
    headers = {"Authorization": f"Bearer {token}"}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}

    async def scenario() -> None:
        await store.insert_endpoint(row, bytes(32))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            up = await client.post(
                f"{base}/files",
                files={"file": ("in.jsonl", (json.dumps(line) + "\n").encode())},
                data={"purpose": "batch"},
                headers=headers,
            )
            assert up.status_code == 200, up.text

            async def create(**extra: Any) -> httpx.Response:
                body = {"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions",
                        "completion_window": "24h", **extra}  # fmt: skip
                return await client.post(f"{base}/batches", json=body, headers=headers)

            default, running, null = (
                await create(),
                await create(capacity="running"),
                await create(capacity=None),
            )
            assert [r.json()["capacity"] for r in (default, running, null)] == [
                "wake", "running", "wake",
            ]  # fmt: skip
            got = await client.get(f"{base}/batches/{running.json()['id']}", headers=headers)
            assert got.json()["capacity"] == "running"
            stored = await store.get_batch(running.json()["id"])
            assert stored is not None and stored.capacity is Capacity.RUNNING
            listed = await client.get(f"{base}/batches", headers=headers)
            assert {b["capacity"] for b in listed.json()["data"]} == {"wake", "running"}
            for bad in ("sleep", "", "RUNNING", 1, ["wake"]):
                refused = await create(capacity=bad)
                assert refused.status_code == 400, bad
                assert refused.json()["error"]["param"] == "capacity"
            assert len(await store.list_batches(row.id, None, 100)) == 3
        await store.close()

    asyncio.run(scenario())


# --- the runner: a `running` batch waits for a ready replica -----------------------------


class Readiness(FakeExecutor):
    """`FakeExecutor` whose endpoint is ready or not as the test says;
    counts how often the runner asked."""

    def __init__(self, ready: bool) -> None:
        super().__init__()
        self.ready = asyncio.Event()
        if ready:
            self.ready.set()
        self.asked = 0

    async def wait_ready(self, batch: Batch, timeout: float) -> bool:
        self.asked += 1
        if not self.ready.is_set():
            await asyncio.sleep(min(timeout, 0.001))
        return self.ready.is_set()


async def _running_batch(world: World, n: int, capacity: Capacity = Capacity.RUNNING) -> Batch:
    ep = await world.endpoint()
    file = await world.service.upload(ep.id, "in.jsonl", "batch", _jsonl(n))
    return await world.service.create(
        ep.id, file.id, "/v1/chat/completions", "24h", {}, capacity=capacity
    )


def _jsonl(n: int) -> bytes:
    rows = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "tiny-chat", "user": f"c{i}", "messages": []}}
            for i in range(n)]  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_a_running_batch_sends_nothing_until_a_replica_is_ready() -> None:
    async def scenario() -> None:
        world = World()
        created = await _running_batch(world, 3)
        executor = Readiness(ready=False)
        runner = world.runner(executor)
        await runner.start(1)
        await soon(lambda: executor.asked >= 20)  # the runner looked, many times, and waited
        assert executor.calls == []
        waiting = await world.store.get_batch(created.id)
        assert waiting is not None and waiting.status is BatchStatus.IN_PROGRESS
        assert waiting.counts == Counts(3, 0, 0)
        executor.ready.set()  # a replica is up, for other reasons
        done = await final(world, created.id)
        await runner.stop()
        assert done.status is BatchStatus.COMPLETED and done.counts == Counts(3, 3, 0)
        assert sorted(executor.calls) == ["c0", "c1", "c2"]

    asyncio.run(scenario())


def test_a_wake_batch_does_not_wait_for_a_ready_replica() -> None:
    async def scenario() -> None:
        world = World()
        created = await _running_batch(world, 2, Capacity.WAKE)
        executor = Readiness(ready=False)
        runner = world.runner(executor)
        await runner.start(1)
        done = await final(world, created.id)
        await runner.stop()
        assert done.status is BatchStatus.COMPLETED and executor.asked == 0

    asyncio.run(scenario())


def test_a_running_batch_with_no_replica_up_expires_at_its_window() -> None:
    async def scenario() -> None:
        world = World()
        created = await _running_batch(world, 2)
        executor = Readiness(ready=False)
        runner = world.runner(executor)
        await runner.start(1)
        await soon(lambda: executor.asked >= 5)
        world.clock.now = created.expires_at
        done = await final(world, created.id)
        await runner.stop()
        assert done.status is BatchStatus.EXPIRED and executor.calls == []
        errors = await world.output(created.endpoint_id, done.error_file_id)
        assert [e["error"]["code"] for e in errors] == ["batch_expired"] * 2

    asyncio.run(scenario())


class ScaledDownMidRequest(Readiness):
    """The first request is cut off (502) as its replica goes: the endpoint
    scaled to zero under the batch."""

    async def run(self, batch: Batch, idx: int, body: bytes) -> Answer:
        if not self.calls:
            self.calls.append(json.loads(body)["user"])
            self.ready.clear()
            return Answer(502, b'{"error": {"message": "replica went away"}}')
        return await super().run(batch, idx, body)


def test_a_request_cut_off_by_a_scale_down_runs_again_when_a_replica_is_up() -> None:
    """Not counted as one of its attempts (one here): it was not its failure."""

    async def scenario() -> None:
        world = World(replace(SETTINGS, max_attempts=1, concurrency=1))
        created = await _running_batch(world, 1)
        executor = ScaledDownMidRequest(ready=True)
        runner = world.runner(executor)
        await runner.start(1)
        await soon(lambda: bool(executor.calls))
        asked = executor.asked
        await soon(lambda: executor.asked >= asked + 5)  # waiting for a replica, not failing
        executor.ready.set()
        done = await final(world, created.id)
        await runner.stop()
        assert done.counts == Counts(1, 1, 0) and executor.calls == ["c0", "c0"]

    asyncio.run(scenario())


# --- the gateway: no wake, no load, no activity ------------------------------------------


class Replica:
    """Answers when the test opens `gate`; counts calls."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.calls = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        await self.gate.wait()
        usage = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}'
        return httpx.Response(
            200, headers={"content-type": "application/json"}, stream=httpx.ByteStream(usage)
        )


def _gateway(ready: bool) -> tuple[Gateway, StaticDirectory, Replica]:
    directory = StaticDirectory()
    directory.add_endpoint(EndpointRoute("ep", "chat", "m"), [R] if ready else [])
    verifier = TokenVerifier(MemoryStore())
    verifier.set_active("ep", hash_token(new_endpoint_token()))
    replica = Replica()
    gateway = Gateway(
        directory,
        verifier,
        upstream=httpx.AsyncClient(transport=httpx.MockTransport(replica)),
        signals=directory,
    )
    return gateway, directory, replica


def test_a_background_request_never_wakes_the_endpoint() -> None:
    async def scenario() -> None:
        gateway, directory, replica = _gateway(ready=False)
        caller = InProcessCaller(gateway)
        grant = InProcessGrant("ep", "batch_1", background=True)
        reply = await asyncio.wait_for(caller.post(grant, "/v1/chat/completions", CHAT, "x"), 2)
        assert reply.status == 503
        assert json.loads(reply.body)["error"]["code"] == "no_ready_replica"
        assert directory.capacity_requests == [] and replica.calls == 0
        assert gateway.state.book.endpoint("ep").refused == {"no_ready_replica": 1}
        traffic = gateway.traffic("ep")
        assert (traffic.held, traffic.in_flight, traffic.last_request_at) == (0, 0, None)
        # A `wake` batch's request, the same otherwise, asks for a replica.
        held = asyncio.ensure_future(
            caller.post(InProcessGrant("ep", "batch_2"), "/v1/chat/completions", CHAT, "y")
        )
        await soon(lambda: bool(directory.capacity_requests))
        assert gateway.traffic("ep").held == 1
        held.cancel()
        await gateway.shutdown()

    asyncio.run(scenario())


def test_background_requests_in_flight_are_no_load_and_no_activity() -> None:
    async def scenario() -> None:
        gateway, _, replica = _gateway(ready=True)
        caller = InProcessCaller(gateway)
        grant = InProcessGrant("ep", "batch_1", background=True)
        running = asyncio.ensure_future(caller.post(grant, "/v1/chat/completions", CHAT, "x"))
        await soon(lambda: replica.calls >= 1)
        traffic = gateway.traffic("ep")
        # The replica's slot is counted (routing and the replica's own
        # report go by it); the autoscaler's load and activity are not.
        assert dict(traffic.in_flight_by_replica) == {"r": 1}
        assert (traffic.in_flight, traffic.held, traffic.last_request_at) == (0, 0, None)
        replica.gate.set()
        assert (await running).status == 200
        assert gateway.traffic("ep").last_request_at is None
        wake = await caller.post(InProcessGrant("ep", "b2"), "/v1/chat/completions", CHAT, "y")
        assert wake.status == 200 and gateway.traffic("ep").last_request_at is not None
        await gateway.shutdown()

    asyncio.run(scenario())


def test_a_background_request_waiting_for_a_slot_is_not_held_load_and_ends_with_the_replicas() -> (
    None
):
    async def scenario() -> None:
        directory = StaticDirectory()
        directory.add_endpoint(EndpointRoute("ep", "chat", "m"), [R])
        settings = GatewaySettings(max_in_flight_per_replica=1, hold_poll_seconds=0.01)
        dispatcher = Dispatcher(directory, settings, lambda: 0.0, directory)
        ep = EndpointTraffic("ep", 8)
        busy = await dispatcher.acquire(ep, NONE, 60.0)
        claim = dispatcher.claim(ep, "", 1.0, True, 40, background=True)
        waiting = asyncio.ensure_future(dispatcher.acquire(ep, NONE, 60.0, claim=claim))
        await asyncio.sleep(0.01)
        assert ep.held == 1 and ep.snapshot().held == 0 and ep.snapshot().in_flight == 1
        # The endpoint scales down under it: refused, and no capacity asked for.
        directory.set_ready("ep", [])
        with pytest.raises(ServiceUnavailable, match="does not wake"):
            await asyncio.wait_for(waiting, 2)
        assert directory.capacity_requests == [] and ep.held == ep.background_held == 0
        dispatcher.release(ep, busy.replica_id)
        assert ep.in_flight_total == ep.background_in_flight == 0
        await dispatcher.close()

    asyncio.run(scenario())


class Local:
    def __init__(self, ep: EndpointTraffic) -> None:
        self.ep = ep

    def traffic(self, endpoint_id: str) -> TrafficSnapshot:
        return self.ep.snapshot()


class Reports:
    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def reported_in_flight(self, endpoint_id: str) -> list[ReplicaCount]:
        return [ReplicaCount(rid, n) for rid, n in self.counts.items()]


def test_the_autoscaler_lets_an_endpoint_with_only_background_work_go_to_zero() -> None:
    """The replica reports the background request it serves (it sees every
    request); the merge takes it as the gateway's own, not as more load."""
    ep = EndpointTraffic("ep", 8)
    ep.arrived(10.0)  # the last interactive request
    ep.ended(11.0)
    ep.arrived(50.0, background=True)
    ep.reserve("r", background=True)
    load = MergedLoad(Local(ep), Reports({"r": 1}), clock=lambda: 500.0).load("ep")
    assert (load.in_flight, load.held, load.last_request_at) == (0, 0, 11.0)
    assert dict(load.in_flight_by_replica) == {"r": 1}  # what the drain and victims see
    scaling = ScalingSettings(min_replicas=0, max_replicas=2, retention_s=300)
    obs = Observations(load.in_flight, load.held, 1, 0, load.last_request_at)
    assert decide(scaling, obs, ScalerState(1), 500.0).desired == 0
    # An interactive request the replica serves from another gateway is load.
    more = MergedLoad(Local(ep), Reports({"r": 2}), clock=lambda: 500.0).load("ep")
    assert more.in_flight == 1


def test_the_gateway_executor_runs_a_running_batch_as_background_work() -> None:
    async def scenario() -> None:
        gateway, directory, replica = _gateway(ready=False)
        executor = GatewayExecutor(InProcessCaller(gateway))
        running = Batch("batch_1", "ep", "p", "/v1/chat/completions", "file-1",
                        BatchStatus.IN_PROGRESS, T0, T0, capacity=Capacity.RUNNING)  # fmt: skip
        assert await executor.wait_ready(running, 0.0) is False
        answer = await executor.run(running, 0, CHAT)
        assert answer.status == 503 and directory.capacity_requests == []
        directory.set_ready("ep", [R])
        assert await executor.wait_ready(running, 0.0) is True
        replica.gate.set()
        assert (await executor.run(running, 1, CHAT)).status == 200
        assert gateway.traffic("ep").last_request_at is None and replica.calls == 1
        await gateway.shutdown()

    asyncio.run(scenario())
