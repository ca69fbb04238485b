"""The database interface the stores are written over, and its two dialects.

A store states its SQL once, with `?` parameter markers, and runs it on a
`Database`: an SQLite file (`sqlite.SQLiteDatabase`, the embedded default)
or a PostgreSQL database shared by replicas (`postgres.PgDatabase`, on
asyncpg). Both dialects accept the statements the stores write (`ON
CONFLICT`, `RETURNING`, partial indexes, `IF NOT EXISTS`); a column type is
written as PostgreSQL names it (`BIGINT`, `DOUBLE PRECISION`), which SQLite
reads with the same affinity (integer, real).

Contract:
- `execute(sql, params)` runs one statement in a transaction of its own and
  returns once it is committed; `fetch(sql, params)` returns a read's rows as
  dicts (column name -> value). A database error is a `StoreError` naming
  the database.
- `write(fn)` runs `await fn(tx)` in one transaction, group-committed with
  the writes that arrive while a commit is in flight (`groupcommit`), and
  returns its result once committed; `read(fn)` runs `await fn(tx)` alone
  on the connection (SQLite: in a worker thread). `fn` does nothing but run
  statements on `tx` (`Tx`): on SQLite it runs inside the synchronous
  transaction (its awaits on `tx` complete at once, `sqlite.drive`), so the
  same function is the statement on either dialect.
- `dialect` ("sqlite", "postgresql") names the dialect, for the few
  statements the two write differently (JSON functions).
- `create(table)` brings a `Table` up to date (idempotent): creates it,
  adds the columns a table made before them lacks, creates its indexes; on
  PostgreSQL once across processes starting at once.
- `close()` closes the database if this object opened it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

__all__ = ["Database", "Table", "Tx"]

T = TypeVar("T")


@dataclass(frozen=True)
class Table:
    """A table's schema, stated once for both dialects."""

    name: str
    columns: str
    """The column definitions of `CREATE TABLE name (...)`."""
    added: Sequence[tuple[str, str]] = ()
    """(column, type) added after the table was first released: a table
    made before has them added, with NULL in its rows."""
    indexes: Sequence[str] = field(default_factory=tuple)
    """`CREATE INDEX IF NOT EXISTS ...` statements."""

    @property
    def create_statement(self) -> str:
        return f"CREATE TABLE IF NOT EXISTS {self.name} ({self.columns})"


class Tx(Protocol):
    """Statements inside one transaction: SQL with `?` markers, rows as dicts."""

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]: ...

    async def fetchrow(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...


class Database(Protocol):
    """A database the stores run their SQL on (see the module docstring)."""

    what: str
    """What the database holds, for messages ("store", "tool-call journal")."""
    dialect: str

    async def write(self, fn: Callable[[Tx], Awaitable[T]]) -> T: ...

    async def read(self, fn: Callable[[Tx], Awaitable[T]]) -> T: ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> None: ...

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]: ...

    async def create(self, table: Table) -> None: ...

    def close(self) -> None: ...
