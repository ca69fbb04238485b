"""The tool-call journal: a call's start is on disk before the call runs.

Side effects happen at most once. Before a tool call runs, the runtime
records it here (call id, tool, arguments, which process runs it); a command
adds the process group it started; the row is closed once the call's result
is recorded. After a crash, rows still open are calls that started and whose
result may be missing: recovery ends what they left running (see `procs`) and
tells the model they were interrupted instead of running them again.

One table, `tool_calls` (`TABLE`, stated once), written by one journal
(`ToolJournal`) over the database interface (`database/`): in the
orchestrator's store, SQLite or PostgreSQL (for in-process children, scope =
child id), in a role server's SQLite file, and in the PostgreSQL database
role server replicas share (scope = A2A context id). Each row names its
runner (pid, start ticks, boot id, host), so a live process's calls are
never mistaken for a dead one's.

One recovery rule for every journal (`recovery`): a row is judged by the
machine it was written on, its boot id and host (containers share a boot id
but not a host name, nor their pids). Another machine's process ids mean
nothing here, so its rows are never signalled here; they are closed only by
their owner, or by the holder of the lease that replaced it. A journal
`shared` by replicas (every replica of a role writes the same rows) is
recovered by conversation only: the replica that took a conversation's
lease (`task_leases.py`), which proves nobody else runs it, closes its open
calls, ending what they left running on this machine; at start-up nothing
is recovered, as the other replicas' calls are theirs while they live.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread

from ..models.base import ToolCall
from ..runtime.events import ToolCalled, ToolResult
from ..tools.procs import end_leftovers, start_ticks
from .database import Database, Table
from .database.sqlite import SQLiteDatabase

__all__ = [
    "TABLE",
    "CallJournal",
    "JournalRow",
    "ToolJournal",
    "lost_announcements",
    "recovery",
    "unanswered",
]

TABLE = Table(
    name="tool_calls",
    columns=(
        "marker TEXT PRIMARY KEY, scope TEXT NOT NULL, call_id TEXT NOT NULL, tool TEXT NOT NULL, "
        "arguments TEXT NOT NULL, runner_pid BIGINT NOT NULL, runner_ticks BIGINT NOT NULL, "
        "runner_boot TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL, pgid BIGINT, "
        "pgid_ticks BIGINT, finished_at DOUBLE PRECISION, outcome TEXT, runner_host TEXT"
    ),
    # A table from before rows named their host: its rows keep NULL, and
    # are judged by their boot id alone, as they were.
    added=(("runner_host", "TEXT"),),
    indexes=(
        "CREATE INDEX IF NOT EXISTS tool_calls_open ON tool_calls (scope) "
        "WHERE finished_at IS NULL",
        # Every conversation a role server opens asks for its scope's started
        # calls: by this index, a read of that scope's rows alone (none for a
        # new context), cheap enough to run on the event loop.
        "CREATE INDEX IF NOT EXISTS tool_calls_scope ON tool_calls (scope)",
    ),
)
"""The journal's table, for every database that holds one."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def unanswered(rows: Iterable[JournalRow], entries: Iterable[object]) -> list[JournalRow]:
    """The calls of `rows` (calls that started) whose result `entries` (a
    rebuilt transcript's) lacks: a crash stopped them, or lost their result
    after their row was closed (a call's events are written after its row,
    behind the runtime), so each may have run and is answered as interrupted."""
    answered = {entry.call_id for entry in entries if isinstance(entry, ToolResult)}
    return [row for row in rows if row.call_id not in answered]


def lost_announcements(entries: Iterable[object], rows: Iterable[JournalRow]) -> list[ToolCalled]:
    """The announcements (`ToolCalled`) of the calls of `rows` that
    `entries` lacks, in the rows' order: a crash kept them from the store
    after the journal recorded the calls, and a transcript without them
    would have the model make the calls again."""
    announced = {entry.call_id for entry in entries if isinstance(entry, ToolCalled)}
    return [
        ToolCalled(call_id=row.call_id, tool=row.tool, arguments=row.arguments)
        for row in rows
        if row.call_id not in announced
    ]


_PID = os.getpid()
_RUNNER = (_PID, start_ticks(_PID), _boot_id(), socket.gethostname())


def _runner() -> tuple[int, int, str, str]:
    # Recomputed after a fork (a test's crash subprocess): a child process is
    # another runner.
    global _PID, _RUNNER
    if os.getpid() != _PID:
        _PID = os.getpid()
        _RUNNER = (_PID, start_ticks(_PID), _boot_id(), socket.gethostname())
    return _RUNNER


@dataclass(frozen=True, kw_only=True)
class JournalRow:
    """A call that started and was never closed."""

    marker: str
    scope: str
    call_id: str
    tool: str
    arguments: dict[str, Any]
    runner_pid: int
    runner_ticks: int
    runner_boot: str
    runner_host: str | None = None
    """None in a row written before rows named their host."""
    pgid: int | None
    pgid_ticks: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> JournalRow:
        """A `tool_calls` row read back, whichever store holds the table."""
        return cls(
            marker=row["marker"],
            scope=row["scope"],
            call_id=row["call_id"],
            tool=row["tool"],
            arguments=json.loads(row["arguments"]),
            runner_pid=row["runner_pid"],
            runner_ticks=row["runner_ticks"],
            runner_boot=row["runner_boot"],
            runner_host=row.get("runner_host"),
            pgid=row["pgid"],
            pgid_ticks=row["pgid_ticks"],
        )

    @property
    def written_here(self) -> bool:
        """Written on this machine since its last boot: only then do its
        process ids name processes here."""
        _pid, _ticks, boot, host = _runner()
        return self.runner_boot == boot and self.runner_host in (None, host)

    @property
    def runner_alive(self) -> bool:
        """The process that ran the call is still running here (and is not us)."""
        pid = _runner()[0]
        if not self.written_here:
            return False  # another machine's, or recorded before a reboot
        if self.runner_pid == pid:
            return False  # our own pid, so the recorded runner is gone (pid reused)
        return start_ticks(self.runner_pid) == self.runner_ticks


class CallJournal:
    """The journal as one conversation's runtime sees it (one scope)."""

    def __init__(self, journal: ToolJournal, scope: str) -> None:
        self.journal = journal
        self.scope = scope

    async def started(self, call: ToolCall) -> str:
        """Record that `call` starts now; return its marker (unique per run)."""
        return await self.journal.started(self.scope, call)

    async def process(self, marker: str, pgid: int, ticks: int) -> None:
        await self.journal.process(marker, pgid, ticks)

    async def finished(self, marker: str, outcome: str = "done") -> None:
        await self.journal.finished(marker, outcome)


class ToolJournal:
    """The `tool_calls` table of one database (see the module docstring)."""

    def __init__(self, db: Database, *, shared: bool = False) -> None:
        """`shared`: replicas write the same rows (recovered by conversation only)."""
        self.db = db
        self.shared = shared
        self._created = False

    @classmethod
    def open(cls, path: str | Path) -> ToolJournal:
        """The journal in the SQLite file at `path` (created if needed); close it."""
        return cls(SQLiteDatabase.open(path, "tool-call journal"))

    async def create(self) -> None:
        """Create the table, or bring it up to date (idempotent)."""
        await self.db.create(TABLE)
        self._created = True

    def close(self) -> None:
        self.db.close()

    def scoped(self, scope: str) -> CallJournal:
        return CallJournal(self, scope)

    async def _write(self, sql: str, params: Iterable[Any]) -> None:
        if not self._created:
            await self.create()
        # On the event loop when an SQLite file is free (`SQLiteFile.write`):
        # a journaled call makes two of these on its critical path.
        await self.db.execute(sql, list(params))

    async def started(self, scope: str, call: ToolCall) -> str:
        marker = uuidlib.uuid4().hex
        pid, ticks, boot, host = _runner()
        await self._write(
            "INSERT INTO tool_calls (marker, scope, call_id, tool, arguments, runner_pid, "
            "runner_ticks, runner_boot, runner_host, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                marker,
                scope,
                call.id,
                call.name,
                json.dumps(call.arguments),
                pid,
                ticks,
                boot,
                host,
                time.time(),
            ),
        )
        return marker

    async def process(self, marker: str, pgid: int, ticks: int) -> None:
        await self._write(
            "UPDATE tool_calls SET pgid = ?, pgid_ticks = ? WHERE marker = ?",
            (pgid, ticks, marker),
        )

    async def finished(self, marker: str, outcome: str = "done") -> None:
        await self._write(
            "UPDATE tool_calls SET finished_at = ?, outcome = ? WHERE marker = ?",
            (time.time(), outcome, marker),
        )

    async def unfinished(self, scope: str | None = None) -> list[JournalRow]:
        """Calls that started and were never closed (of one scope, or all)."""
        if scope is None:
            return await self._rows("finished_at IS NULL", [])
        return await self._rows("finished_at IS NULL AND scope = ?", [scope])

    async def _rows(self, where: str, params: list[Any]) -> list[JournalRow]:
        if not self._created:
            await self.create()
        sql = f"SELECT * FROM tool_calls WHERE {where} ORDER BY started_at"
        return [JournalRow.of(row) for row in await self.db.fetch(sql, params)]

    async def interrupted_calls(self, scope: str) -> list[JournalRow]:
        """The calls of `scope` that a crash interrupted (open, or closed as
        such): what recovery left, to inspect (recovery itself answers every
        started call without a stored result, `started_calls` and `unanswered`)."""
        where = "scope = ? AND (finished_at IS NULL OR outcome = 'interrupted')"
        return await self._rows(where, [scope])

    async def started_calls(self, scope: str) -> list[JournalRow]:
        """Every call of `scope` that started (open or closed, any outcome)."""
        return await self._rows("scope = ?", [scope])

    async def recover(self, scope: str | None = None) -> list[JournalRow]:
        """Close the open calls `recovery` closes, ending what they left
        running on this machine; returns the rows closed as `interrupted`.

        A journal of one process (not `shared`) holds no lease: it closes
        this machine's dead runners' calls (of `scope`, or all), leaving
        another machine's rows to their owner and a live runner's to itself.
        A `shared` journal closes the calls of `scope`, a conversation whose
        lease the caller holds, whoever wrote them; without a scope (a
        replica starting) it closes nothing."""
        if not self.shared:
            return await self._recover(await self.unfinished(scope), taken_over=False)
        if scope is None:
            return []
        return await self._recover(await self.unfinished(scope), taken_over=True)

    async def _recover(self, rows: list[JournalRow], *, taken_over: bool) -> list[JournalRow]:
        closed, groups = recovery(rows, taken_over=taken_over)
        if groups:
            await anyio.to_thread.run_sync(end_leftovers, groups)
        for row in closed:
            await self.finished(row.marker, "interrupted")
        return closed


def recovery(
    rows: Iterable[JournalRow], *, taken_over: bool
) -> tuple[list[JournalRow], list[tuple[int, int, str]]]:
    """The one recovery rule: of open `rows`, those to close as interrupted,
    and the process groups and markers to end here (`procs.end_leftovers`).

    A row written on this machine whose runner is gone is closed and what it
    left running is ended. One whose runner lives is its own to finish,
    unless `taken_over` (the caller holds the lease that replaced that
    runner: it is closed, and what it left ended). Another machine's row is
    never signalled here, whose process ids name other processes; it is
    closed only when `taken_over`, else left to its owner.
    """
    closed: list[JournalRow] = []
    groups: list[tuple[int, int, str]] = []
    for row in rows:
        here = row.written_here
        if not taken_over and (not here or row.runner_alive):
            continue
        closed.append(row)
        if here:
            groups.append((row.pgid or 0, row.pgid_ticks or 0, row.marker))
    return closed, groups
