"""The gateway's read of one endpoint it has not heard of: shared by the
requests that wait on one id, bounded across ids, and harmless when the
store is away."""

from __future__ import annotations

import asyncio

from inferd.control.endpoints.catch_up import EndpointCatchUp
from inferd.control.model import StoreUnavailable


class SlowCopy:
    def __init__(self, fail: bool = False) -> None:
        self.read: list[str] = []
        self.release = asyncio.Event()
        self.fail = fail

    async def refresh(self, endpoint_id: str) -> None:
        self.read.append(endpoint_id)
        await self.release.wait()
        if self.fail:
            raise StoreUnavailable("database away")


def test_requests_waiting_on_one_id_share_one_read() -> None:
    async def scenario() -> None:
        copy = SlowCopy()
        catch_up = EndpointCatchUp([copy])
        waiters = [asyncio.ensure_future(catch_up("ep-1")) for _ in range(5)]
        await asyncio.sleep(0)
        copy.release.set()
        await asyncio.gather(*waiters)
        assert copy.read == ["ep-1"]
        assert catch_up.reads == 1
        # A later miss reads again: the endpoint may have been made since.
        await catch_up("ep-1")
        assert copy.read == ["ep-1", "ep-1"]

    asyncio.run(scenario())


def test_reads_beyond_the_bound_answer_from_memory_at_once() -> None:
    async def scenario() -> None:
        copy = SlowCopy()
        catch_up = EndpointCatchUp([copy], max_reads=2)
        busy = [asyncio.ensure_future(catch_up(f"ep-{i}")) for i in range(2)]
        await asyncio.sleep(0)
        # A third id while two reads are under way: no read, no wait.
        await asyncio.wait_for(catch_up("ep-9"), timeout=1)
        assert copy.read == ["ep-0", "ep-1"]
        copy.release.set()
        await asyncio.gather(*busy)
        await catch_up("ep-9")
        assert copy.read[-1] == "ep-9"

    asyncio.run(scenario())


def test_a_waiter_that_leaves_does_not_cancel_the_others_read() -> None:
    async def scenario() -> None:
        copy, second = SlowCopy(), SlowCopy()
        second.release.set()
        catch_up = EndpointCatchUp([copy, second])
        leaving = asyncio.ensure_future(catch_up("ep-1"))
        staying = asyncio.ensure_future(catch_up("ep-1"))
        await asyncio.sleep(0)
        leaving.cancel()
        await asyncio.sleep(0)
        copy.release.set()
        await staying
        assert second.read == ["ep-1"]  # the read went on to the end

    asyncio.run(scenario())


def test_a_store_that_is_away_leaves_the_answer_to_memory() -> None:
    async def scenario() -> None:
        copy = SlowCopy(fail=True)
        copy.release.set()
        catch_up = EndpointCatchUp([copy])
        await catch_up("ep-1")  # no exception: the request gets its 401 as before
        assert copy.read == ["ep-1"]
        long_id = "x" * 65
        await catch_up(long_id)
        assert copy.read == ["ep-1"]  # no read for an id inferd never makes

    asyncio.run(scenario())
