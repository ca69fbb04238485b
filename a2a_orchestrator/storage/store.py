"""The store: sessions, children and their event transcripts, in SQLite.

The store is the source of truth; in-memory queues are only wake-up
channels. A child's events (its transcript, and so its result) are written
here before anyone in memory is told, so a crash loses no finished result.

Contract:
- One `Store` owns one sqlite3 connection (`SQLiteFile`): every call runs
  in a worker thread under a lock, so the event loop never blocks on disk.
  A sqlite3 error is raised as `StoreError`.
- Writes on a child's critical path (events, the child's row) go through
  one writer with group commit (`GroupWriter`): writes that arrive while a
  commit is in flight are committed together, in one transaction and one
  thread hop. Each returns once its transaction is committed, so whoever
  is told of an event after its append returns reads it from the file.
- The schema lives in `MIGRATIONS` (sqlite-utils migrations); WAL mode lets
  the CLI read a session while an orchestrator writes it.
- Events are keyed by uuid: appending a uuid twice is a no-op that reports
  False, which is how readers that absorb events de-duplicate.
- Usage: every event that ends a turn (done, failed, input_required) of a
  child, or of the session's root parent agent (under `ROOT_ID`), writes
  that turn's spend into `turn_usage`, keyed by the event's uuid, in the
  same transaction. Totals (a child's, a subtree's, a session's) are sums
  over those rows, so they are exact after a crash and a resume: a turn is
  counted once whoever stores its end, and never twice. `session_usage` is
  the one sum every view of a session's total reads.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, TypeVar

import sqlite_utils
from sqlite_utils.db import NotFoundError
from sqlite_utils.migrations import Migrations

from ..runtime.budgets import Spend
from .database.sqlite import SQLiteDatabase, create_table
from .groupcommit import GroupWriter
from .journal import TABLE as JOURNAL_TABLE
from .journal import ToolJournal
from .sqlitefile import SQLiteFile

__all__ = [
    "MIGRATIONS",
    "ROOT_ID",
    "TURN_END_KINDS",
    "ChildRecord",
    "RunnerRecord",
    "Store",
    "StoredEvent",
]

TURN_END_KINDS = ("done", "failed", "input_required")
"""Stored event kinds that end a child's turn and carry its spend."""

ROOT_ID = ""
"""The `turn_usage` child id of the session's root (its parent agent, whose
events are stored with no child id): its spend is part of the session's."""

_SPEND_COLUMNS = ("input_tokens", "output_tokens", "model_calls", "seconds", "cost")

T = TypeVar("T")

MIGRATIONS = Migrations("a2a_orchestrator")


@MIGRATIONS()
def m001_initial(db: sqlite_utils.Database) -> None:
    db.table("sessions").create(
        {
            "id": str,
            "title": str,
            "parent_session": str,
            "metadata": str,
            "created_at": float,
        },
        pk="id",
    )
    db.table("children").create(
        {
            "child_id": str,
            "session_id": str,
            "parent_id": str,
            "task_id": str,
            "agent": str,
            "role": str,
            "model": str,
            "status": str,
            "reason": str,
            "transport": str,
            "url": str,
            "a2a_task_id": str,
            "a2a_context_id": str,
            "trace_id": str,
            "config": str,
            "result": str,
            "depth": int,
            "created_at": float,
            "completed_at": float,
        },
        pk="child_id",
        not_null={"session_id", "role", "status", "transport", "trace_id", "created_at"},
        foreign_keys=[("session_id", "sessions", "id")],
    )
    db.table("children").create_index(["session_id"])
    db.table("children").create_index(["parent_id"])
    # `seq` orders a session's events for paging; `uuid` de-duplicates them.
    db.execute(
        """
        CREATE TABLE events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            uuid TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            child_id TEXT,
            kind TEXT NOT NULL,
            payload TEXT NOT NULL,
            created_at REAL NOT NULL
        )
        """
    )
    db.table("events").create_index(["session_id", "seq"])
    db.table("events").create_index(["child_id", "seq"])


@MIGRATIONS()
def m002_subscriptions(db: sqlite_utils.Database) -> None:
    # Supervisor subscriptions outlive the process that made them.
    db.table("subscriptions").create(
        {
            "id": str,
            "session_id": str,
            "parent_id": str,
            "spec": str,
            "created_at": float,
        },
        pk="id",
        foreign_keys=[("session_id", "sessions", "id")],
    )
    db.table("subscriptions").create_index(["session_id", "parent_id"])


@MIGRATIONS()
def m003_runners(db: sqlite_utils.Database) -> None:
    # Which process runs each session (`runner.py`), so `stop` can tell a live
    # runner (ask it to stop its children) from a dead one (nobody runs them).
    # One row per session: a process that opens the session again replaces it.
    db.table("runners").create(
        {
            "session_id": str,
            "token": str,
            "pid": int,
            "host": str,
            "boot_id": str,
            "start_ticks": int,
            "stop_signal": int,
            "started_at": float,
            "heartbeat_at": float,
            "ended_at": float,
            "stop_request": str,
            "stop_confirmed": str,
            "stopped": int,
        },
        pk="session_id",
        not_null={"token", "pid", "host", "started_at", "heartbeat_at"},
        foreign_keys=[("session_id", "sessions", "id")],
    )


@dataclass(frozen=True, kw_only=True)
class RunnerRecord:
    """One row of the runners table: the process that runs a session."""

    session_id: str
    token: str
    """Which registration this is; only its owner refreshes or ends the row."""
    pid: int
    host: str
    """`socket.gethostname()` of the runner."""
    boot_id: str
    """The host's boot id when the runner started (a reboot ends every runner)."""
    start_ticks: int
    """The runner's start time in clock ticks since boot (a reused pid differs)."""
    started_at: float
    heartbeat_at: float
    stop_signal: int = 0
    """The signal that wakes the runner to read a stop request; 0 when it has none."""
    ended_at: float | None = None
    """When the runner closed the session; None while it runs (or if it crashed)."""
    stop_request: str = ""
    """The id of the last stop request written by `stop`."""
    stop_confirmed: str = ""
    """The id of the last stop request the runner carried out."""
    stopped: int = 0
    """How many children the runner stopped for that request."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunnerRecord:
        names = {f.name for f in fields(cls)}
        data = {k: v for k, v in row.items() if k in names}
        for key in ("boot_id", "stop_request", "stop_confirmed"):
            data[key] = data.get(key) or ""
        for key in ("start_ticks", "stop_signal", "stopped"):
            data[key] = data.get(key) or 0
        return cls(**data)


@MIGRATIONS()
def m004_remote_identity(db: sqlite_utils.Database) -> None:
    # A remote child's first message id is chosen and stored before it is
    # sent (with the context id, which m001 has), so recovery can find the
    # task a crash kept us from hearing about, or resend the same message.
    db.table("children").add_column("a2a_message_id", str)


@MIGRATIONS()
def m005_tool_calls(db: sqlite_utils.Database) -> None:
    # The tool-call journal of in-process children (see `journal`).
    create_table(db.conn, JOURNAL_TABLE)


@MIGRATIONS()
def m006_turn_usage(db: sqlite_utils.Database) -> None:
    # One row per turn of a child, keyed by the uuid of the event that ended
    # it: totals are sums of these rows, and a replayed event adds nothing.
    db.execute(
        """
        CREATE TABLE turn_usage (
            uuid TEXT PRIMARY KEY,
            session_id TEXT NOT NULL REFERENCES sessions(id),
            child_id TEXT NOT NULL,
            input_tokens INTEGER NOT NULL DEFAULT 0,
            output_tokens INTEGER NOT NULL DEFAULT 0,
            model_calls INTEGER NOT NULL DEFAULT 0,
            seconds REAL NOT NULL DEFAULT 0,
            cost REAL NOT NULL DEFAULT 0,
            created_at REAL NOT NULL
        )
        """
    )
    db.table("turn_usage").create_index(["session_id"])
    db.table("turn_usage").create_index(["child_id"])
    # Turns stored before this migration had only their tokens (`usage`).
    db.execute(
        """
        INSERT OR IGNORE INTO turn_usage
            (uuid, session_id, child_id, input_tokens, output_tokens, created_at)
        SELECT uuid, session_id, child_id,
               coalesce(json_extract(payload, '$.usage.input_tokens'), 0),
               coalesce(json_extract(payload, '$.usage.output_tokens'), 0),
               created_at
        FROM events
        WHERE kind IN ('done', 'failed') AND child_id IS NOT NULL
        """
    )


@MIGRATIONS()
def m007_push_tokens(db: sqlite_utils.Database) -> None:
    # The secret a role server sends back with each push notification of a
    # remote child in push mode (transports/push_receiver.py), kept so an
    # orchestrator restarted mid-task still knows its deliveries.
    db.table("push_tokens").create(
        {"child_id": str, "token": str, "created_at": float}, pk="child_id"
    )


@MIGRATIONS()
def m008_tool_call_host(db: sqlite_utils.Database) -> None:
    # Journal rows name their runner's host (`journal.recovery`); the
    # table's own check adds the column.
    create_table(db.conn, JOURNAL_TABLE)


@MIGRATIONS()
def m009_root_usage(db: sqlite_utils.Database) -> None:
    # The root parent agent's turns were not counted before: their ends are
    # stored with no child id. Counted now under ROOT_ID, from their spend.
    spent = ", ".join(f"coalesce(json_extract(payload, '$.spent.{c}'), 0)" for c in _SPEND_COLUMNS)
    db.execute(
        f"""
        INSERT OR IGNORE INTO turn_usage
            (uuid, session_id, child_id, {", ".join(_SPEND_COLUMNS)}, created_at)
        SELECT uuid, session_id, '', {spent}, created_at
        FROM events
        WHERE kind IN {TURN_END_KINDS!r} AND child_id IS NULL
        """
    )


@dataclass(frozen=True, kw_only=True)
class ChildRecord:
    """One row of the children table."""

    child_id: str
    session_id: str
    role: str
    status: str
    """running, input_required, completed, failed (the last turn's outcome)."""
    transport: str
    """`local` (in-process) or `remote` (A2A over HTTP)."""
    trace_id: str
    created_at: float
    parent_id: str = ""
    """The child id of the parent, or "" when the session's root spawned it."""
    task_id: str = ""
    """The parent's task (turn) the child was spawned for."""
    agent: str = ""
    model: str = ""
    reason: str = ""
    """For failed children: error, max_turns, aborted, timeout or lost."""
    url: str = ""
    a2a_task_id: str = ""
    a2a_context_id: str = ""
    a2a_message_id: str = ""
    """The id of the message that opened the child's newest task (remote);
    stored before sending it, so recovery can find that task by it."""
    config: dict[str, Any] = field(default_factory=dict)
    result: str = ""
    depth: int = 1
    completed_at: float | None = None

    def to_row(self) -> dict[str, Any]:
        # Field by field: every field but `config` is a scalar, and `asdict`
        # deep-copied the config only for it to be dumped to JSON.
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["config"] = json.dumps(self.config)
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ChildRecord:
        names = {f.name for f in fields(cls)}
        data = {k: v for k, v in row.items() if k in names}
        data["config"] = json.loads(data.get("config") or "{}")
        for key in ("parent_id", "task_id", "agent", "model", "reason", "url", "result"):
            data[key] = data.get(key) or ""
        data["a2a_task_id"] = data.get("a2a_task_id") or ""
        data["a2a_context_id"] = data.get("a2a_context_id") or ""
        data["a2a_message_id"] = data.get("a2a_message_id") or ""
        return cls(**data)


def _insert_child_sql(row: Mapping[str, Any], marker: str = "?") -> str:
    """The INSERT of a child row, with `marker` for each parameter (SQLite's
    `?`, PostgreSQL's `%s`)."""
    return f"INSERT INTO children ({', '.join(row)}) VALUES ({', '.join(marker for _ in row)})"


EventEntry = tuple[str, str | None, str, Mapping[str, Any], str | None]
"""(session, child, kind, payload, uuid): one event `append_events` stores."""
EventValues = tuple[str, str, str | None, str, str, float]
"""(uuid, session, child, kind, payload JSON, created_at): an events row."""


def _event_values(entry: EventEntry) -> EventValues:
    """An entry's events row (a new uuid when it has none, stamped now);
    the same for both stores, whose SQL differs only in its dialect."""
    session_id, child_id, kind, payload, uuid = entry
    return (
        uuid or uuidlib.uuid4().hex,
        session_id,
        child_id,
        kind,
        json.dumps(dict(payload)),
        time.time(),
    )


def _usage_values(values: EventValues, payload: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The turn_usage row of an event that ends a turn (None for others)."""
    event_uuid, session_id, child_id, kind, _, now = values
    if kind not in TURN_END_KINDS:
        return None
    child_id = child_id or ROOT_ID
    spend = Spend.from_dict(payload.get("spent"))
    return (
        event_uuid,
        session_id,
        child_id,
        spend.input_tokens,
        spend.output_tokens,
        spend.model_calls,
        spend.seconds,
        spend.cost,
        now,
    )


def _stored_event(seq: int, values: EventValues, payload: Mapping[str, Any]) -> StoredEvent:
    event_uuid, session_id, child_id, kind, _, now = values
    return StoredEvent(
        seq=seq,
        uuid=event_uuid,
        session_id=session_id,
        child_id=child_id,
        kind=kind,
        payload=dict(payload),
        created_at=now,
    )


@dataclass(frozen=True, kw_only=True)
class StoredEvent:
    """One transcript entry: a child event, or an input given to a child."""

    seq: int
    uuid: str
    session_id: str
    child_id: str | None
    kind: str
    payload: dict[str, Any]
    created_at: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _filters(
    equal: Mapping[str, Any], column: str, one_of: Iterable[str] | None
) -> tuple[list[str], list[Any]]:
    """WHERE clauses and parameters: each non-None `equal` value must match,
    and `column` must be one of `one_of` when it is given."""
    clauses = [f"{name} = ?" for name, value in equal.items() if value is not None]
    params: list[Any] = [value for value in equal.values() if value is not None]
    if one_of is not None:
        wanted = list(one_of)
        clauses.append(f"{column} IN ({', '.join('?' for _ in wanted)})")
        params.extend(wanted)
    return clauses, params


class Store:
    """SQLite store for one orchestrator (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path: Path | None = Path(path)
        """The SQLite file; None for a store that is not a file (`store_pg.PgStore`)."""
        self._file = SQLiteFile(path, "store")
        self._db = sqlite_utils.Database(self._file.conn)
        self._db.execute("PRAGMA foreign_keys=ON")
        MIGRATIONS.apply(self._db)
        self._run = self._file.run
        self._write = GroupWriter(self._file).write
        self.journal = ToolJournal(SQLiteDatabase(self._file))
        """The tool-call journal of this store's in-process children (scope: child id)."""

    def close(self) -> None:
        self._file.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- sessions -------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        title: str = "",
        parent_session: str = "",
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Create a session (or keep the existing one of that id); return its id."""
        sid = session_id or uuidlib.uuid4().hex
        row = {
            "id": sid,
            "title": title,
            "parent_session": parent_session,
            "metadata": json.dumps(dict(metadata or {})),
            "created_at": time.time(),
        }
        await self._run(lambda: self._db.table("sessions").insert(row, ignore=True))
        return sid

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        def get() -> dict[str, Any] | None:
            rows = list(self._db["sessions"].rows_where("id = ?", [session_id]))
            if not rows:
                return None
            row = dict(rows[0])
            row["metadata"] = json.loads(row["metadata"] or "{}")
            return row

        return await self._run(get)

    async def set_session_metadata(self, session_id: str, key: str, value: Any) -> None:
        """Set one top-level key of a session's metadata to `value` (JSON).

        One UPDATE with `json_set`: the other keys are kept as they are in the
        file, so writers of different keys never undo each other."""

        def update() -> None:
            with self._db.conn:
                self._db.conn.execute(
                    "UPDATE sessions SET metadata = "
                    "json_set(coalesce(nullif(metadata, ''), '{}'), ?, json(?)) WHERE id = ?",
                    (f'$."{key}"', json.dumps(value), session_id),
                )

        await self._run(update)

    async def list_sessions(self) -> list[dict[str, Any]]:
        def rows() -> list[dict[str, Any]]:
            found = [dict(r) for r in self._db["sessions"].rows_where(order_by="created_at")]
            for row in found:
                row["metadata"] = json.loads(row["metadata"] or "{}")
            return found

        return await self._run(rows)

    # -- children -------------------------------------------------------------

    async def add_child(self, record: ChildRecord) -> None:
        row = record.to_row()
        await self._write(lambda conn: conn.execute(_insert_child_sql(row), list(row.values())))

    async def update_child(self, child_id: str, **changes: Any) -> None:
        """Change fields of a child's row; `NotFoundError` when there is none."""
        if "config" in changes:
            changes["config"] = json.dumps(changes["config"])
        assignments = ", ".join(f"{name} = ?" for name in changes) or "child_id = child_id"

        def update(conn: sqlite3.Connection) -> None:
            cursor = conn.execute(
                f"UPDATE children SET {assignments} WHERE child_id = ?",
                [*changes.values(), child_id],
            )
            if cursor.rowcount == 0:
                raise NotFoundError(child_id)

        await self._write(update)

    async def push_token(self, child_id: str, *, create: bool = True) -> str | None:
        """The webhook token of a child in push mode: made (random) and stored
        on first use unless `create` is off (then None when there is none)."""
        fresh = secrets.token_urlsafe(32)

        def make(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR IGNORE INTO push_tokens (child_id, token, created_at) VALUES (?, ?, ?)",
                [child_id, fresh, time.time()],
            )

        if create:
            await self._write(make)

        def read() -> str | None:
            row = self._db.execute(
                "SELECT token FROM push_tokens WHERE child_id = ?", [child_id]
            ).fetchone()
            return str(row[0]) if row else None

        return await self._run(read)

    async def get_child(self, child_id: str) -> ChildRecord | None:
        def get() -> ChildRecord | None:
            rows = list(self._db["children"].rows_where("child_id = ?", [child_id]))
            return ChildRecord.from_row(rows[0]) if rows else None

        return await self._run(get)

    async def list_children(
        self,
        *,
        session_id: str | None = None,
        parent_id: str | None = None,
        statuses: Iterable[str] | None = None,
    ) -> list[ChildRecord]:
        clauses, params = _filters(
            {"session_id": session_id, "parent_id": parent_id}, "status", statuses
        )
        where = " AND ".join(clauses) or None

        def rows() -> list[ChildRecord]:
            return [
                ChildRecord.from_row(r)
                for r in self._db["children"].rows_where(where, params, order_by="created_at")
            ]

        return await self._run(rows)

    # -- subscriptions --------------------------------------------------------

    async def put_subscription(
        self, subscription_id: str, session_id: str, parent_id: str, spec: Mapping[str, Any]
    ) -> None:
        row = {
            "id": subscription_id,
            "session_id": session_id,
            "parent_id": parent_id,
            "spec": json.dumps(dict(spec)),
            "created_at": time.time(),
        }
        await self._run(lambda: self._db.table("subscriptions").insert(row, replace=True))

    async def delete_subscription(self, subscription_id: str) -> bool:
        def delete() -> bool:
            with self._db.conn:
                cursor = self._db.conn.execute(
                    "DELETE FROM subscriptions WHERE id = ?", (subscription_id,)
                )
            return cursor.rowcount > 0

        return await self._run(delete)

    async def subscriptions(self, session_id: str, parent_id: str) -> list[dict[str, Any]]:
        def rows() -> list[dict[str, Any]]:
            found = self._db["subscriptions"].rows_where(
                "session_id = ? AND parent_id = ?", [session_id, parent_id], order_by="created_at"
            )
            return [{"id": r["id"], **json.loads(r["spec"])} for r in found]

        return await self._run(rows)

    # -- runners ----------------------------------------------------------------

    async def put_runner(self, record: RunnerRecord) -> None:
        """Record the session's runner, replacing the previous one."""
        await self._run(lambda: self._db.table("runners").insert(asdict(record), replace=True))

    async def get_runner(self, session_id: str) -> RunnerRecord | None:
        def get() -> RunnerRecord | None:
            rows = list(self._db["runners"].rows_where("session_id = ?", [session_id]))
            return RunnerRecord.from_row(rows[0]) if rows else None

        return await self._run(get)

    async def update_runner(
        self, session_id: str, token: str, **changes: Any
    ) -> RunnerRecord | None:
        """Change the runner row while registration `token` owns it; the row
        after the change, or None when another registration (or none) owns it."""
        assignments = ", ".join(f"{name} = ?" for name in changes)

        def update() -> RunnerRecord | None:
            with self._db.conn:
                cursor = self._db.conn.execute(
                    f"UPDATE runners SET {assignments} WHERE session_id = ? AND token = ?",
                    [*changes.values(), session_id, token],
                )
                if cursor.rowcount == 0:
                    return None
                rows = list(self._db["runners"].rows_where("session_id = ?", [session_id]))
            return RunnerRecord.from_row(rows[0])

        return await self._run(update)

    # -- events ---------------------------------------------------------------

    async def append_event(
        self,
        session_id: str,
        kind: str,
        payload: Mapping[str, Any],
        *,
        child_id: str | None = None,
        uuid: str | None = None,
        child_changes: Mapping[str, Any] | None = None,
    ) -> StoredEvent | None:
        """Append one transcript entry; None when its uuid is stored already.

        `child_changes` updates the child's row in the same transaction (a
        terminal event and the child's new status land together or not at all).
        """
        entry = (session_id, child_id, kind, payload, uuid)
        return (await self.append_events([entry], child_changes=child_changes))[0]

    async def append_events(
        self,
        entries: Iterable[EventEntry],
        *,
        child_changes: Mapping[str, Any] | None = None,
        new_child: ChildRecord | None = None,
    ) -> list[StoredEvent | None]:
        """Append several entries atomically, in order (session, child, kind,
        payload, uuid); `new_child` is added in the same transaction, first
        (a spawn's row and its first input: one commit, not two)."""
        batch = list(entries)
        changes = dict(child_changes or {})
        child_row = new_child.to_row() if new_child is not None else None

        def insert(conn: sqlite3.Connection) -> list[StoredEvent | None]:
            stored: list[StoredEvent | None] = []
            if child_row is not None:
                conn.execute(_insert_child_sql(child_row), list(child_row.values()))
            if changes and batch and batch[0][1] is not None:
                assignments = ", ".join(f"{name} = ?" for name in changes)
                conn.execute(
                    f"UPDATE children SET {assignments} WHERE child_id = ?",
                    [*changes.values(), batch[0][1]],
                )
            for entry in batch:
                values = _event_values(entry)
                cursor = conn.execute(
                    "INSERT OR IGNORE INTO events "
                    "(uuid, session_id, child_id, kind, payload, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    values,
                )
                if cursor.rowcount == 0:
                    stored.append(None)
                    continue
                usage = _usage_values(values, entry[3])
                if usage is not None:
                    conn.execute(
                        "INSERT OR IGNORE INTO turn_usage (uuid, session_id, child_id, "
                        f"{', '.join(_SPEND_COLUMNS)}, created_at) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        usage,
                    )
                stored.append(_stored_event(int(cursor.lastrowid or 0), values, entry[3]))
            return stored

        return await self._write(insert)

    async def events(
        self,
        session_id: str | None = None,
        *,
        child_id: str | None = None,
        after: int = 0,
        limit: int | None = None,
        kinds: Iterable[str] | None = None,
    ) -> list[StoredEvent]:
        """Events in order of `seq`, after `after`, optionally only of one child or kinds."""
        clauses, params = _filters({"session_id": session_id, "child_id": child_id}, "kind", kinds)
        clauses.insert(0, "seq > ?")
        params.insert(0, after)
        sql = f"SELECT * FROM events WHERE {' AND '.join(clauses)} ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)

        def rows() -> list[StoredEvent]:
            cursor = self._db.conn.execute(sql, params)
            names = [d[0] for d in cursor.description]
            out = []
            for values in cursor.fetchall():
                row = dict(zip(names, values, strict=True))
                row["payload"] = json.loads(row["payload"])
                out.append(StoredEvent(**row))
            return out

        return await self._run(rows)

    async def last_root_turn_end(self, session_id: str) -> StoredEvent | None:
        """The event that ended the root parent agent's last turn, or None.
        Found through its `turn_usage` row, so reading it costs the session's
        turns, not its events (every view's outcome reads it, `outcome.py`)."""

        def row() -> StoredEvent | None:
            cursor = self._db.conn.execute(
                "SELECT e.* FROM turn_usage t JOIN events e ON e.uuid = t.uuid"
                # `+`: by the session's index, not child_id's (every root's '').
                " WHERE t.session_id = ? AND +t.child_id = ? ORDER BY e.seq DESC LIMIT 1",
                (session_id, ROOT_ID),
            )
            values = cursor.fetchone()
            if values is None:
                return None
            data = dict(zip([d[0] for d in cursor.description], values, strict=True))
            data["payload"] = json.loads(data["payload"])
            return StoredEvent(**data)

        return await self._run(row)

    # -- usage ------------------------------------------------------------------

    async def child_usage(self, session_id: str) -> dict[str, Spend]:
        """Each child's own spend (its finished turns), by child id; the root
        parent agent's under `ROOT_ID`."""
        sums = ", ".join(f"sum({column})" for column in _SPEND_COLUMNS)

        def rows() -> dict[str, Spend]:
            cursor = self._db.conn.execute(
                f"SELECT child_id, {sums} FROM turn_usage WHERE session_id = ? GROUP BY child_id",
                (session_id,),
            )
            return {
                row[0]: Spend.from_dict(dict(zip(_SPEND_COLUMNS, row[1:], strict=True)))
                for row in cursor.fetchall()
            }

        return await self._run(rows)

    async def subtree_usage(self, session_id: str) -> dict[str, Spend]:
        """Each child's spend with its descendants', by child id."""
        own = await self.child_usage(session_id)
        children = await self.list_children(session_id=session_id)
        parent_of = {c.child_id: c.parent_id for c in children}
        totals = {c.child_id: Spend() for c in children}
        for child_id, spend in own.items():
            # Up the parent chain: each ancestor's subtree holds this spend.
            seen: set[str] = set()
            node: str = child_id
            while node and node in totals and node not in seen:
                seen.add(node)
                totals[node] = totals[node] + spend
                node = parent_of.get(node, "")
        return totals

    async def descendants_usage(self, session_id: str, child_id: str) -> Spend:
        """What a child's children, theirs, and so on spent (not the child itself)."""
        sums = ", ".join(f"coalesce(sum({column}), 0)" for column in _SPEND_COLUMNS)
        sql = f"""
            WITH RECURSIVE below(id) AS (
                SELECT child_id FROM children WHERE session_id = ? AND parent_id = ?
                UNION
                SELECT c.child_id FROM children c JOIN below b ON c.parent_id = b.id
            )
            SELECT {sums} FROM turn_usage WHERE child_id IN (SELECT id FROM below)
        """

        def total() -> Spend:
            row = self._db.conn.execute(sql, (session_id, child_id)).fetchone()
            return Spend.from_dict(dict(zip(_SPEND_COLUMNS, row, strict=True)))

        return await self._run(total)

    async def session_usage(self, session_id: str) -> Spend:
        """What the session spent, in total: its root parent agent and every
        child (remote or local, pipeline passes among them)."""
        return sum((await self.child_usage(session_id)).values(), Spend())

    async def export_jsonl(self, session_id: str, out: IO[str]) -> int:
        """Write one session's event log as JSON lines; return how many."""
        count = 0
        after = 0
        while True:
            page = await self.events(session_id, after=after, limit=1000)
            if not page:
                return count
            for event in page:
                out.write(json.dumps(event.as_json(), ensure_ascii=False) + "\n")
            count += len(page)
            after = page[-1].seq
