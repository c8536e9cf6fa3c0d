"""What the Batch API's routes call: files and batches of one endpoint.

Every call names the endpoint whose token the caller showed (the routes
checked it); a file or batch of another endpoint is answered as absent, the
same 404 as one that never was, so a token learns nothing of other
endpoints. Files count against the endpoint's project's storage quota.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any

from inferd.control.batches.jsonl import parse_batch_file
from inferd.control.batches.model import (
    BATCH_URLS,
    COMPLETION_WINDOW,
    WINDOW,
    Batch,
    BatchFile,
    BatchSettings,
    BatchStatus,
    Capacity,
    Counts,
    RequestState,
    StorageQuotaExceeded,
)
from inferd.control.batches.ports import BatchStore
from inferd.control.model import Endpoint, EndpointGone
from inferd.errors import BadRequest, Conflict, NotFound, PayloadTooLarge

# Result lines read from the store per query when a batch's file is served.
LINES_PER_READ = 500
MAX_METADATA_PAIRS = 16


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


class BatchService:
    def __init__(
        self,
        store: BatchStore,
        endpoint: Callable[[str], Endpoint | None],
        settings: BatchSettings,
        clock: Callable[[], datetime],
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        """`endpoint(id)`: the endpoint as this instance knows it (None:
        none, or being deleted). `wake`: tells this instance's runner that
        a batch was created or cancelled (the leader, wherever it runs,
        also finds it when it next reads the store)."""
        self.store = store
        self._endpoint = endpoint
        self.settings = settings
        self._clock = clock
        self._wake = wake

    def _live(self, endpoint_id: str) -> Endpoint:
        endpoint = self._endpoint(endpoint_id)
        if endpoint is None or endpoint.deleting_at is not None:
            raise NotFound(f"Endpoint '{endpoint_id}' does not exist.", code="endpoint_not_found")
        return endpoint

    # --- files -------------------------------------------------------------------------------

    async def upload(
        self, endpoint_id: str, filename: str, purpose: str, content: bytes
    ) -> BatchFile:
        endpoint = self._live(endpoint_id)
        if purpose != "batch":
            raise BadRequest(
                f"purpose must be 'batch', not '{purpose}': this endpoint keeps batch input "
                "files only.",
                param="purpose",
            )
        limit = self.settings.max_file_bytes
        if len(content) > limit:
            raise PayloadTooLarge(f"The file is {len(content)} bytes; the limit is {limit} bytes.")
        lines = parse_batch_file(content, self.settings.max_requests)
        file = BatchFile(
            id=new_id("file-"),
            endpoint_id=endpoint.id,
            project_id=endpoint.project_id,
            purpose="batch",
            filename=filename or "input.jsonl",
            bytes=len(content),
            created_at=self._clock(),
            lines=len(lines),
        )
        try:
            await self.store.add_file(file, content, self.settings.project_quota_bytes)
        except StorageQuotaExceeded as exc:
            raise Conflict(
                f"Storing this file would pass the project's quota of batch storage: {exc}. "
                "Delete files that are no longer needed.",
                code="quota_exceeded",
            ) from None
        except EndpointGone:
            raise self._gone(endpoint_id) from None
        return file

    def _gone(self, endpoint_id: str) -> NotFound:
        return NotFound(f"Endpoint '{endpoint_id}' does not exist.", code="endpoint_not_found")

    async def file(self, endpoint_id: str, file_id: str) -> BatchFile:
        self._live(endpoint_id)
        file = await self.store.get_file(file_id)
        if file is None or file.endpoint_id != endpoint_id:
            raise NotFound(f"No file with id '{file_id}'.", param="file_id", code="file_not_found")
        return file

    async def files(self, endpoint_id: str) -> list[BatchFile]:
        self._live(endpoint_id)
        return await self.store.list_files(endpoint_id)

    async def content(
        self, endpoint_id: str, file_id: str
    ) -> tuple[BatchFile, AsyncIterator[bytes]]:
        file = await self.file(endpoint_id, file_id)
        if file.batch_id is None:
            return file, self._chunks(file.id)
        return file, self._result_lines(file.batch_id, RequestState(file.holds or "done"))

    async def _chunks(self, file_id: str) -> AsyncIterator[bytes]:
        seq = 0
        while (chunk := await self.store.file_chunk(file_id, seq)) is not None:
            yield chunk
            seq += 1

    async def _result_lines(self, batch_id: str, state: RequestState) -> AsyncIterator[bytes]:
        after = -1
        while lines := await self.store.result_lines(batch_id, state, after, LINES_PER_READ):
            yield "".join(line + "\n" for _, line in lines).encode()
            after = lines[-1][0]

    async def delete_file(self, endpoint_id: str, file_id: str) -> None:
        await self.file(endpoint_id, file_id)
        await self.store.delete_file(file_id)

    # --- batches -------------------------------------------------------------------------

    async def create(
        self,
        endpoint_id: str,
        input_file_id: str,
        url: str,
        completion_window: str,
        metadata: Mapping[str, str] | None,
        client: str = "",
        capacity: Capacity = Capacity.WAKE,
    ) -> Batch:
        """`client`: whose token asks ("": the owner's); the batch's
        requests run as that client. `capacity`: whether it may wake the
        endpoint and keep a replica up (`Capacity`)."""
        endpoint = self._live(endpoint_id)
        kind = BATCH_URLS.get(url)
        if kind is None:
            raise BadRequest(
                f"endpoint must be one of {', '.join(BATCH_URLS)}, not '{url}'.", param="endpoint"
            )
        if kind != endpoint.model_kind:
            raise BadRequest(
                f"This endpoint serves a {endpoint.model_kind} model; {url} is not available "
                "on it.",
                param="endpoint",
                code="unsupported_route",
            )
        if completion_window != COMPLETION_WINDOW:
            raise BadRequest(
                f"completion_window must be '{COMPLETION_WINDOW}'.", param="completion_window"
            )
        metadata = dict(metadata or {})
        if len(metadata) > MAX_METADATA_PAIRS or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        ):
            raise BadRequest(
                f"metadata holds at most {MAX_METADATA_PAIRS} pairs of strings (keys up to 64 "
                "characters, values up to 512).",
                param="metadata",
            )
        file = await self.store.get_file(input_file_id)
        if file is None or file.endpoint_id != endpoint_id or file.purpose != "batch":
            raise NotFound(
                f"No batch input file with id '{input_file_id}'.",
                param="input_file_id",
                code="file_not_found",
            )
        content = b"".join([chunk async for chunk in self._chunks(file.id)])
        lines = parse_batch_file(content, self.settings.max_requests)
        wrong = [line.custom_id for line in lines if line.url != url]
        if wrong:
            raise BadRequest(
                f"The file's requests are for {lines[0].url}, not the batch's endpoint {url}.",
                param="endpoint",
            )
        now = self._clock()
        batch = Batch(
            id=new_id("batch_"),
            endpoint_id=endpoint.id,
            project_id=endpoint.project_id,
            url=url,
            input_file_id=file.id,
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + WINDOW,
            metadata=metadata,
            counts=Counts(total=len(lines)),
            client=client,
            capacity=capacity,
        )
        try:
            await self.store.create_batch(batch, lines)
        except EndpointGone:
            raise self._gone(endpoint_id) from None
        self._wake()
        return batch

    async def get(self, endpoint_id: str, batch_id: str) -> Batch:
        self._live(endpoint_id)
        batch = await self.store.get_batch(batch_id)
        if batch is None or batch.endpoint_id != endpoint_id:
            raise NotFound(
                f"No batch with id '{batch_id}'.", param="batch_id", code="batch_not_found"
            )
        return batch

    async def page(
        self, endpoint_id: str, after: str | None, limit: int
    ) -> tuple[list[Batch], bool]:
        """A page, newest first, and whether there are more."""
        self._live(endpoint_id)
        if after is not None:
            await self.get(endpoint_id, after)
        batches = await self.store.list_batches(endpoint_id, after, limit + 1)
        return batches[:limit], len(batches) > limit

    async def cancel(self, endpoint_id: str, batch_id: str) -> Batch:
        batch = await self.get(endpoint_id, batch_id)
        if batch.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
            return batch
        moved = await self.store.move_batch(
            batch_id,
            (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS),
            BatchStatus.CANCELLING,
            self._clock(),
            None,
        )
        if moved is None:
            current = await self.get(endpoint_id, batch_id)
            if current.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
                return current
            raise Conflict(
                f"Batch '{batch_id}' is {current.status.value}; it can no longer be cancelled.",
                code="batch_not_cancellable",
            )
        self._wake()
        return moved


def result_line(
    batch_id: str,
    idx: int,
    custom_id: str,
    status: int | None,
    body: bytes,
    request_id: str,
    error: dict[str, str] | None = None,
) -> str:
    """One line of a batch's output or error file, in OpenAI's shape."""
    response: dict[str, Any] | None = None
    if status is not None:
        try:
            answer: Any = json.loads(body)
        except ValueError:
            answer = body.decode("utf-8", "replace")
        response = {"status_code": status, "request_id": request_id, "body": answer}
    return json.dumps(
        {
            "id": f"batch_req_{batch_id.removeprefix('batch_')}_{idx}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        },
        separators=(",", ":"),
    )
