"""What every repository shares: the `Database`, reads of records by the
table description, one-statement writes with their change, inserts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from inferd.control.model import ChangeKind, EndpointGone
from inferd.control.stores.sql.database import Database, Tx, Violation
from inferd.control.stores.sql.tables import Table

R = TypeVar("R")


class Repository:
    """A store's part over the one `Database` (each implements one port)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._dialect = db.dialect

    async def _find(self, table: Table[R], where: str = "", params: Sequence[Any] = ()) -> list[R]:
        """The records of `table` for a `where` clause (with its ORDER BY)."""
        rows = await self._db.rows(f"{table.select} {where}", params)
        return [table.record(self._dialect, row) for row in rows]

    async def _find_one(self, table: Table[R], where: str, params: Sequence[Any]) -> R | None:
        # Not through `_find`: one coroutine less on the hottest read.
        rows = await self._db.rows(f"{table.select} {where}", params)
        return table.record(self._dialect, rows[0]) if rows else None

    def _ordered(self, table: Table[Any], where: str = "", *, desc: bool = False) -> str:
        """`where` and the ORDER BY of insertion (`desc`: newest first)."""
        return f"{where} ORDER BY {self._dialect.position(table.name)}{' DESC' if desc else ''}"

    def _time(self, at: datetime | None) -> Any:
        return None if at is None else self._dialect.encode("time", at)

    async def _change(
        self, statement: str, params: Sequence[Any], kind: ChangeKind, key: str = "",
        *, term: int | None = None,
    ) -> int:  # fmt: skip
        """One statement (fenced by `term`); a `kind` change of `key` where it
        changed rows, which it counts."""

        def write(tx: Tx) -> int:
            tx.fence(term)
            count = tx.count(statement, params)
            if count:
                tx.changed(kind, key)
            return count

        return await self._db.write(write)

    async def _add(
        self, table: Table[Any], record: Any, kind: ChangeKind | None, key: str = "",
        *, duplicate: Exception | None = None, check: Callable[[Tx], None] | None = None,
    ) -> None:  # fmt: skip
        """Insert `record` after `check`, a `kind` change of `key`; `duplicate`
        where a unique key refuses it."""
        values = table.values(self._dialect, record)

        def write(tx: Tx) -> None:
            if check is not None:
                check(tx)
            tx.execute(table.insert, values)
            if kind is not None:
                tx.changed(kind, key)

        try:
            await self._db.write(write)
        except Violation as exc:
            if exc.unique and duplicate is not None:
                raise duplicate from None
            raise

    async def _touch(self, table: str, where: str, rows: list[tuple[Any, ...]]) -> None:
        """Set each row's `last_used_at` (first value of each of `rows`, the
        rest `where`'s), never moving it back."""
        statement = (
            f"UPDATE {table} SET last_used_at = ? WHERE {where}"
            " AND (last_used_at IS NULL OR last_used_at < ?)"
        )
        if rows:
            await self._db.write(lambda tx: tx.many(statement, [(*r, r[0]) for r in rows]))

    def _live_endpoint(self, tx: Tx, endpoint_id: str, *, exclusive: bool = False) -> None:
        """`EndpointGone` unless the endpoint is there and not being deleted;
        its row stays locked (shared, or `exclusive`) until the write commits,
        so that a deletion cannot start under it."""
        lock = self._dialect.for_update if exclusive else self._dialect.for_share
        row = tx.one("SELECT deleting_at FROM endpoints WHERE id = ?" + lock, (endpoint_id,))
        if row is None or row[0] is not None:
            raise EndpointGone(endpoint_id)

    async def _delete_named(
        self, table: str, kind: ChangeKind, endpoint_id: str, name: str
    ) -> bool:
        """Delete an endpoint's row called `name` from `table`, a `kind` change of the endpoint."""
        statement = f"DELETE FROM {table} WHERE endpoint_id = ? AND name = ?"
        return await self._change(statement, (endpoint_id, name), kind, endpoint_id) > 0
