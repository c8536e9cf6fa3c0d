"""The Batch API's service and the leader's runner, on the memory store with
a fake executor in place of the gateway: the state machine, results
recorded once each, resuming after the leader changes, cancel and expiry,
quotas, and what another endpoint's token sees."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from inferd.api.replica import ReplicaUsageReport
from inferd.control.accounts.meter_feed import counters_of
from inferd.control.accounts.metering import LiveReplica, UsageMeter
from inferd.control.batches.model import (
    STAMPS,
    WINDOW,
    Batch,
    BatchSettings,
    BatchStatus,
    Counts,
    RequestState,
    estimate,
    may_move,
)
from inferd.control.batches.runner import Answer, BatchRunner, usage_of
from inferd.control.batches.service import BatchService
from inferd.control.model import Endpoint
from inferd.control.stores.memory import MemoryStore
from inferd.errors import BadRequest, Conflict, NotFound, PayloadTooLarge
from tests.records import T0, endpoint_row

SETTINGS = BatchSettings(
    concurrency=3, poll_seconds=0.01, retry_seconds=0.0, price_per_million_tokens=2.0
)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


class FakeExecutor:
    """Answers each request after `delay`; records every call; `answers`
    maps a custom id (the request body's `user`) to the statuses it answers
    in turn (200 past the list)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[str] = []
        self.answers: dict[str, list[int]] = {}
        self.codes: dict[int, str] = {}  # an error status's `error.code`
        self.gate: asyncio.Event | None = None
        self.ready = True  # whether the endpoint has a ready replica

    async def run(self, batch: Batch, idx: int, body: bytes) -> Answer:
        who = json.loads(body)["user"]
        self.calls.append(who)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        statuses = self.answers.get(who, [])
        status = statuses.pop(0) if statuses else 200
        if status != 200:
            error = {"message": "no", "code": self.codes.get(status)}
            return Answer(status, json.dumps({"error": error}).encode(), f"id-{who}")
        usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
        return Answer(200, json.dumps({"echo": who, "usage": usage}).encode(), f"id-{who}")

    async def wait_ready(self, batch: Batch, timeout: float) -> bool:
        return self.ready


def jsonl(n: int, url: str = "/v1/chat/completions") -> bytes:
    rows = [
        {"custom_id": f"c{i}", "method": "POST", "url": url,
         "body": {"model": "tiny-chat", "user": f"c{i}", "messages": []}}
        for i in range(n)
    ]  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


class World:
    def __init__(self, settings: BatchSettings = SETTINGS) -> None:
        self.store = MemoryStore()
        self.clock = Clock()
        self.endpoints: dict[str, Endpoint] = {}
        self.settings = settings
        self.service = BatchService(self.store, self.endpoints.get, settings, self.clock)

    async def endpoint(self, n: int = 1, **changes: Any) -> Endpoint:
        row = endpoint_row(n, **changes)
        await self.store.insert_endpoint(row, bytes([n]) * 32)
        self.endpoints[row.id] = row
        return row

    def runner(self, executor: FakeExecutor) -> BatchRunner:
        return BatchRunner(self.store, executor, self.settings, self.clock, sleep=_no_sleep)

    async def batch(self, endpoint: Endpoint, n: int) -> Batch:
        file = await self.service.upload(endpoint.id, "in.jsonl", "batch", jsonl(n))
        return await self.service.create(endpoint.id, file.id, "/v1/chat/completions", "24h", {})

    async def output(self, endpoint_id: str, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        _, chunks = await self.service.content(endpoint_id, file_id)
        text = b"".join([c async for c in chunks]).decode()
        return [json.loads(x) for x in text.splitlines()]


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


async def until(condition: Callable[[], Any], within_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.005)


async def final(world: World, batch_id: str) -> Batch:
    async def done() -> bool:
        got = await world.store.get_batch(batch_id)
        return got is not None and got.status.final

    await until(done)
    got = await world.store.get_batch(batch_id)
    assert got is not None
    return got


# --- the state machine and the estimate ----------------------------------------------


@pytest.mark.parametrize(
    ("current", "to", "allowed"),
    [
        (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, True),
        (BatchStatus.VALIDATING, BatchStatus.CANCELLING, True),
        (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING, True),
        (BatchStatus.IN_PROGRESS, BatchStatus.EXPIRED, True),
        (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING, True),
        (BatchStatus.FINALIZING, BatchStatus.COMPLETED, True),
        (BatchStatus.CANCELLING, BatchStatus.CANCELLED, True),
        (BatchStatus.IN_PROGRESS, BatchStatus.COMPLETED, False),  # finalizing first
        (BatchStatus.FINALIZING, BatchStatus.CANCELLING, False),  # too late to cancel
        (BatchStatus.COMPLETED, BatchStatus.IN_PROGRESS, False),
        (BatchStatus.CANCELLED, BatchStatus.CANCELLING, False),
        (BatchStatus.EXPIRED, BatchStatus.COMPLETED, False),
    ],
)
def test_transitions(current: BatchStatus, to: BatchStatus, allowed: bool) -> None:
    assert may_move(current, to) is allowed


def test_the_estimate_follows_the_rate_so_far() -> None:
    batch = Batch(
        "batch_x", "e", "p", "/v1/chat/completions", "f", BatchStatus.IN_PROGRESS, T0,
        T0 + WINDOW, times={"in_progress_at": T0}, counts=Counts(100, 15, 5),
    )  # fmt: skip
    now = T0 + timedelta(seconds=10)  # 20 finished in 10 s: 2/s, 80 left
    got = estimate(batch, now)
    assert got.per_second == pytest.approx(2.0)
    assert got.done_at == now + timedelta(seconds=40)
    assert estimate(replace(batch, counts=Counts(100)), now).done_at is None
    done = replace(batch, status=BatchStatus.COMPLETED, times={STAMPS[BatchStatus.COMPLETED]: now})
    assert estimate(done, now + timedelta(hours=1)).done_at == now


def test_usage_is_read_from_the_answer() -> None:
    assert usage_of(b'{"usage": {"prompt_tokens": 3, "completion_tokens": 4}}') == (3, 4)
    assert usage_of(b'{"usage": {"prompt_tokens": 3, "total_tokens": 3}}') == (3, 0)
    assert usage_of(b"not json") == (0, 0)
    assert usage_of(b"[1]") == (0, 0)


# --- running ---------------------------------------------------------------------------


def test_a_batch_runs_to_completed_with_one_result_per_request() -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        created = await world.batch(ep, 10)
        assert created.status is BatchStatus.VALIDATING
        assert created.counts == Counts(total=10)
        executor = FakeExecutor()
        executor.answers = {"c3": [400], "c4": [503, 503, 200]}
        runner = world.runner(executor)
        await runner.start(1)
        batch = await final(world, created.id)
        await runner.stop()
        assert batch.status is BatchStatus.COMPLETED
        assert batch.counts == Counts(total=10, completed=9, failed=1)
        assert {"in_progress_at", "finalizing_at", "completed_at"} <= set(batch.times)
        out = await world.output(ep.id, batch.output_file_id)
        errors = await world.output(ep.id, batch.error_file_id)
        assert sorted(r["custom_id"] for r in out) == sorted(f"c{i}" for i in range(10) if i != 3)
        assert [r["custom_id"] for r in errors] == ["c3"]
        assert errors[0]["response"]["status_code"] == 400 and errors[0]["error"] is None
        first = out[0]
        assert first["response"]["status_code"] == 200
        assert first["response"]["body"]["echo"] == first["custom_id"]
        assert first["response"]["request_id"] == f"id-{first['custom_id']}"
        # The busy answers were tried again: c4 three times, every other once.
        calls = Counter(executor.calls)
        assert calls["c4"] == 3 and all(calls[f"c{i}"] == 1 for i in range(10) if i != 4)
        # Usage of the answered ones, at the batch price (half of 2.0 per million).
        assert (batch.usage.prompt_tokens, batch.usage.completion_tokens) == (45, 63)
        assert batch.usage.cost == pytest.approx(108 * 2.0 / 1e6 * 0.5)
        body = batch.to_openai()
        assert body["request_counts"] == {"total": 10, "completed": 9, "failed": 1}
        assert body["usage"]["total_tokens"] == 108 and body["status"] == "completed"
        # The output file's size is what its content holds.
        file = await world.service.file(ep.id, batch.output_file_id or "")
        assert file.bytes == sum(len(json.dumps(r, separators=(",", ":"))) + 1 for r in out)

    asyncio.run(scenario())


def test_a_request_busy_past_its_attempts_fails_with_the_last_answer() -> None:
    async def scenario() -> None:
        world = World(replace(SETTINGS, max_attempts=2))
        ep = await world.endpoint()
        created = await world.batch(ep, 1)
        executor = FakeExecutor()
        executor.answers = {"c0": [503, 503, 200]}
        runner = world.runner(executor)
        await runner.start(1)
        batch = await final(world, created.id)
        await runner.stop()
        assert batch.counts == Counts(1, 0, 1) and executor.calls == ["c0", "c0"]
        errors = await world.output(ep.id, batch.error_file_id)
        assert errors[0]["response"]["status_code"] == 503

    asyncio.run(scenario())


@pytest.mark.parametrize("ready", [True, False])
def test_held_past_the_hold_timeout_is_busy_only_while_a_replica_is_up(ready: bool) -> None:
    """A 503 `hold_timeout` while the endpoint has a ready replica means its
    slots stayed taken by interactive work: tried again like a 429, past
    `max_attempts`. With no replica up it is a failure like any 503."""

    async def scenario() -> None:
        world = World(replace(SETTINGS, max_attempts=2))
        ep = await world.endpoint()
        created = await world.batch(ep, 1)
        executor = FakeExecutor()
        executor.answers = {"c0": [503, 503, 503, 200]}
        executor.codes = {503: "hold_timeout"}
        executor.ready = ready
        runner = world.runner(executor)
        await runner.start(1)
        batch = await final(world, created.id)
        await runner.stop()
        if ready:
            assert batch.counts == Counts(1, 1, 0) and executor.calls == ["c0"] * 4
        else:
            assert batch.counts == Counts(1, 0, 1) and executor.calls == ["c0"] * 2

    asyncio.run(scenario())


def test_a_new_leader_resumes_where_the_last_stopped() -> None:
    """The first runner stops (its lead lost) with requests in flight: the
    second runs those again and every one not yet finished, never one
    already finished, and each request has exactly one result."""

    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        created = await world.batch(ep, 30)
        first_exec = FakeExecutor(delay=0.002)
        first = world.runner(first_exec)
        await first.start(1)

        async def some_done() -> bool:
            got = await world.store.get_batch(created.id)
            return got is not None and got.counts.finished >= 8

        await until(some_done)
        await first.stop()  # the lead is lost mid-batch
        stopped = await world.store.get_batch(created.id)
        assert stopped is not None and stopped.status is BatchStatus.IN_PROGRESS
        finished_before = {
            json.loads(line)["custom_id"]
            for _, line in await world.store.result_lines(created.id, RequestState.DONE, -1, 100)
        }
        assert len(finished_before) == stopped.counts.completed >= 8
        second_exec = FakeExecutor()
        second = world.runner(second_exec)
        await second.start(2)
        batch = await final(world, created.id)
        await second.stop()
        assert batch.status is BatchStatus.COMPLETED and batch.counts == Counts(30, 30, 0)
        out = await world.output(ep.id, batch.output_file_id)
        assert sorted(r["custom_id"] for r in out) == sorted(f"c{i}" for i in range(30))
        # Nothing finished was run again; nothing was skipped.
        assert not finished_before & set(second_exec.calls)
        assert set(first_exec.calls) | set(second_exec.calls) == {f"c{i}" for i in range(30)}
        # Re-run: only what was in flight when the first stopped (at most its concurrency).
        rerun = set(first_exec.calls) & set(second_exec.calls)
        assert len(rerun) <= SETTINGS.concurrency
        assert batch.usage.requests == 30  # usage counted once per result

    asyncio.run(scenario())


def test_cancel_stops_a_running_batch_and_keeps_its_results() -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        executor = FakeExecutor(delay=0.002)
        runner = world.runner(executor)
        # The runner is told of the cancel at once (a leader elsewhere reads it).
        world.service = BatchService(
            world.store, world.endpoints.get, SETTINGS, world.clock, wake=runner.wake
        )
        created = await world.batch(ep, 20)
        await runner.start(1)

        async def some_done() -> bool:
            got = await world.store.get_batch(created.id)
            return got is not None and got.counts.finished >= 3

        await until(some_done)
        cancelling = await world.service.cancel(ep.id, created.id)
        assert cancelling.status is BatchStatus.CANCELLING
        batch = await final(world, created.id)
        calls_then = len(executor.calls)
        await asyncio.sleep(0.05)
        await runner.stop()
        assert batch.status is BatchStatus.CANCELLED and "cancelled_at" in batch.times
        assert len(executor.calls) == calls_then  # nothing sent after
        assert 3 <= batch.counts.completed < 20
        out = await world.output(ep.id, batch.output_file_id)
        assert len(out) == batch.counts.completed
        # Cancelling again answers the batch; a finished one cannot be.
        again = await world.service.cancel(ep.id, created.id)
        assert again.status is BatchStatus.CANCELLED

    asyncio.run(scenario())


def test_a_completed_batch_cannot_be_cancelled() -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        created = await world.batch(ep, 2)
        runner = world.runner(FakeExecutor())
        await runner.start(1)
        await final(world, created.id)
        await runner.stop()
        with pytest.raises(Conflict, match="completed"):
            await world.service.cancel(ep.id, created.id)

    asyncio.run(scenario())


def test_a_batch_past_its_window_expires_with_the_rest_in_the_error_file() -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        created = await world.batch(ep, 12)
        executor = FakeExecutor()
        executor.gate = asyncio.Event()
        runner = world.runner(executor)
        await runner.start(1)
        await until(lambda: _true(len(executor.calls) == SETTINGS.concurrency))
        world.clock.now = created.expires_at + timedelta(seconds=1)
        executor.gate.set()
        batch = await final(world, created.id)
        await runner.stop()
        assert batch.status is BatchStatus.EXPIRED
        assert batch.counts == Counts(12, SETTINGS.concurrency, 12 - SETTINGS.concurrency)
        errors = await world.output(ep.id, batch.error_file_id)
        assert {e["error"]["code"] for e in errors} == {"batch_expired"}
        assert len({e["id"] for e in errors}) == len(errors)

    asyncio.run(scenario())


async def _true(value: bool) -> bool:
    return value


# --- the service -------------------------------------------------------------------------


def test_files_are_checked_limited_and_kept_within_the_project_quota() -> None:
    async def scenario() -> None:
        size = len(jsonl(2))
        world = World(replace(SETTINGS, max_file_bytes=size * 2, project_quota_bytes=size * 3))
        ep = await world.endpoint()
        with pytest.raises(BadRequest, match="purpose"):
            await world.service.upload(ep.id, "x", "fine-tune", jsonl(1))
        with pytest.raises(PayloadTooLarge):
            await world.service.upload(ep.id, "x", "batch", jsonl(5))
        with pytest.raises(BadRequest, match="line 1"):
            await world.service.upload(ep.id, "x", "batch", b"nope\n")
        kept = [await world.service.upload(ep.id, "x", "batch", jsonl(2)) for _ in range(3)]
        with pytest.raises(Conflict) as refused:
            await world.service.upload(ep.id, "x", "batch", jsonl(2))
        assert refused.value.code == "quota_exceeded"
        await world.service.delete_file(ep.id, kept[0].id)
        await world.service.upload(ep.id, "x", "batch", jsonl(2))
        _, chunks = await world.service.content(ep.id, kept[1].id)
        assert b"".join([c async for c in chunks]) == jsonl(2)

    asyncio.run(scenario())


def test_another_endpoints_files_and_batches_are_absent() -> None:
    async def scenario() -> None:
        world = World()
        mine, other = await world.endpoint(1), await world.endpoint(2)
        batch = await world.batch(mine, 1)
        with pytest.raises(NotFound):
            await world.service.file(other.id, batch.input_file_id)
        with pytest.raises(NotFound):
            await world.service.get(other.id, batch.id)
        with pytest.raises(NotFound):
            await world.service.cancel(other.id, batch.id)
        with pytest.raises(NotFound):
            await world.service.create(other.id, batch.input_file_id, "/v1/chat/completions",
                                       "24h", {})  # fmt: skip
        assert (await world.service.page(other.id, None, 10)) == ([], False)
        page, more = await world.service.page(mine.id, None, 10)
        assert [b.id for b in page] == [batch.id] and not more

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("url", "window", "kind", "said"),
    [
        ("/v1/images/generations", "24h", "chat", "endpoint must be one of"),
        ("/v1/embeddings", "24h", "chat", "serves a chat model"),
        ("/v1/chat/completions", "1h", "chat", "completion_window must be '24h'"),
        ("/v1/completions", "24h", "chat", "not the batch's endpoint"),
    ],
)
def test_a_batch_is_refused_with_a_clear_400(url: str, window: str, kind: str, said: str) -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint(model_kind=kind)
        file = await world.service.upload(ep.id, "x", "batch", jsonl(1))
        with pytest.raises(BadRequest, match=said):
            await world.service.create(ep.id, file.id, url, window, {})

    asyncio.run(scenario())


def test_files_and_batches_go_with_their_endpoint() -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        batch = await world.batch(ep, 2)
        assert await world.store.batch_bytes_used(ep.project_id) > 0
        await world.store.delete_endpoint(ep.id)
        assert await world.store.get_batch(batch.id) is None
        assert await world.store.get_file(batch.input_file_id) is None
        assert await world.store.batch_bytes_used(ep.project_id) == 0

    asyncio.run(scenario())


def test_list_pages_newest_first() -> None:
    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        made = [await world.batch(ep, 1) for _ in range(5)]
        first, more = await world.service.page(ep.id, None, 2)
        assert [b.id for b in first] == [made[4].id, made[3].id] and more
        rest, more = await world.service.page(ep.id, first[-1].id, 10)
        assert [b.id for b in rest] == [made[2].id, made[1].id, made[0].id] and not more

    asyncio.run(scenario())


class ReplicaThatDoes:
    """A fake executor standing for the replica too: each request it runs
    counts in the replica's usage report as a batch request (as
    `ReplicaMetrics` does for the gateway's batch header), whether or not
    the leader lives to record its answer; past `answer_first`, calls never
    answer (the leader dies with them in flight)."""

    def __init__(self, report: dict[str, int], answer_first: int | None = None) -> None:
        self.report = report
        self.answer_first = answer_first
        self.calls: list[str] = []

    async def run(self, batch: Batch, idx: int, body: bytes) -> Answer:
        who = json.loads(body)["user"]
        self.calls.append(who)
        for key, n in (("requests", 1), ("prompt_tokens", 5), ("completion_tokens", 7)):
            self.report[key] += n
            self.report[f"batch_{key}"] += n
        if self.answer_first is not None and len(self.calls) > self.answer_first:
            await asyncio.Event().wait()
        usage = {"prompt_tokens": 5, "completion_tokens": 7}
        return Answer(200, json.dumps({"usage": usage}).encode(), f"id-{who}")


def test_a_request_run_again_after_a_failover_is_metered_once() -> None:
    """The endpoint's usage counts each batch request once, when its result
    is recorded, though the replica ran some twice (the first leader died
    with them in flight); interactive requests are metered from the
    replica's report as before."""

    async def scenario() -> None:
        world = World()
        ep = await world.endpoint()
        created = await world.batch(ep, 12)
        report = dict.fromkeys(
            ("requests", "prompt_tokens", "completion_tokens", "batch_requests",
             "batch_prompt_tokens", "batch_completion_tokens"), 0,
        )  # fmt: skip
        first_exec = ReplicaThatDoes(report, answer_first=4)
        first = world.runner(first_exec)
        await first.start(1)

        async def stuck() -> bool:
            got = await world.store.get_batch(created.id)
            return got is not None and got.counts.finished == 4 and len(first_exec.calls) == 7

        await until(stuck)
        await first.stop()  # the lead is lost with 3 requests run and not recorded
        second_exec = ReplicaThatDoes(report)
        second = world.runner(second_exec)
        await second.start(2)
        batch = await final(world, created.id)
        await second.stop()
        rerun = set(first_exec.calls[4:]) & set(second_exec.calls)
        assert len(rerun) == 3 and report["batch_requests"] == 15  # 3 ran twice
        # Two interactive requests beside them, in the same report.
        report["requests"] += 2
        report["prompt_tokens"] += 20
        report["completion_tokens"] += 30
        meter = UsageMeter()
        replica = LiveReplica("r-1", ep.id, ep.gpu_type, ep.gpu_count, 0.0)
        meter.count(replica, ep.project_id, counters_of(ReplicaUsageReport(**report)), T0)
        await world.store.add_usage(meter.drain())
        rows = await world.store.usage(endpoint_id=ep.id)
        totals = [sum(getattr(r, f) for r in rows)
                  for f in ("requests", "prompt_tokens", "completion_tokens")]  # fmt: skip
        assert batch.counts == Counts(12, 12, 0)
        assert totals == [12 + 2, 12 * 5 + 20, 12 * 7 + 30]

    asyncio.run(scenario())
