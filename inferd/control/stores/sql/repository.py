"""What every repository shares: the `Database`, reads of records by the
table description, one-statement writes with their change, inserts."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from inferd.control.model import ChangeKind, EndpointGone
from inferd.control.stores.sql.database import Database, Tx, Violation
from inferd.control.stores.sql.tables import Table

R = TypeVar("R")


class Where:
    """A WHERE clause built a condition at a time, with its parameters. A
    condition with a None parameter is left out: an optional filter not given."""

    def __init__(self, condition: str = "", *params: Any) -> None:
        self.conditions: list[str] = []
        self.params: list[Any] = []
        if condition:
            self.add(condition, *params)

    def add(self, condition: str, *params: Any) -> Where:
        if all(param is not None for param in params):
            self.conditions.append(condition)
            self.params.extend(params)
        return self

    def among(self, column: str, values: Sequence[Any]) -> Where:
        return self.add(f"{column} IN ({', '.join('?' for _ in values)})", *values)

    def __str__(self) -> str:
        return f" WHERE {' AND '.join(self.conditions)}" if self.conditions else ""


class Repository:
    """A store's part over the one `Database` (each implements one port)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._dialect = db.dialect

    async def _get(self, table: Table[R], *key: Any) -> R | None:
        """The record of `table` with `key` (its primary key's values), if any."""
        # Not through `_find`: one coroutine less on the hottest read.
        rows = await self._db.rows(table.get, key)
        return table.record(self._dialect, rows[0]) if rows else None

    async def _find(
        self, table: Table[R], where: Where | None = None, *, order: str = "",
        desc: bool = False, limit: int | None = None,
    ) -> list[R]:  # fmt: skip
        """The records of `table` that `where` selects, by `order` (by default
        the order of insertion; `desc`: the other way round), `limit` at most."""
        where = where or Where()
        order = f" ORDER BY {order or self._dialect.position(table.name)}"
        params = where.params if limit is None else [*where.params, limit]
        text = f"{table.select}{where}{order}{' DESC' if desc else ''}"
        text += "" if limit is None else " LIMIT ?"
        return [table.record(self._dialect, row) for row in await self._db.rows(text, params)]

    async def _delete(
        self, table: Table[Any], *key: Any, kind: ChangeKind | None, change: str = "",
        term: int | None = None,
    ) -> bool:  # fmt: skip
        """Delete the row of `table` with `key`; a `kind` change of `change` where there was one."""
        return await self._change(table.delete, key, kind, change, term=term) > 0

    def _time(self, at: datetime | None) -> Any:
        return None if at is None else self._dialect.encode("time", at)

    async def _change(
        self, statement: str, params: Sequence[Any], kind: ChangeKind | None, key: str = "",
        *, term: int | None = None,
    ) -> int:  # fmt: skip
        """One statement (fenced by `term`); a `kind` change of `key` where it
        changed rows, which it counts."""

        def write(tx: Tx) -> int:
            tx.fence(term)
            count = tx.count(statement, params)
            if count and kind is not None:
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

    async def _touch(
        self, table: Table[Any], last_used: Mapping[tuple[Any, ...], datetime]
    ) -> None:
        """Set `last_used_at` of each row (by its key), never moving it back."""
        statement = (
            f"UPDATE {table.name} SET last_used_at = ? WHERE {table.by_key}"
            " AND (last_used_at IS NULL OR last_used_at < ?)"
        )
        rows = [(self._time(at), *key, self._time(at)) for key, at in last_used.items()]
        if rows:
            await self._db.write(lambda tx: tx.many(statement, rows))

    def _live_endpoint(self, tx: Tx, endpoint_id: str, *, exclusive: bool = False) -> None:
        """`EndpointGone` unless the endpoint is there and not being deleted;
        its row stays locked (shared, or `exclusive`) until the write commits,
        so that a deletion cannot start under it."""
        lock = self._dialect.for_update if exclusive else self._dialect.for_share
        row = tx.one("SELECT deleting_at FROM endpoints WHERE id = ?" + lock, (endpoint_id,))
        if row is None or row[0] is not None:
            raise EndpointGone(endpoint_id)
