"""The batch runner's requests, sent through this server's own gateway."""

from __future__ import annotations

from inferd.control.batches.model import Batch, Capacity
from inferd.control.batches.runner import Answer
from inferd.gateway.caller import InProcessCaller
from inferd.gateway.inprocess import InProcessGrant


class GatewayExecutor:
    """`Executor` of the batch runner: each request in-process through the
    gateway, at the batch priority, authorized by the batch's creation and
    run as the client whose token created it; a `running` batch's as
    background work (`inferd.gateway.inprocess`)."""

    def __init__(self, caller: InProcessCaller) -> None:
        self._caller = caller

    async def run(self, batch: Batch, idx: int, body: bytes) -> Answer:
        reply = await self._caller.post(
            InProcessGrant(
                batch.endpoint_id,
                batch.id,
                batch.client,
                # Neither wakes the endpoint nor keeps it up.
                background=batch.capacity is Capacity.RUNNING,
            ),
            batch.url,
            body,
            f"{batch.id}-{idx}",
        )
        return Answer(reply.status, reply.body, reply.request_id)

    async def wait_ready(self, batch: Batch, timeout: float) -> bool:
        return await self._caller.wait_ready(batch.endpoint_id, timeout)
