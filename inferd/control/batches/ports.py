"""The store port of the Batch API (`inferd.control.stores.sql.batches`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from inferd.control.batches.jsonl import BatchLine
from inferd.control.batches.model import (
    Batch,
    BatchFile,
    BatchStatus,
    PendingRequest,
    RequestState,
    Result,
)


class BatchStore(Protocol):
    """Files, batches and each request's result; an endpoint's go with it.
    Writes with a `term` are refused (`Deposed`) once another instance leads."""

    async def add_file(self, file: BatchFile, content: bytes, quota_bytes: int) -> None: ...
    async def get_file(self, file_id: str) -> BatchFile | None: ...
    async def list_files(self, endpoint_id: str) -> list[BatchFile]: ...
    async def file_chunk(self, file_id: str, seq: int) -> bytes | None: ...
    async def result_lines(
        self, batch_id: str, state: RequestState, after: int, limit: int
    ) -> list[tuple[int, str]]: ...
    async def delete_file(self, file_id: str) -> bool: ...
    async def create_batch(self, batch: Batch, lines: Sequence[BatchLine]) -> None: ...
    async def get_batch(self, batch_id: str) -> Batch | None: ...
    async def list_batches(
        self, endpoint_id: str, after: str | None, limit: int
    ) -> list[Batch]: ...
    async def running_batches(self) -> list[Batch]: ...
    async def pending_requests(
        self, batch_id: str, after: int, limit: int
    ) -> list[PendingRequest]: ...
    async def record_result(self, batch_id: str, result: Result, term: int | None) -> bool: ...
    async def move_batch(
        self,
        batch_id: str,
        expected: Sequence[BatchStatus],
        to: BatchStatus,
        at: datetime,
        term: int | None,
        errors: list[dict[str, Any]] | None = None,
    ) -> Batch | None: ...
    async def fail_pending(
        self, batch_id: str, line_of: Callable[[int, str], str], term: int | None
    ) -> int: ...
