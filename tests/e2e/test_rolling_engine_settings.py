"""A change of an endpoint's engine settings under load, with real processes
(`inferd serve`, its gateway, local replica processes of the fake engine):
new replicas start with the new settings on their command line, the old
ones drain once those are ready, and no request is lost meanwhile."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferd.testing import ServeHandle
from tests.reliability.fault_support import chat_body, open_loop, ready_ids, stream_status
from tests.timings import record_figure, record_timing

SETTINGS = {
    # The replicas' engine is the fake (a token every 20 ms): this is about
    # the control plane and the gateway, which do not care which engine.
    "replica_args": "--engine fake --engine-arg token_delay_s=0.02",
    "health_period_seconds": "0.5",
    "reconcile_period_seconds": "0.1",
    "replica_drain_timeout_seconds": "10",
}
RATE_PER_S = 20
ROLL_TIMEOUT_S = 90


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeHandle]:
    handle = ServeHandle(tmp_path, settings=SETTINGS).start()
    try:
        yield handle
    finally:
        handle.cleanup()
        assert handle.launched_pids() == []


def settings_argument(pid: int) -> dict[str, object] | None:
    """The --engine-settings document a replica process was started with."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    if "--engine-settings" not in argv:
        return None
    return dict(json.loads(argv[argv.index("--engine-settings") + 1]))


def test_a_settings_change_rolls_the_replicas_and_loses_no_request(serve: ServeHandle) -> None:
    created = serve.create_endpoint(
        name="rolled", modelName="tiny-chat", minReplicas=2, maxReplicas=2,
        engineSettings={"maxModelLen": 1024, "maxNumSeqs": 8},
    )  # fmt: skip
    endpoint_id = created["id"]
    before = ready_ids(serve.wait_record(endpoint_id, lambda r: len(ready_ids(r)) == 2, 60))
    assert [settings_argument(pid) for pid in serve.replica_pids()] == [
        {"maxModelLen": 1024, "maxNumSeqs": 8}
    ] * 2

    def rolled(record: dict[str, object]) -> bool:
        ready = ready_ids(record)
        return len(ready) == 2 and not ready & before and record["currentReplicas"] == 2

    async def scenario() -> list[int | str]:
        url = created["url"] + "/openai/v1/chat/completions"
        headers = {"Authorization": f"Bearer {created['accessToken']}"}
        done = asyncio.Event()

        async def change_then_watch() -> None:
            await asyncio.sleep(1)  # traffic flows before the change
            async with httpx.AsyncClient(
                base_url=serve.url, headers={"Authorization": f"Bearer {serve.admin_key}"}
            ) as api:
                changed_at = time.monotonic()
                patched = await api.patch(
                    f"/inference/endpoints/{endpoint_id}",
                    json={"engineSettings": {"maxNumSeqs": 4}},
                )
                assert patched.status_code == 200, patched.text
                while True:
                    record = (await api.get(f"/inference/endpoints/{endpoint_id}")).json()
                    if rolled(record):
                        break
                    await asyncio.sleep(0.2)
                record_timing("engine_settings_rolled", time.monotonic() - changed_at)
            await asyncio.sleep(1)  # and after it
            done.set()

        async with httpx.AsyncClient(headers=headers, timeout=60) as client:
            watcher = asyncio.ensure_future(change_then_watch())

            async def send(n: int) -> int | str:
                return await stream_status(client, url, chat_body(20, stream=True))

            results = await open_loop(send, RATE_PER_S, done.is_set, ROLL_TIMEOUT_S)
            await watcher
        return results

    results = asyncio.run(scenario())
    record_figure("engine_settings_roll_requests", len(results), "requests")
    assert len(results) > 2 * RATE_PER_S
    assert [r for r in results if r != 200] == []
    record = serve.wait_record(endpoint_id, rolled, 10)
    assert record["engineSettings"] == {"maxModelLen": 1024, "maxNumSeqs": 4}
    # The old processes are gone; the new ones run with the merged settings.
    serve.wait_record(endpoint_id, lambda r: len(serve.replica_pids()) == 2, 30)
    assert [settings_argument(pid) for pid in serve.replica_pids()] == [
        {"maxModelLen": 1024, "maxNumSeqs": 4}
    ] * 2
