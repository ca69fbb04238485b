"""`PgStore`: the orchestrator's store in PostgreSQL, shared by replicas.

The same store as `store.Store` (sessions, children, events, turn usage,
subscriptions, runners, the tool-call journal), with the same contract, in
a PostgreSQL database several orchestrator processes share; plus session
leases (`leases`, `leases.py`), which say which replica runs each session
(`session_leases.py`).

Contract (what differs from the SQLite store, and why):
- One asyncpg connection per store, one call at a time
  (`database.postgres.PgConnection`), so statements and transactions never
  interleave. It is opened, and the migrations applied, at the first call.
  A database error is a `StoreError`.
- Writes on a child's critical path go through a group-commit writer
  (`PgGroupWriter`): writes arriving while a commit is in flight are
  committed together; each returns once its transaction is committed, so
  nothing is announced before it is in the database.
- Migrations (`MIGRATIONS`) are applied in one transaction under an advisory
  lock: replicas starting at once apply each migration once, in order.
- `seq` orders events as SQLite's does. PostgreSQL hands out sequence
  numbers before commit, so two writers' events could commit out of order;
  one session has one writer (its lease holder, through one connection), so
  within a session `seq` order is commit order and paging by `seq` is safe.
- Times of leases are the database's clock, so replicas' clocks need not agree.
"""

from __future__ import annotations

import json
import time
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any, TypeVar

from ..runtime.budgets import Spend
from .database.postgres import PgConnection, PgDatabase, PgGroupWriter, Tx
from .journal import ToolJournal
from .leases import TABLE as LEASES_TABLE
from .leases import LeaseTable
from .store import (
    _SPEND_COLUMNS,
    ROOT_ID,
    ChildRecord,
    EventEntry,
    RunnerRecord,
    Store,
    StoredEvent,
    _event_values,
    _insert_child_sql,
    _stored_event,
    _usage_values,
)

__all__ = ["MIGRATIONS", "PgStore"]

T = TypeVar("T")

_NOW = "extract(epoch from clock_timestamp())::float8"

MIGRATIONS: list[tuple[str, str]] = [
    (
        "m001_initial",
        """
        CREATE TABLE sessions (
            id TEXT PRIMARY KEY, title TEXT, parent_session TEXT, metadata TEXT,
            created_at DOUBLE PRECISION
        );
        CREATE TABLE children (
            child_id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
            parent_id TEXT, task_id TEXT, agent TEXT, role TEXT NOT NULL, model TEXT,
            status TEXT NOT NULL, reason TEXT, transport TEXT NOT NULL, url TEXT,
            a2a_task_id TEXT, a2a_context_id TEXT, a2a_message_id TEXT,
            trace_id TEXT NOT NULL, config TEXT, result TEXT, depth INTEGER,
            created_at DOUBLE PRECISION NOT NULL, completed_at DOUBLE PRECISION
        );
        CREATE INDEX children_session ON children (session_id);
        CREATE INDEX children_parent ON children (parent_id);
        CREATE TABLE events (
            seq BIGSERIAL PRIMARY KEY, uuid TEXT NOT NULL UNIQUE,
            session_id TEXT NOT NULL REFERENCES sessions(id), child_id TEXT,
            kind TEXT NOT NULL, payload TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX events_session ON events (session_id, seq);
        CREATE INDEX events_child ON events (child_id, seq);
        CREATE TABLE subscriptions (
            id TEXT PRIMARY KEY, session_id TEXT REFERENCES sessions(id), parent_id TEXT,
            spec TEXT, created_at DOUBLE PRECISION
        );
        CREATE INDEX subscriptions_parent ON subscriptions (session_id, parent_id);
        CREATE TABLE runners (
            session_id TEXT PRIMARY KEY REFERENCES sessions(id), token TEXT NOT NULL,
            pid BIGINT NOT NULL, host TEXT NOT NULL, boot_id TEXT, start_ticks BIGINT,
            stop_signal INTEGER, started_at DOUBLE PRECISION NOT NULL,
            heartbeat_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION,
            stop_request TEXT, stop_confirmed TEXT, stopped INTEGER
        );
        CREATE TABLE turn_usage (
            uuid TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id),
            child_id TEXT NOT NULL, input_tokens BIGINT NOT NULL DEFAULT 0,
            output_tokens BIGINT NOT NULL DEFAULT 0, model_calls BIGINT NOT NULL DEFAULT 0,
            seconds DOUBLE PRECISION NOT NULL DEFAULT 0, cost DOUBLE PRECISION NOT NULL DEFAULT 0,
            created_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX turn_usage_session ON turn_usage (session_id);
        CREATE INDEX turn_usage_child ON turn_usage (child_id);
        """,
    ),
    (
        "m002_session_leases",
        # Which replica runs each open session, until when (`session_leases.py`).
        """
        CREATE TABLE session_leases (
            session_id TEXT PRIMARY KEY, owner TEXT NOT NULL, url TEXT NOT NULL,
            expires_at DOUBLE PRECISION NOT NULL, claimed_at DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX session_leases_expiry ON session_leases (expires_at);
        """,
    ),
    (
        "m004_root_usage",
        # The root parent agent's turns, counted under ROOT_ID ('') as the
        # SQLite store's m009 does.
        """
        INSERT INTO turn_usage
            (uuid, session_id, child_id, input_tokens, output_tokens, model_calls, seconds,
             cost, created_at)
        SELECT uuid, session_id, '',
               coalesce((payload::jsonb #>> '{spent,input_tokens}')::bigint, 0),
               coalesce((payload::jsonb #>> '{spent,output_tokens}')::bigint, 0),
               coalesce((payload::jsonb #>> '{spent,model_calls}')::bigint, 0),
               coalesce((payload::jsonb #>> '{spent,seconds}')::float8, 0),
               coalesce((payload::jsonb #>> '{spent,cost}')::float8, 0),
               created_at
        FROM events
        WHERE kind IN ('done', 'failed', 'input_required') AND child_id IS NULL
        ON CONFLICT (uuid) DO NOTHING;
        """,
    ),
    (
        "m005_leases",
        # Session leases move to the one leases table, which role server
        # replicas use for conversations too (`leases.py`), the live ones kept.
        ";\n".join((LEASES_TABLE.create_statement, *LEASES_TABLE.indexes))
        + """;
        INSERT INTO a2a_leases (kind, key, holder, url, turns, expires_at)
        SELECT 'session', session_id, owner, url, 1, expires_at FROM session_leases;
        DROP TABLE session_leases;
        """,
    ),
]
"""(name, SQL) in order; each applied once per database (`a2a_migrations`).
The tool-call journal's table is the journal's (`journal.TABLE`, created by
it); a database made before keeps `m003_tool_call_host` among the names
applied, the step that table's `added` columns now take."""


def _sums() -> str:
    # sum() of BIGINT is NUMERIC in PostgreSQL: cast back to plain numbers.
    return ", ".join(
        f"coalesce(sum({c}), 0)::{'float8' if c in ('seconds', 'cost') else 'bigint'} AS {c}"
        for c in _SPEND_COLUMNS
    )


def _spend(row: Mapping[str, Any]) -> Spend:
    return Spend.from_dict({c: row[c] for c in _SPEND_COLUMNS})


def _event(row: Mapping[str, Any]) -> StoredEvent:
    data = dict(row)
    data["payload"] = json.loads(data["payload"])
    return StoredEvent(**data)


class PgStore(Store):
    """The orchestrator's store in PostgreSQL (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.path = None
        self.url = url
        self._pg = PgConnection(url, "store", MIGRATIONS)
        self._write_pg = PgGroupWriter(self._pg).write
        self.journal = ToolJournal(PgDatabase(self._pg))
        self.leases = LeaseTable(self._pg, "session")
        """Which replica runs each session (`leases.py`, `session_leases.py`)."""

    def close(self) -> None:
        self._pg.close()

    async def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """Rows of a read."""
        values = list(params)
        return await self._pg.run(lambda tx: tx.fetch(sql, values))

    async def _execute(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """One statement in its own (group-committed) transaction; its rows."""
        values = list(params)
        return await self._write_pg(lambda tx: tx.fetch(sql, values))

    # -- sessions -------------------------------------------------------------

    async def create_session(
        self,
        session_id: str | None = None,
        *,
        title: str = "",
        parent_session: str = "",
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        sid = session_id or uuidlib.uuid4().hex
        await self._execute(
            "INSERT INTO sessions (id, title, parent_session, metadata, created_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (sid, title, parent_session, json.dumps(dict(metadata or {})), time.time()),
        )
        return sid

    @staticmethod
    def _session(row: Mapping[str, Any]) -> dict[str, Any]:
        found = dict(row)
        found["metadata"] = json.loads(found["metadata"] or "{}")
        return found

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        rows = await self._query("SELECT * FROM sessions WHERE id = ?", (session_id,))
        return self._session(rows[0]) if rows else None

    async def set_session_metadata(self, session_id: str, key: str, value: Any) -> None:
        # One UPDATE of one key, as the SQLite store's json_set.
        await self._execute(
            "UPDATE sessions SET metadata = jsonb_set("
            "coalesce(nullif(metadata, ''), '{}')::jsonb, ARRAY[?::text], ?::jsonb)::text "
            "WHERE id = ?",
            (key, json.dumps(value), session_id),
        )

    async def list_sessions(self) -> list[dict[str, Any]]:
        rows = await self._query("SELECT * FROM sessions ORDER BY created_at")
        return [self._session(r) for r in rows]

    # -- children -------------------------------------------------------------

    async def add_child(self, record: ChildRecord) -> None:
        row = record.to_row()
        await self._execute(_insert_child_sql(row, "?"), row.values())

    async def update_child(self, child_id: str, **changes: Any) -> None:
        from sqlite_utils.db import NotFoundError  # what the SQLite store raises

        if "config" in changes:
            changes["config"] = json.dumps(changes["config"])
        assignments = ", ".join(f"{name} = ?" for name in changes) or "child_id = child_id"
        rows = await self._execute(
            f"UPDATE children SET {assignments} WHERE child_id = ? RETURNING child_id",
            [*changes.values(), child_id],
        )
        if not rows:
            raise NotFoundError(child_id)

    async def get_child(self, child_id: str) -> ChildRecord | None:
        rows = await self._query("SELECT * FROM children WHERE child_id = ?", (child_id,))
        return ChildRecord.from_row(rows[0]) if rows else None

    async def list_children(
        self,
        *,
        session_id: str | None = None,
        parent_id: str | None = None,
        statuses: Iterable[str] | None = None,
    ) -> list[ChildRecord]:
        clauses, params = _where({"session_id": session_id, "parent_id": parent_id})
        if statuses is not None:
            clauses.append("status = ANY(?)")
            params.append(list(statuses))
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = await self._query(f"SELECT * FROM children {where} ORDER BY created_at", params)
        return [ChildRecord.from_row(r) for r in rows]

    # -- subscriptions --------------------------------------------------------

    async def put_subscription(
        self, subscription_id: str, session_id: str, parent_id: str, spec: Mapping[str, Any]
    ) -> None:
        await self._execute(
            "INSERT INTO subscriptions (id, session_id, parent_id, spec, created_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "session_id = EXCLUDED.session_id, parent_id = EXCLUDED.parent_id, "
            "spec = EXCLUDED.spec, created_at = EXCLUDED.created_at",
            (subscription_id, session_id, parent_id, json.dumps(dict(spec)), time.time()),
        )

    async def delete_subscription(self, subscription_id: str) -> bool:
        rows = await self._execute(
            "DELETE FROM subscriptions WHERE id = ? RETURNING id", (subscription_id,)
        )
        return bool(rows)

    async def subscriptions(self, session_id: str, parent_id: str) -> list[dict[str, Any]]:
        rows = await self._query(
            "SELECT id, spec FROM subscriptions WHERE session_id = ? AND parent_id = ? "
            "ORDER BY created_at",
            (session_id, parent_id),
        )
        return [{"id": r["id"], **json.loads(r["spec"])} for r in rows]

    # -- runners ----------------------------------------------------------------

    async def put_runner(self, record: RunnerRecord) -> None:
        row = asdict(record)
        updates = ", ".join(f"{k} = EXCLUDED.{k}" for k in row if k != "session_id")
        await self._execute(
            f"INSERT INTO runners ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)}) "
            f"ON CONFLICT (session_id) DO UPDATE SET {updates}",
            row.values(),
        )

    async def get_runner(self, session_id: str) -> RunnerRecord | None:
        rows = await self._query("SELECT * FROM runners WHERE session_id = ?", (session_id,))
        return RunnerRecord.from_row(rows[0]) if rows else None

    async def update_runner(
        self, session_id: str, token: str, **changes: Any
    ) -> RunnerRecord | None:
        assignments = ", ".join(f"{name} = ?" for name in changes)
        rows = await self._execute(
            f"UPDATE runners SET {assignments} WHERE session_id = ? AND token = ? RETURNING *",
            [*changes.values(), session_id, token],
        )
        return RunnerRecord.from_row(rows[0]) if rows else None

    # -- events ---------------------------------------------------------------

    async def append_events(
        self,
        entries: Iterable[EventEntry],
        *,
        child_changes: Mapping[str, Any] | None = None,
        new_child: ChildRecord | None = None,
    ) -> list[StoredEvent | None]:
        batch = list(entries)
        changes = dict(child_changes or {})
        spend_columns = ", ".join(_SPEND_COLUMNS)
        child_row = new_child.to_row() if new_child is not None else None

        async def insert(tx: Tx) -> list[StoredEvent | None]:
            stored: list[StoredEvent | None] = []
            if child_row is not None:
                await tx.execute(_insert_child_sql(child_row, "?"), list(child_row.values()))
            if changes and batch and batch[0][1] is not None:
                assignments = ", ".join(f"{name} = ?" for name in changes)
                await tx.execute(
                    f"UPDATE children SET {assignments} WHERE child_id = ?",
                    [*changes.values(), batch[0][1]],
                )
            for entry in batch:
                values = _event_values(entry)
                row = await tx.fetchrow(
                    "INSERT INTO events (uuid, session_id, child_id, kind, payload, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO NOTHING RETURNING seq",
                    values,
                )
                if row is None:
                    stored.append(None)
                    continue
                usage = _usage_values(values, entry[3])
                if usage is not None:
                    await tx.execute(
                        f"INSERT INTO turn_usage (uuid, session_id, child_id, {spend_columns}, "
                        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (uuid) DO NOTHING",
                        usage,
                    )
                stored.append(_stored_event(int(row["seq"]), values, entry[3]))
            return stored

        return await self._write_pg(insert)

    async def events(
        self,
        session_id: str | None = None,
        *,
        child_id: str | None = None,
        after: int = 0,
        limit: int | None = None,
        kinds: Iterable[str] | None = None,
    ) -> list[StoredEvent]:
        clauses, params = _where({"session_id": session_id, "child_id": child_id})
        clauses.insert(0, "seq > ?")
        params.insert(0, after)
        if kinds is not None:
            clauses.append("kind = ANY(?)")
            params.append(list(kinds))
        sql = f"SELECT * FROM events WHERE {' AND '.join(clauses)} ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [_event(r) for r in await self._query(sql, params)]

    async def last_root_turn_end(self, session_id: str) -> StoredEvent | None:
        rows = await self._query(
            "SELECT e.* FROM turn_usage t JOIN events e ON e.uuid = t.uuid"
            " WHERE t.session_id = ? AND t.child_id = ? ORDER BY e.seq DESC LIMIT 1",
            (session_id, ROOT_ID),
        )
        return _event(rows[0]) if rows else None

    # -- usage ------------------------------------------------------------------

    async def child_usage(self, session_id: str) -> dict[str, Spend]:
        rows = await self._query(
            f"SELECT child_id, {_sums()} FROM turn_usage WHERE session_id = ? GROUP BY child_id",
            (session_id,),
        )
        return {r["child_id"]: _spend(r) for r in rows}

    async def descendants_usage(self, session_id: str, child_id: str) -> Spend:
        rows = await self._query(
            f"""
            WITH RECURSIVE below(id) AS (
                SELECT child_id FROM children WHERE session_id = ? AND parent_id = ?
                UNION
                SELECT c.child_id FROM children c JOIN below b ON c.parent_id = b.id
            )
            SELECT {_sums()} FROM turn_usage WHERE child_id IN (SELECT id FROM below)
            """,
            (session_id, child_id),
        )
        return _spend(rows[0])


def _where(equal: Mapping[str, Any]) -> tuple[list[str], list[Any]]:
    clauses = [f"{name} = ?" for name, value in equal.items() if value is not None]
    return clauses, [value for value in equal.values() if value is not None]
