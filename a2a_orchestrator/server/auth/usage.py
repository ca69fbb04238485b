"""`UsageLog`: what each caller took of a server, per UTC day, in SQLite.

One table, `caller_usage`, kept when the server has callers (auth on), in
the server's own SQLite file (beside its tasks
and tool journal; a server whose tasks live in PostgreSQL keeps it in
`.a2a/usage-NAME.db` under its work directory). A row per caller (owner key)
and day: messages that started work, requests refused by a quota, and the
model tokens of the turns that finished. The quotas read the day's tokens
from here, so a restart does not hand a caller a fresh daily budget.

Read it with any SQLite client:

    sqlite3 .a2a/tasks-coder.db 'SELECT * FROM caller_usage ORDER BY day, owner'

Replicas of a role sharing a PostgreSQL database keep the same table there
(`PgUsageLog`), so a caller's tokens per day count across replicas.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from ...storage.database import Table
from ...storage.database.postgres import PgDatabase
from ...storage.sqlitefile import SQLiteFile

__all__ = ["PgUsageLog", "UsageLog", "UsageRow", "today", "usage_path"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS caller_usage (
    owner TEXT NOT NULL,
    day TEXT NOT NULL,
    tasks INTEGER NOT NULL DEFAULT 0,
    refused INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
)
"""


_TABLE = Table(
    name="caller_usage",
    columns=(
        "owner TEXT NOT NULL, day TEXT NOT NULL, tasks BIGINT NOT NULL DEFAULT 0, "
        "refused BIGINT NOT NULL DEFAULT 0, input_tokens BIGINT NOT NULL DEFAULT 0, "
        "output_tokens BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (owner, day)"
    ),
)

_ADD = (
    "INSERT INTO caller_usage AS u (owner, day, tasks, refused, input_tokens, output_tokens) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, day) DO UPDATE SET "
    "tasks = u.tasks + excluded.tasks, refused = u.refused + excluded.refused, "
    "input_tokens = u.input_tokens + excluded.input_tokens, "
    "output_tokens = u.output_tokens + excluded.output_tokens"
)


def _where(day: str | None, owner: str | None) -> tuple[str, list[str]]:
    where, args = [], []
    if day is not None:
        where.append("day = ?")
        args.append(day)
    if owner is not None:
        where.append("owner = ?")
        args.append(owner)
    return (f"WHERE {' AND '.join(where)} " if where else ""), args


def today() -> str:
    """The UTC day usage is counted in (`YYYY-MM-DD`)."""
    return dt.datetime.now(dt.UTC).date().isoformat()


def usage_path(db: str, name: str, workdir: Path) -> Path:
    """Where a server keeps its usage: in its SQLite task file, else beside
    its work directory's stores (tasks in PostgreSQL or another URL)."""
    if "://" in db:
        return workdir / ".a2a" / f"usage-{name}.db"
    return Path(db).expanduser()


@dataclass(frozen=True, kw_only=True)
class UsageRow:
    """One caller's usage on one day."""

    owner: str
    """The caller's owner key ("" without auth)."""
    day: str
    """The UTC day, `YYYY-MM-DD`."""
    tasks: int = 0
    """Messages that started work."""
    refused: int = 0
    """Requests refused by a quota."""
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class UsageLog:
    """The `caller_usage` table of one SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self._file = SQLiteFile(path, "usage log")
        self._file.conn.executescript(_SCHEMA)
        self.path = self._file.path

    async def add(
        self,
        owner: str,
        day: str,
        *,
        tasks: int = 0,
        refused: int = 0,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        """Add to a caller's counters of `day`."""
        row = (owner, day, tasks, refused, input_tokens, output_tokens)

        def write() -> None:
            with self._file.conn:
                self._file.conn.execute(_ADD, row)

        await self._file.run(write)

    async def rows(self, *, day: str | None = None, owner: str | None = None) -> list[UsageRow]:
        """The rows of a day and/or a caller, by day then owner."""
        clause, args = _where(day, owner)

        def read() -> list[tuple[str, str, int, int, int, int]]:
            return self._file.conn.execute(
                "SELECT owner, day, tasks, refused, input_tokens, output_tokens "
                f"FROM caller_usage {clause}ORDER BY day, owner",
                args,
            ).fetchall()

        return [
            UsageRow(
                owner=owner,
                day=day,
                tasks=tasks,
                refused=refused,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )
            for owner, day, tasks, refused, input_tokens, output_tokens in await self._file.run(
                read
            )
        ]

    def close(self) -> None:
        self._file.close()


class PgUsageLog:
    """The `caller_usage` table in the replicas' PostgreSQL database (the
    module docstring), with `UsageLog`'s calls."""

    def __init__(self, url: str) -> None:
        self._db = PgDatabase.open(url, "usage log")
        self.path = self._db.connection.path
        self._created = False

    async def _table(self) -> PgDatabase:
        if not self._created:
            await self._db.create(_TABLE)
            self._created = True
        return self._db

    async def add(
        self,
        owner: str,
        day: str,
        *,
        tasks: int = 0,
        refused: int = 0,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        db = await self._table()
        await db.execute(_ADD, (owner, day, tasks, refused, input_tokens, output_tokens))

    async def rows(self, *, day: str | None = None, owner: str | None = None) -> list[UsageRow]:
        clause, args = _where(day, owner)
        db = await self._table()
        rows = await db.fetch(
            "SELECT owner, day, tasks, refused, input_tokens, output_tokens "
            f"FROM caller_usage {clause}ORDER BY day, owner",
            args,
        )
        return [UsageRow(**{k: row[k] for k in row}) for row in rows]

    def close(self) -> None:
        self._db.close()
