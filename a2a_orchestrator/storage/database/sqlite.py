"""`SQLiteDatabase`: the `Database` interface on an SQLite file (`SQLiteFile`).

A statement (`execute`) is written the way `SQLiteFile.write` writes: on the
event loop when the file is free, else in a worker thread; a read bounded by
an index (`fetch`) runs the way `SQLiteFile.read` does. `create_table` brings
a `Table` up to date on a plain sqlite3 connection, for a store whose own
migrations run on one (`Store`'s sqlite-utils migrations).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..sqlitefile import SQLiteFile
from . import Table

__all__ = ["SQLiteDatabase", "create_table"]


def create_table(conn: sqlite3.Connection, table: Table) -> None:
    """Create `table` on `conn`, or add the columns it lacks (idempotent)."""
    conn.execute(table.create_statement)
    have = {row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")}
    for column, kind in table.added:
        if column not in have:
            conn.execute(f"ALTER TABLE {table.name} ADD COLUMN {column} {kind}")
    for index in table.indexes:
        conn.execute(index)


class SQLiteDatabase:
    """An SQLite file as a `Database` (see the module docstring)."""

    def __init__(self, file: SQLiteFile, *, own: bool = False) -> None:
        """`own`: `close` closes the file (else its owner does)."""
        self.file = file
        self.what = file.what
        self._own = own

    @classmethod
    def open(cls, path: str | Path, what: str) -> SQLiteDatabase:
        """The SQLite file at `path` (created if needed), closed by `close`."""
        return cls(SQLiteFile(path, what), own=True)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        values = list(params)
        await self.file.write(lambda conn: conn.execute(sql, values))

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        conn = self.file.conn
        values = list(params)

        def rows() -> list[dict[str, Any]]:
            cursor = conn.execute(sql, values)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

        return await self.file.read(rows)

    async def create(self, table: Table) -> None:
        await self.file.write(lambda conn: create_table(conn, table))

    def close(self) -> None:
        if self._own:
            self.file.close()
