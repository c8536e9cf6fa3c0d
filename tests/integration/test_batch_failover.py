"""A batch survives its leader: two `inferd serve` compositions on one real
PostgreSQL, requests answered by a real replica process (fake engine). The
leader's database session is killed mid-batch (as when its process dies)
and the instance is stopped; the other one takes the lead, adopts the
replica and finishes the batch. Every request has exactly one result and
none was skipped; the only requests run twice are those in flight at the
kill (at-least-once execution, exactly-once results). The results are read
with the official `openai` client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from inferd.control.fakes import FakeLauncher
from inferd.server.app import create_app
from inferd.server.compose import Server, build
from inferd.settings import load_settings
from inferd.testing import ReplicaHandle, replica_report
from inferd.testing.postgres import PostgresServer
from tests.support import needs
from tests.timings import HANG_S, record_timing

pytestmark = [needs("postgresql", "openai"), pytest.mark.timeout(180)]

ADMIN = "batch-failover-admin-key-0123"
REQUESTS = 40
CONCURRENCY = 4


@pytest.fixture(scope="module")
def replica() -> Iterator[ReplicaHandle]:
    # ~16 tokens at 10 ms: each request lasts ~0.2 s, so the kill finds some in flight.
    handle = ReplicaHandle(
        "tiny-chat",
        ["--engine", "fake", "--engine-arg", "token_delay_s=0.01", "--no-warmup"],
    )
    try:
        yield handle.wait_ready(timeout=60)
    finally:
        handle.stop()


def answered(replica: ReplicaHandle) -> int:
    """Chat requests the replica answered in full."""
    text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    line = r'^inferd_requests_total\{route="chat",status="200"\} ([0-9.e+]+)$'
    found = re.search(line, text, re.M)
    return int(float(found.group(1))) if found else 0


def requests_file() -> bytes:
    rows = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "tiny-chat", "messages": [{"role": "user", "content": f"n {i}"}],
                  "max_tokens": 16}}
        for i in range(REQUESTS)
    ]  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


class Instance:
    """One composition, served in-process (its lifespan run in this loop)."""

    def __init__(self, root: Path, name: str, url: str, launcher: FakeLauncher) -> None:
        self.name = name
        settings = load_settings(
            env={},
            overrides={
                "state_dir": root / name,
                "database_url": url,
                "admin_key": ADMIN,
                "instance_id": name,
                "public_url": "http://inferd.test",
                "batch_concurrency": CONCURRENCY,
            },
        )
        self.settings = settings
        self.launcher = launcher
        self.plane: Server | None = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        self.plane = await build(self.settings, launcher=self.launcher)
        app = create_app(self.plane)
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        self.http = await self._stack.enter_async_context(
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://inferd.test")
        )

    @property
    def leading(self) -> bool:
        return self.plane is not None and self.plane.coordination.term is not None

    async def stop(self) -> None:
        await self._stack.aclose()
        if self.plane is not None:
            await self.plane.close()

    def serve(self, replica_id: str, url: str) -> None:
        """The replica reports ready to this instance (as its reporter would)."""
        assert self.plane is not None
        self.plane.registry.report(
            replica_id,
            self.launcher.alive[replica_id].secret,
            replica_report(replica_id, {"status": "ready", "url": url}),
        )


async def until(condition: Any, within_s: float = HANG_S) -> float:
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > within_s:
            raise AssertionError(f"not within {within_s}s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_a_batch_survives_its_leader_dying(
    postgres_server: PostgresServer, replica: ReplicaHandle, tmp_path: Path
) -> None:
    url = postgres_server.create_database()
    # The replicas' side of a launcher, shared: the one the next leader adopts.
    launcher = FakeLauncher()

    async def scenario() -> None:
        a, b = Instance(tmp_path, "a", url, launcher), Instance(tmp_path, "b", url, launcher)
        await a.start()

        async def a_leads() -> bool:
            return a.leading

        await until(a_leads)
        await b.start()
        try:
            await run(a, b)
        finally:
            for instance in (b, a):
                with contextlib.suppress(Exception):
                    await instance.stop()

    async def run(a: Instance, b: Instance) -> None:
        made = await a.http.post(
            "/inference/endpoints",
            json={"name": "chat", "modelName": "tiny-chat", "minReplicas": 1, "maxReplicas": 1},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        assert made.status_code == 201, made.text
        endpoint = made.json()

        async def launched() -> bool:
            return len(launcher.alive) == 1

        await until(launched)
        (replica_id,) = launcher.alive
        a.serve(replica_id, replica.url)
        before = answered(replica)

        def client(instance: Instance) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(
                base_url=f"{endpoint['url']}/openai/v1",
                api_key=endpoint["accessToken"],
                http_client=instance.http,
                max_retries=0,
            )

        oai = client(a)
        uploaded = await oai.files.create(file=("q.jsonl", requests_file()), purpose="batch")
        batch = await oai.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        async def some_done() -> bool:
            got = await oai.batches.retrieve(batch.id)
            assert got.request_counts is not None
            return got.request_counts.completed >= 10

        await until(some_done)
        # The leader dies: its lock session is cut, as when its process is killed.
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'inferd-leader a'"
            )
        killed_at = time.monotonic()
        at_kill = await client(b).batches.retrieve(batch.id)
        await a.stop()

        async def b_leads() -> bool:
            return b.leading

        await until(b_leads)
        record_timing("batch: next leader after the leader's session died",
                      time.monotonic() - killed_at)  # fmt: skip
        # The next leader adopted the replica (it kept running); it reports there now.
        b.serve(replica_id, replica.url)
        oai = client(b)

        async def completed() -> bool:
            got = await oai.batches.retrieve(batch.id)
            return got.status == "completed"

        await until(completed, within_s=60)
        done = await oai.batches.retrieve(batch.id)
        assert at_kill.request_counts is not None and done.request_counts is not None
        assert at_kill.status == "in_progress" and 10 <= at_kill.request_counts.completed < REQUESTS
        assert (done.request_counts.total, done.request_counts.completed,
                done.request_counts.failed) == (REQUESTS, REQUESTS, 0)  # fmt: skip
        assert done.output_file_id is not None and done.error_file_id is None
        content = await oai.files.content(done.output_file_id)
        lines = [json.loads(x) for x in content.content.decode().splitlines()]
        # Exactly one result per request: none lost, none skipped, none twice.
        assert sorted(x["custom_id"] for x in lines) == sorted(f"q{i}" for i in range(REQUESTS))
        assert all(x["response"]["status_code"] == 200 for x in lines)
        assert all(x["response"]["body"]["choices"][0]["message"]["content"] for x in lines)
        assert done.usage is not None and done.usage.output_tokens > 0
        # Run more than once: at most the requests in flight when the leader died.
        ran = answered(replica) - before
        assert REQUESTS <= ran <= REQUESTS + CONCURRENCY, ran

    asyncio.run(scenario())
