"""The batch runner's requests, sent through this server's own gateway."""

from __future__ import annotations

from inferd.control.batches.model import Batch
from inferd.control.batches.runner import Answer
from inferd.gateway.caller import InProcessCaller
from inferd.gateway.inprocess import InProcessGrant


class GatewayExecutor:
    """`Executor` of the batch runner: each request in-process through the
    gateway, at the batch priority, authorized by the batch's creation and
    run as the client whose token created it."""

    def __init__(self, caller: InProcessCaller) -> None:
        self._caller = caller

    async def run(self, batch: Batch, idx: int, body: bytes) -> Answer:
        reply = await self._caller.post(
            InProcessGrant(batch.endpoint_id, batch.id, batch.client),
            batch.url,
            body,
            f"{batch.id}-{idx}",
        )
        return Answer(reply.status, reply.body, reply.request_id)
