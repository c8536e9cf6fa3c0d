"""The Batch API's files, batches and request results (`BatchStore`).

A file's content is kept as chunks of rows (`CHUNK_BYTES` each): written in
the transaction that records the file, read back one chunk at a time, gone
by cascade with the file or its endpoint. A batch's own output and error
files hold no chunks: their lines are its requests' result lines, read in
order.

Every write of the runner is fenced by its leader term (a deposed leader's
late result is refused) and conditional on the state it expects (a request
still pending, a batch still in the status it read), so two writers can
never both record one request's result.

A request's usage is added to its endpoint's hourly usage in the same
transaction that records its result (`Result.at`): once per request, however
many times it ran (the replica reports batch requests apart, and the meter
leaves them out), so a request run again after a failover is metered once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from inferd.control.accounts.model import UsageDelta, hour_of
from inferd.control.batches.jsonl import BatchLine
from inferd.control.batches.model import (
    STAMPS,
    Batch,
    BatchFile,
    BatchStatus,
    PendingRequest,
    RequestState,
    Result,
    StorageQuotaExceeded,
    may_move,
)
from inferd.control.stores.sql.accounts import ADD_USAGE
from inferd.control.stores.sql.database import Tx
from inferd.control.stores.sql.repository import Repository, Where
from inferd.control.stores.sql.tables import BATCH_FILES, BATCHES, USAGE

CHUNK_BYTES = 1 << 20


class Batches(Repository):
    # --- files ---------------------------------------------------------------------------

    async def add_file(self, file: BatchFile, content: bytes, quota_bytes: int) -> None:
        """The file and its content; `StorageQuotaExceeded` past the project's
        quota of stored bytes, `EndpointGone` when the endpoint is not there."""

        def write(tx: Tx) -> None:
            self._live_endpoint(tx, file.endpoint_id)
            # The project's row, locked: uploads of one project add up in turn.
            tx.one("SELECT id FROM projects WHERE id = ?" + self._dialect.for_update,
                   (file.project_id,))  # fmt: skip
            used = self._bytes_used(tx, file.project_id)
            if used + file.bytes > quota_bytes:
                raise StorageQuotaExceeded(file.project_id, used, quota_bytes, file.bytes)
            tx.execute(BATCH_FILES.insert, BATCH_FILES.values(self._dialect, file))
            chunks = [
                (file.id, seq, self._dialect.encode("bytes", content[at : at + CHUNK_BYTES]))
                for seq, at in enumerate(range(0, len(content), CHUNK_BYTES))
            ]
            tx.many("INSERT INTO batch_file_chunks (file_id, seq, data) VALUES (?, ?, ?)", chunks)

        await self._db.write(write)

    def _bytes_used(self, tx: Tx, project_id: str) -> int:
        row = tx.one("SELECT COALESCE(SUM(bytes), 0) FROM batch_files WHERE project_id = ?",
                     (project_id,))  # fmt: skip
        return int(row[0]) if row else 0

    async def batch_bytes_used(self, project_id: str) -> int:
        return await self._db.read(lambda tx: self._bytes_used(tx, project_id))

    async def get_file(self, file_id: str) -> BatchFile | None:
        return await self._get(BATCH_FILES, file_id)

    async def list_files(self, endpoint_id: str) -> list[BatchFile]:
        return await self._find(BATCH_FILES, Where("endpoint_id = ?", endpoint_id), desc=True)

    async def file_chunk(self, file_id: str, seq: int) -> bytes | None:
        rows = await self._db.rows(
            "SELECT data FROM batch_file_chunks WHERE file_id = ? AND seq = ?", (file_id, seq)
        )
        return bytes(rows[0][0]) if rows else None

    async def result_lines(
        self, batch_id: str, state: RequestState, after: int, limit: int
    ) -> list[tuple[int, str]]:
        """(index, line) of a batch's finished requests in `state`, in order,
        from past `after` (-1: the first)."""
        rows = await self._db.rows(
            "SELECT idx, line FROM batch_requests WHERE batch_id = ? AND state = ? AND idx > ?"
            " ORDER BY idx LIMIT ?",
            (batch_id, state.value, after, limit),
        )
        return [(int(idx), str(line)) for idx, line in rows]

    async def delete_file(self, file_id: str) -> bool:
        return await self._delete(BATCH_FILES, file_id, kind=None)

    # --- batches ---------------------------------------------------------------------------

    async def create_batch(self, batch: Batch, lines: Sequence[BatchLine]) -> None:
        """The batch and one pending row per request, in one transaction."""

        def write(tx: Tx) -> None:
            self._live_endpoint(tx, batch.endpoint_id)
            tx.execute(BATCHES.insert, BATCHES.values(self._dialect, batch))
            encode = self._dialect.encode
            tx.many(
                "INSERT INTO batch_requests (batch_id, idx, custom_id, body) VALUES (?, ?, ?, ?)",
                [
                    (batch.id, idx, line.custom_id, encode("bytes", line.body))
                    for idx, line in enumerate(lines)
                ],
            )

        await self._db.write(write)

    async def get_batch(self, batch_id: str) -> Batch | None:
        return await self._get(BATCHES, batch_id)

    async def list_batches(self, endpoint_id: str, after: str | None, limit: int) -> list[Batch]:
        """Newest first; `after`: a batch id, the last of the previous page."""
        order = self._dialect.position("batches")
        where = Where("endpoint_id = ?", endpoint_id)
        where.add(f"{order} < (SELECT {order} FROM batches WHERE id = ?)", after)
        return await self._find(BATCHES, where, desc=True, limit=limit)

    async def running_batches(self) -> list[Batch]:
        """Every batch the leader still has to work on, oldest first."""
        where = Where().among("status", [s.value for s in BatchStatus.running()])
        return await self._find(BATCHES, where)

    async def pending_requests(self, batch_id: str, after: int, limit: int) -> list[PendingRequest]:
        rows = await self._db.rows(
            "SELECT idx, custom_id, body FROM batch_requests"
            " WHERE batch_id = ? AND state = 'pending' AND idx > ? ORDER BY idx LIMIT ?",
            (batch_id, after, limit),
        )
        return [PendingRequest(int(i), str(c), bytes(b)) for i, c, b in rows]

    async def record_result(self, batch_id: str, result: Result, term: int | None) -> bool:
        """The request's result and its state in one statement, and the
        batch's counts and usage with it, and the endpoint's usage (when
        `result.at`); False (nothing written) when the request was no longer
        pending. `Deposed` when `term` no longer leads."""

        def write(tx: Tx) -> bool:
            tx.fence(term)
            if not tx.count(
                "UPDATE batch_requests SET state = ?, line = ?"
                " WHERE batch_id = ? AND idx = ? AND state = 'pending'",
                (result.state.value, result.line, batch_id, result.idx),
            ):
                return False
            done = result.state is RequestState.DONE
            size = len(result.line.encode()) + 1
            tx.execute(
                "UPDATE batches SET completed = completed + ?, failed = failed + ?,"
                " output_bytes = output_bytes + ?, error_bytes = error_bytes + ?,"
                " requests = requests + 1, prompt_tokens = prompt_tokens + ?,"
                " completion_tokens = completion_tokens + ?, cost = cost + ? WHERE id = ?",
                (int(done), int(not done), size if done else 0, 0 if done else size,
                 result.prompt_tokens, result.completion_tokens, result.cost, batch_id),
            )  # fmt: skip
            if result.at is not None:
                self._meter(tx, batch_id, result, result.at)
            return True

        return await self._db.write(write)

    def _meter(self, tx: Tx, batch_id: str, result: Result, at: datetime) -> None:
        """Add the request's usage to its endpoint's hour, as the usage meter
        would have from the replica's report (an endpoint gone: nothing)."""
        done = result.state is RequestState.DONE
        if not (done or result.prompt_tokens or result.completion_tokens):
            return
        row = tx.one(
            "SELECT e.id, e.project_id, e.gpu_type, e.gpu_count FROM batches b"
            " JOIN endpoints e ON e.id = b.endpoint_id WHERE b.id = ?",
            (batch_id,),
        )
        if row is None:
            return
        endpoint_id, project_id, gpu_type, gpu_count = row
        delta = UsageDelta(
            str(endpoint_id), str(project_id), hour_of(at), str(gpu_type), int(gpu_count),
            requests=int(done), prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
        )  # fmt: skip
        tx.execute(ADD_USAGE, USAGE.values(self._dialect, delta))

    async def move_batch(
        self,
        batch_id: str,
        expected: Sequence[BatchStatus],
        to: BatchStatus,
        at: datetime,
        term: int | None,
        errors: list[dict[str, Any]] | None = None,
    ) -> Batch | None:
        """Move a batch still in one of `expected` to `to`, stamping when;
        None when it was in none of them (another writer moved it first)."""

        def write(tx: Tx) -> Batch | None:
            tx.fence(term)
            row = tx.one(BATCHES.get + self._dialect.for_update, (batch_id,))
            if row is None:
                return None
            batch = BATCHES.record(self._dialect, row)
            if not all(may_move(status, to) for status in expected):
                raise ValueError(f"a batch never moves from {expected} to {to.value}")
            if batch.status not in expected:
                return None
            times = {STAMPS[to]: at, **batch.times}
            extra, params = "", list[Any]()
            if to in (BatchStatus.COMPLETED, BatchStatus.CANCELLED, BatchStatus.EXPIRED):
                extra, params = self._output_files(tx, batch, at)
            if errors is not None:
                extra += ", errors = ?"
                params.append(BATCHES.encode(self._dialect, "errors", errors))
            row = tx.one(
                f"UPDATE batches SET status = ?, times = ?{extra} WHERE id = ?"
                f" RETURNING {BATCHES.names}",
                (to.value, BATCHES.encode(self._dialect, "times", times), *params, batch_id),
            )
            assert row is not None
            return BATCHES.record(self._dialect, row)

        return await self._db.write(write)

    def _output_files(self, tx: Tx, batch: Batch, at: datetime) -> tuple[str, list[Any]]:
        """The batch's output and error files (where it has such lines)."""
        # `batch` was read in this transaction: its counts are the stored ones.
        row = tx.one("SELECT output_bytes, error_bytes FROM batches WHERE id = ?", (batch.id,))
        assert row is not None
        sets, params = "", list[Any]()
        for column, holds, lines, size, id_, name in (
            ("output_file_id", "done", batch.counts.completed, int(row[0]), "output", "output"),
            ("error_file_id", "failed", batch.counts.failed, int(row[1]), "errors", "error"),
        ):
            if lines:
                file = BatchFile(
                    id=f"file-{batch.id}-{id_}", endpoint_id=batch.endpoint_id,
                    project_id=batch.project_id, purpose="batch_output",
                    filename=f"{batch.id}_{name}.jsonl", bytes=size,
                    created_at=at, lines=lines, batch_id=batch.id, holds=holds,
                )  # fmt: skip
                tx.execute(BATCH_FILES.insert, BATCH_FILES.values(self._dialect, file))
                sets, params = f"{sets}, {column} = ?", [*params, file.id]
        return sets, params

    async def fail_pending(self, batch_id: str, line_of: Any, term: int | None) -> int:
        """Every request still pending gets `line_of(idx, custom_id)` as its
        error line (a batch that expired); how many."""
        pending = await self._db.rows(
            "SELECT idx, custom_id FROM batch_requests WHERE batch_id = ? AND state = 'pending'",
            (batch_id,),
        )
        failed = 0
        for idx, custom_id in pending:
            result = Result(int(idx), RequestState.FAILED, line_of(int(idx), str(custom_id)))
            failed += await self.record_result(batch_id, result, term)
        return failed
