"""`SharedToolJournal`: the tool-call journal in the replicas' shared database.

The same rows and the same at-most-once rule as `journal.ToolJournal` (a
call's start is recorded before it runs; an open row after a crash is a call
that may have run, and is never run again silently), but in PostgreSQL,
where every replica of the role reads and writes them: the replica that
adopts a dead replica's conversation finds that replica's open calls.

Recovery is by conversation, not at start-up: a replica never closes
another's open calls because their process is not local (it may run on
another machine). A conversation's open calls are recovered by the replica
that took its lease (`task_leases.py`), which proves nobody else runs it: they
are closed as interrupted, and what they left running is ended when it runs
on this machine (the same boot and host; `procs.end_leftovers` checks each
process group's start time): `journal.recovery`, the rule every journal keeps.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .journal import JournalRow, ToolJournal

__all__ = ["SharedToolJournal"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tool_calls ("
    "marker TEXT PRIMARY KEY, scope TEXT NOT NULL, call_id TEXT NOT NULL, tool TEXT NOT NULL, "
    "arguments TEXT NOT NULL, runner_pid BIGINT NOT NULL, runner_ticks BIGINT NOT NULL, "
    "runner_boot TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, pgid BIGINT, "
    "pgid_ticks BIGINT, finished_at DOUBLE PRECISION, outcome TEXT, runner_host TEXT)",
    # A table from before rows named their host: its rows keep NULL.
    "ALTER TABLE tool_calls ADD COLUMN IF NOT EXISTS runner_host TEXT",
    "CREATE INDEX IF NOT EXISTS tool_calls_open ON tool_calls (scope) WHERE finished_at IS NULL",
)


class SharedToolJournal(ToolJournal):
    """The `tool_calls` table on an SQLAlchemy async engine (PostgreSQL).

    A `ToolJournal` to the runtime (`scoped`, `started`, `process`,
    `finished`, `started_calls`), with the same statements: only
    storage (`_write`, `_rows`) and recovery differ."""

    def __init__(self, engine: AsyncEngine) -> None:
        # No SQLite file: the base class's storage is replaced wholesale.
        self.engine = engine
        self._own = False

    async def create(self) -> None:
        """Create the table and its index (idempotent)."""
        async with self.engine.begin() as conn:
            for statement in _SCHEMA:
                await conn.execute(text(statement))

    def close(self) -> None:
        """Nothing to close: the engine belongs to the replica's stores."""

    # The base class's statements, on the engine: its `?` markers become
    # SQLAlchemy's named ones.
    @staticmethod
    def _bound(sql: str, params: Iterable[Any]) -> tuple[Any, dict[str, Any]]:
        names = iter(range(sql.count("?")))
        statement = re.sub(r"\?", lambda _: f":p{next(names)}", sql)
        return text(statement), {f"p{i}": value for i, value in enumerate(params)}

    async def _write(self, sql: str, params: Iterable[Any]) -> None:
        statement, bound = self._bound(sql, params)
        async with self.engine.begin() as conn:
            await conn.execute(statement, bound)

    async def _rows(self, where: str, params: list[Any]) -> list[JournalRow]:
        statement, bound = self._bound(
            f"SELECT * FROM tool_calls WHERE {where} ORDER BY started_at", params
        )
        async with self.engine.connect() as conn:
            rows = [dict(row._mapping) for row in await conn.execute(statement, bound)]
        return [JournalRow.of(row) for row in rows]

    async def recover(self, scope: str | None = None) -> list[JournalRow]:
        """Close the open calls of `scope`, a conversation whose lease this
        replica holds, as interrupted (ending what they left running here).

        Without a scope (a server starting) nothing is recovered: the open
        calls of other replicas are theirs while their leases live."""
        if scope is None:
            return []
        return await self._recover(await self.unfinished(scope), taken_over=True)
