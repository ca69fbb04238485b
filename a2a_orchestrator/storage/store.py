"""The store: sessions, children and their event transcripts.

The store is the source of truth; in-memory queues are only wake-up
channels. A child's events (its transcript, and so its result) are written
here before anyone in memory is told, so a crash loses no finished result.

Contract:
- On SQLite, a `Store` owns one sqlite3 connection (`SQLiteFile`): every
  read runs in a worker thread under a lock, so the event loop never blocks
  on disk. A database error is raised as `StoreError`.
- Every write goes through one writer with group commit (`GroupWriter`,
  `PgGroupWriter`): writes that arrive while a commit is in flight are
  committed together, in one transaction (on SQLite, made on the event loop
  when the file is free, else in one thread hop). Each returns once its
  transaction is committed, so whoever is told of an event after its
  append returns reads it from the file.
- One `Store` for both dialects of the database interface (`database/`):
  its statements are written once, with `?` markers, `ON CONFLICT` and
  `RETURNING`, and run on an SQLite file (here) or a PostgreSQL database
  (`store_pg.PgStore`). The schema is each dialect's history
  (`SQLITE_HISTORY`, sqlite-utils migrations; `store_pg.PG_HISTORY`), then
  the one list both apply (`MIGRATIONS`). WAL mode lets the CLI read a
  session while an orchestrator writes it.
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
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any

import sqlite_utils
from sqlite_utils.db import NotFoundError
from sqlite_utils.migrations import Migrations

from ..runtime.budgets import Spend
from .database import Database, Tx
from .database.sqlite import SQLiteDatabase, apply_migrations, create_table
from .groupcommit import GroupWriter
from .journal import TABLE as JOURNAL_TABLE
from .journal import ToolJournal
from .sqlitefile import SQLiteFile

__all__ = [
    "MIGRATIONS",
    "ROOT_ID",
    "SQLITE_HISTORY",
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

SQLITE_HISTORY = Migrations("a2a_orchestrator")
"""The SQLite store's schema up to the one migration list (sqlite-utils
migrations, recorded in `_sqlite_migrations`): applied first, as before."""


@SQLITE_HISTORY()
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


@SQLITE_HISTORY()
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


@SQLITE_HISTORY()
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


@SQLITE_HISTORY()
def m004_remote_identity(db: sqlite_utils.Database) -> None:
    # A remote child's first message id is chosen and stored before it is
    # sent (with the context id, which m001 has), so recovery can find the
    # task a crash kept us from hearing about, or resend the same message.
    db.table("children").add_column("a2a_message_id", str)


@SQLITE_HISTORY()
def m005_tool_calls(db: sqlite_utils.Database) -> None:
    # The tool-call journal of in-process children (see `journal`).
    create_table(db.conn, JOURNAL_TABLE)


@SQLITE_HISTORY()
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


@SQLITE_HISTORY()
def m007_push_tokens(db: sqlite_utils.Database) -> None:
    # The secret a role server sends back with each push notification of a
    # remote child in push mode (transports/push_receiver.py), kept so an
    # orchestrator restarted mid-task still knows its deliveries.
    db.table("push_tokens").create(
        {"child_id": str, "token": str, "created_at": float}, pk="child_id"
    )


@SQLITE_HISTORY()
def m008_tool_call_host(db: sqlite_utils.Database) -> None:
    # Journal rows name their runner's host (`journal.recovery`); the
    # table's own check adds the column.
    create_table(db.conn, JOURNAL_TABLE)


@SQLITE_HISTORY()
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


MIGRATIONS: list[tuple[str, tuple[str, ...]]] = [
    (
        "m010_push_tokens",
        # The SQLite store's m007, which the PostgreSQL store lacked.
        (
            "CREATE TABLE IF NOT EXISTS push_tokens "
            "(child_id TEXT PRIMARY KEY, token TEXT, created_at DOUBLE PRECISION)",
        ),
    ),
]
"""The one migration list of both dialects, from where their histories end
(`SQLITE_HISTORY`, `store_pg.PG_HISTORY`): (name, statements), each
statement valid on both, applied once per database in order, recorded in
`a2a_migrations`."""


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


def _insert_child_sql(row: Mapping[str, Any]) -> str:
    """The INSERT of a child row."""
    return f"INSERT INTO children ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"


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
        # `IN ()` is SQLite's only: no value wanted matches no row.
        clauses.append(f"{column} IN ({', '.join('?' for _ in wanted)})" if wanted else "1 = 0")
        params.extend(wanted)
    return clauses, params


_INSERT_EVENT = (
    "INSERT INTO events (uuid, session_id, child_id, kind, payload, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO NOTHING RETURNING seq"
)
_INSERT_USAGE = (
    f"INSERT INTO turn_usage (uuid, session_id, child_id, {', '.join(_SPEND_COLUMNS)}, "
    "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO NOTHING"
)
# Sums as plain numbers on both dialects (PostgreSQL's sum of BIGINT is NUMERIC).
_SUMS = ", ".join(
    f"CAST(coalesce(sum({c}), 0) AS {'DOUBLE PRECISION' if c in ('seconds', 'cost') else 'BIGINT'})"
    f" AS {c}"
    for c in _SPEND_COLUMNS
)


def _spend(row: Mapping[str, Any]) -> Spend:
    return Spend.from_dict({c: row[c] for c in _SPEND_COLUMNS})


def _event(row: Mapping[str, Any]) -> StoredEvent:
    data = dict(row)
    data["payload"] = json.loads(data["payload"])
    return StoredEvent(**data)


def _session(row: Mapping[str, Any]) -> dict[str, Any]:
    found = dict(row)
    found["metadata"] = json.loads(found["metadata"] or "{}")
    return found


class Store:
    """The orchestrator's store (see the module docstring): an SQLite file,
    or, as `store_pg.PgStore`, a PostgreSQL database replicas share."""

    def __init__(self, path: str | Path) -> None:
        self.path: Path | None = Path(path)
        """The SQLite file; None for a store that is not a file (`store_pg.PgStore`)."""
        self._file = SQLiteFile(path, "store")
        self._db = sqlite_utils.Database(self._file.conn)
        self._db.execute("PRAGMA foreign_keys=ON")
        SQLITE_HISTORY.apply(self._db)
        apply_migrations(self._file.conn, MIGRATIONS)
        writer = GroupWriter(self._file)
        self._write = writer.write
        self.db: Database = SQLiteDatabase(self._file, writer=writer)
        """Where the store's statements run (`database/`)."""
        self.journal = ToolJournal(SQLiteDatabase(self._file))
        """The tool-call journal of this store's in-process children (scope: child id)."""

    def close(self) -> None:
        self._file.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def _fetch(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read."""
        values = list(params)
        return await self.db.read(lambda tx: tx.fetch(sql, values))

    async def _execute(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """One statement in its own (group-committed) transaction; its rows."""
        values = list(params)
        return await self.db.write(lambda tx: tx.fetch(sql, values))

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
        await self._execute(
            "INSERT INTO sessions (id, title, parent_session, metadata, created_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (sid, title, parent_session, json.dumps(dict(metadata or {})), time.time()),
        )
        return sid

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._fetch("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return _session(rows[0]) if rows else None

    async def set_session_metadata(self, session_id: str, key: str, value: Any) -> None:
        """Set one top-level key of a session's metadata to `value` (JSON).

        One UPDATE of that key (the dialect's JSON function): the other keys
        are kept as they are stored, so writers of different keys never undo
        each other."""
        if self.db.dialect == "postgresql":
            sql = (
                "UPDATE sessions SET metadata = jsonb_set("
                "coalesce(nullif(metadata, ''), '{}')::jsonb, ARRAY[?::text], ?::jsonb)::text "
                "WHERE id = ?"
            )
            path = key
        else:
            sql = (
                "UPDATE sessions SET metadata = "
                "json_set(coalesce(nullif(metadata, ''), '{}'), ?, json(?)) WHERE id = ?"
            )
            path = f'$."{key}"'
        await self._execute(sql, (path, json.dumps(value), session_id))

    async def list_sessions(self) -> list[dict[str, Any]]:
        rows = await self._fetch("SELECT * FROM sessions ORDER BY created_at")
        return [_session(row) for row in rows]

    # -- children -------------------------------------------------------------

    async def add_child(self, record: ChildRecord) -> None:
        row = record.to_row()
        await self._execute(_insert_child_sql(row), row.values())

    async def update_child(self, child_id: str, **changes: Any) -> None:
        """Change fields of a child's row; `NotFoundError` when there is none."""
        if "config" in changes:
            changes["config"] = json.dumps(changes["config"])
        assignments = ", ".join(f"{name} = ?" for name in changes) or "child_id = child_id"
        rows = await self._execute(
            f"UPDATE children SET {assignments} WHERE child_id = ? RETURNING child_id",
            [*changes.values(), child_id],
        )
        if not rows:
            raise NotFoundError(child_id)

    async def push_token(self, child_id: str, *, create: bool = True) -> str | None:
        """The webhook token of a child in push mode: made (random) and stored
        on first use unless `create` is off (then None when there is none)."""
        if create:
            await self._execute(
                "INSERT INTO push_tokens (child_id, token, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (child_id) DO NOTHING",
                (child_id, secrets.token_urlsafe(32), time.time()),
            )
        rows = await self._fetch("SELECT token FROM push_tokens WHERE child_id = ?", (child_id,))
        return str(rows[0]["token"]) if rows else None

    async def get_child(self, child_id: str) -> ChildRecord | None:
        rows = await self._fetch("SELECT * FROM children WHERE child_id = ?", (child_id,))
        return ChildRecord.from_row(rows[0]) if rows else None

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
        where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
        rows = await self._fetch(f"SELECT * FROM children {where}ORDER BY created_at", params)
        return [ChildRecord.from_row(row) for row in rows]

    # -- subscriptions --------------------------------------------------------

    async def put_subscription(
        self, subscription_id: str, session_id: str, parent_id: str, spec: Mapping[str, Any]
    ) -> None:
        await self._execute(
            "INSERT INTO subscriptions (id, session_id, parent_id, spec, created_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "session_id = excluded.session_id, parent_id = excluded.parent_id, "
            "spec = excluded.spec, created_at = excluded.created_at",
            (subscription_id, session_id, parent_id, json.dumps(dict(spec)), time.time()),
        )

    async def delete_subscription(self, subscription_id: str) -> bool:
        rows = await self._execute(
            "DELETE FROM subscriptions WHERE id = ? RETURNING id", (subscription_id,)
        )
        return bool(rows)

    async def subscriptions(self, session_id: str, parent_id: str) -> list[dict[str, Any]]:
        rows = await self._fetch(
            "SELECT id, spec FROM subscriptions WHERE session_id = ? AND parent_id = ? "
            "ORDER BY created_at",
            (session_id, parent_id),
        )
        return [{"id": row["id"], **json.loads(row["spec"])} for row in rows]

    # -- runners ----------------------------------------------------------------

    async def put_runner(self, record: RunnerRecord) -> None:
        """Record the session's runner, replacing the previous one."""
        row = asdict(record)
        updates = ", ".join(f"{k} = excluded.{k}" for k in row if k != "session_id")
        await self._execute(
            f"INSERT INTO runners ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)}) "
            f"ON CONFLICT (session_id) DO UPDATE SET {updates}",
            row.values(),
        )

    async def get_runner(self, session_id: str) -> RunnerRecord | None:
        rows = await self._fetch("SELECT * FROM runners WHERE session_id = ?", (session_id,))
        return RunnerRecord.from_row(rows[0]) if rows else None

    async def update_runner(
        self, session_id: str, token: str, **changes: Any
    ) -> RunnerRecord | None:
        """Change the runner row while registration `token` owns it; the row
        after the change, or None when another registration (or none) owns it."""
        assignments = ", ".join(f"{name} = ?" for name in changes)
        rows = await self._execute(
            f"UPDATE runners SET {assignments} WHERE session_id = ? AND token = ? RETURNING *",
            [*changes.values(), session_id, token],
        )
        return RunnerRecord.from_row(rows[0]) if rows else None

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

        async def insert(tx: Tx) -> list[StoredEvent | None]:
            stored: list[StoredEvent | None] = []
            if child_row is not None:
                await tx.execute(_insert_child_sql(child_row), list(child_row.values()))
            if changes and batch and batch[0][1] is not None:
                assignments = ", ".join(f"{name} = ?" for name in changes)
                await tx.execute(
                    f"UPDATE children SET {assignments} WHERE child_id = ?",
                    [*changes.values(), batch[0][1]],
                )
            for entry in batch:
                values = _event_values(entry)
                row = await tx.fetchrow(_INSERT_EVENT, values)
                if row is None:  # its uuid is stored already
                    stored.append(None)
                    continue
                usage = _usage_values(values, entry[3])
                if usage is not None:
                    await tx.execute(_INSERT_USAGE, usage)
                stored.append(_stored_event(int(row["seq"]), values, entry[3]))
            return stored

        return await self.db.write(insert)

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
        return [_event(row) for row in await self._fetch(sql, params)]

    async def last_root_turn_end(self, session_id: str) -> StoredEvent | None:
        """The event that ended the root parent agent's last turn, or None.
        Found through its `turn_usage` row, so reading it costs the session's
        turns, not its events (every view's outcome reads it, `outcome.py`)."""
        rows = await self._fetch(
            "SELECT e.* FROM turn_usage t JOIN events e ON e.uuid = t.uuid"
            # `|| ''`: by the session's index, not child_id's (every root's '').
            " WHERE t.session_id = ? AND t.child_id || '' = ? ORDER BY e.seq DESC LIMIT 1",
            (session_id, ROOT_ID),
        )
        return _event(rows[0]) if rows else None

    # -- usage ------------------------------------------------------------------

    async def child_usage(self, session_id: str) -> dict[str, Spend]:
        """Each child's own spend (its finished turns), by child id; the root
        parent agent's under `ROOT_ID`."""
        rows = await self._fetch(
            f"SELECT child_id, {_SUMS} FROM turn_usage WHERE session_id = ? GROUP BY child_id",
            (session_id,),
        )
        return {row["child_id"]: _spend(row) for row in rows}

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
        rows = await self._fetch(
            f"""
            WITH RECURSIVE below(id) AS (
                SELECT child_id FROM children WHERE session_id = ? AND parent_id = ?
                UNION
                SELECT c.child_id FROM children c JOIN below b ON c.parent_id = b.id
            )
            SELECT {_SUMS} FROM turn_usage WHERE child_id IN (SELECT id FROM below)
            """,
            (session_id, child_id),
        )
        return _spend(rows[0])

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
