"""`SQLiteDatabase`: the `Database` interface on an SQLite file (`SQLiteFile`).

A statement (`execute`) is written the way `SQLiteFile.write` writes: on the
event loop when the file is free, else in a worker thread; a read bounded by
an index (`fetch`) runs the way `SQLiteFile.read` does. `write(fn)` goes
through the file's group-commit writer (`GroupWriter`), `read(fn)` through a
worker thread (`SQLiteFile.run`): a store's function of a transaction
(`async def fn(tx)`) runs inside sqlite3's synchronous transaction, driven
by `drive`, since every await on an `SQLiteTx` completes at once (a
coroutine stepped once, without an event loop round trip). `create_table`
brings a `Table` up to date on a plain sqlite3 connection, for a store whose
own migrations run on one (`Store`'s sqlite-utils migrations).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..groupcommit import GroupWriter
from ..sqlitefile import SQLiteFile
from . import Table, Tx

__all__ = ["SQLiteDatabase", "SQLiteTx", "apply_migrations", "create_table", "drive"]

T = TypeVar("T")


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """The result of `coro`, which must finish without suspending (it only
    awaits an `SQLiteTx`): run here, inside the caller's transaction."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a function of an SQLite transaction awaited something besides it")


class SQLiteTx:
    """Statements on an sqlite3 connection inside its transaction (`Tx`)."""

    __slots__ = ("conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, params)
        if cursor.description is None:  # a statement that returns no rows
            return []
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    async def fetchrow(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        cursor = self.conn.execute(sql, params)
        # fetchall: the statement is done (a RETURNING's too) before the commit.
        rows = cursor.fetchall()
        if not rows or cursor.description is None:
            return None
        return dict(zip([d[0] for d in cursor.description], rows[0], strict=True))

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.conn.execute(sql, params)


def create_table(conn: sqlite3.Connection, table: Table) -> None:
    """Create `table` on `conn`, or add the columns it lacks (idempotent)."""
    conn.execute(table.create_statement)
    have = {row[1] for row in conn.execute(f"PRAGMA table_info({table.name})")}
    for column, kind in table.added:
        if column not in have:
            conn.execute(f"ALTER TABLE {table.name} ADD COLUMN {column} {kind}")
    for index in table.indexes:
        conn.execute(index)


def apply_migrations(
    conn: sqlite3.Connection, migrations: Sequence[tuple[str, Sequence[str]]]
) -> None:
    """Apply the `migrations` (name, statements) not recorded yet in
    `a2a_migrations`, in order, in one transaction (another process opening
    the file at once waits for it, then finds them applied). A file that has
    them all is only read (a reader's open takes no write lock)."""
    if not _pending(conn, migrations):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS a2a_migrations "
            "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        done = {name for (name,) in conn.execute("SELECT name FROM a2a_migrations")}
        for name, statements in migrations:
            if name not in done:
                for statement in statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO a2a_migrations (name, applied_at) VALUES (?, ?)",
                    (name, time.time()),
                )
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _pending(
    conn: sqlite3.Connection, migrations: Sequence[tuple[str, Sequence[str]]]
) -> list[str]:
    try:
        done = {name for (name,) in conn.execute("SELECT name FROM a2a_migrations")}
    except sqlite3.OperationalError:  # no such table: a file from before the list
        done = set()
    return [name for name, _ in migrations if name not in done]


class SQLiteDatabase:
    """An SQLite file as a `Database` (see the module docstring)."""

    dialect = "sqlite"

    def __init__(
        self, file: SQLiteFile, *, own: bool = False, writer: GroupWriter | None = None
    ) -> None:
        """`own`: `close` closes the file (else its owner does); `writer`:
        the file's group-commit writer, when it has one already."""
        self.file = file
        self.what = file.what
        self._own = own
        self._writer = writer

    async def write(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        if self._writer is None:
            self._writer = GroupWriter(self.file)
        return await self._writer.write(lambda conn: drive(fn(SQLiteTx(conn))))  # type: ignore[arg-type]

    async def read(self, fn: Callable[[Tx], Awaitable[T]]) -> T:
        conn = self.file.conn
        return await self.file.run(lambda: drive(fn(SQLiteTx(conn))))  # type: ignore[arg-type]

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
