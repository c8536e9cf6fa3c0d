"""Batch work takes only what interactive traffic leaves: a batch-priority
request goes to a replica only while that keeps the slots reserved for
interactive requests free (`batch_reserved_share`), and waits otherwise; an
interactive request goes up to the replica's whole bound. As tables over
the pure rule, then with the dispatcher (fake directory, no replica) and the
batch runner (fake executor): a busy batch request waits, never fails."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from inferd.control.batches.model import BatchStatus, Counts
from inferd.gateway.directory import EndpointRoute, RoutableReplica
from inferd.gateway.fairness import Claim
from inferd.gateway.hold import Dispatcher, plan_release
from inferd.gateway.settings import GatewaySettings, batch_slots
from inferd.gateway.static import StaticDirectory
from inferd.gateway.traffic import EndpointTraffic
from tests.unit.test_batches import SETTINGS, FakeExecutor, World, final

NONE: frozenset[str] = frozenset()
R = RoutableReplica("r", "http://127.0.0.1:1")
CHAT, BATCH = Claim("a", 1.0, False, 10), Claim("x", 1.0, True, 10)

SLOTS = [
    # (max in flight, reserved share, slots a batch may fill)
    (128, 0.25, 96),
    (4, 0.25, 3),
    (4, 0.5, 2),
    (8, 0.01, 7),  # a share above 0 keeps one slot at least
    (4, 0.0, 4),  # 0: batch requests may fill every slot
    (1, 0.25, 1),  # a replica of one slot still runs the batch
    (2, 0.9, 1),
]


@pytest.mark.parametrize(("cap", "share", "slots"), SLOTS)
def test_slots_a_batch_may_fill(cap: int, share: float, slots: int) -> None:
    assert batch_slots(cap, share) == slots
    settings = GatewaySettings(max_in_flight_per_replica=cap, batch_reserved_share=share)
    assert settings.batch_in_flight_per_replica == slots


@pytest.mark.parametrize("share", [-0.1, 1.0, 2.0])
def test_a_share_outside_0_to_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="batch_reserved_share"):
        GatewaySettings(batch_reserved_share=share)


RELEASE = [
    # (name, claims in queue order, in flight on the replica, placed)
    ("a batch request fills up to the batch bound only", [BATCH] * 3, 1, [0, 1]),
    ("at the batch bound a batch request waits", [BATCH], 3, []),
    ("an interactive request takes a reserved slot", [CHAT], 3, [0]),
    ("interactive first, then batch while the reserve stays free",
     [BATCH, CHAT, BATCH], 1, [1, 0]),
    ("the replica full: nobody goes", [CHAT, BATCH], 4, []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("claims", "busy", "placed"), [c[1:] for c in RELEASE], ids=[c[0] for c in RELEASE]
)
def test_release_keeps_the_reserve_free_of_batch_work(
    claims: list[Claim], busy: int, placed: list[int]
) -> None:
    placements, _ = plan_release(
        [NONE] * len(claims), [R], {"r": busy}, max_in_flight=4, batch_max_in_flight=3,
        turn=0, claims=claims,
    )  # fmt: skip
    assert [p.index for p in placements] == placed


def test_the_dispatcher_holds_batch_work_out_of_the_reserved_slot() -> None:
    async def scenario() -> None:
        directory = StaticDirectory()
        directory.add_endpoint(EndpointRoute("ep", "chat", "m"), [R])
        settings = GatewaySettings(max_in_flight_per_replica=4, batch_reserved_share=0.25)
        dispatcher = Dispatcher(directory, settings, lambda: 0.0, directory)
        ep = EndpointTraffic("ep", 8)

        def claim(is_batch: bool) -> Claim:
            return dispatcher.claim(ep, "x" if is_batch else "a", 1.0, is_batch, 40)

        # Three batch requests go at once; the fourth waits with a slot free.
        batch_slots_taken = [await dispatcher.acquire(ep, NONE, 60.0, claim=claim(True))
                             for _ in range(3)]  # fmt: skip
        fourth = asyncio.ensure_future(dispatcher.acquire(ep, NONE, 60.0, claim=claim(True)))
        await asyncio.sleep(0.01)
        assert not fourth.done() and dispatcher.held("ep") == 1 and ep.in_flight_total == 3
        # An interactive request takes the reserved slot at once.
        chat = await asyncio.wait_for(dispatcher.acquire(ep, NONE, 60.0, claim=claim(False)), 1)
        assert ep.in_flight_total == 4
        # The interactive one ends: its slot is kept free of the batch.
        dispatcher.release(ep, chat.replica_id)
        await asyncio.sleep(0.01)
        assert not fourth.done() and ep.in_flight_total == 3
        # A batch request ends: the waiting one takes its slot.
        dispatcher.release(ep, batch_slots_taken[0].replica_id)
        assert (await asyncio.wait_for(fourth, 1)).replica_id == "r"
        assert ep.in_flight_total == 3 and dispatcher.held("ep") == 0
        await dispatcher.close()

    asyncio.run(scenario())


def test_a_busy_batch_request_waits_past_its_attempts_and_is_never_failed() -> None:
    """429 (the endpoint busy, or its client's rate limit) is tried again
    for as long as the window lasts; other failures `max_attempts` times."""

    async def scenario() -> None:
        world = World(replace(SETTINGS, max_attempts=2))
        ep = await world.endpoint()
        created = await world.batch(ep, 2)
        executor = FakeExecutor()
        executor.answers = {"c0": [429] * 7, "c1": [503, 503, 200]}
        runner = world.runner(executor)
        await runner.start(1)
        batch = await final(world, created.id)
        await runner.stop()
        assert batch.status is BatchStatus.COMPLETED and batch.counts == Counts(2, 1, 1)
        assert executor.calls.count("c0") == 8  # 7 busy answers, then its 200
        assert executor.calls.count("c1") == 2  # two failures: its attempts are spent
        errors = await world.output(ep.id, batch.error_file_id)
        assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("c1", 503)]

    asyncio.run(scenario())
