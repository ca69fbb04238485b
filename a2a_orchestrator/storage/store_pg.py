"""`PgStore`: the orchestrator's store in PostgreSQL, shared by replicas.

The same `Store` (sessions, children, events, turn usage, subscriptions,
runners, the tool-call journal), its statements written once over the
database interface (`database/`), run on PostgreSQL through asyncpg
(`database.postgres`), in a database several orchestrator processes share;
plus session leases (`leases`, `leases.py`), which say which replica runs
each session (`session_leases.py`).

Contract (what differs from the SQLite store, and why):
- One asyncpg connection per store, one call at a time
  (`database.postgres.PgConnection`), so statements and transactions never
  interleave. It is opened, and the migrations applied, at the first call.
  A database error is a `StoreError`.
- Writes go through a group-commit writer (`PgGroupWriter`): writes
  arriving while a commit is in flight are committed together; each returns
  once its transaction is committed, so nothing is announced before it is
  in the database.
- Migrations (`PG_HISTORY`, then the one list, `store.MIGRATIONS`) are
  applied in one transaction under an advisory lock: replicas starting at
  once apply each migration once, in order.
- `seq` orders events as SQLite's does. PostgreSQL hands out sequence
  numbers before commit, so two writers' events could commit out of order;
  one session has one writer (its lease holder, through one connection), so
  within a session `seq` order is commit order and paging by `seq` is safe.
- Times of leases are the database's clock, so replicas' clocks need not agree.
"""

from __future__ import annotations

from .database.postgres import PgConnection, PgDatabase
from .journal import ToolJournal
from .leases import TABLE as LEASES_TABLE
from .leases import LeaseTable
from .store import MIGRATIONS, Store

__all__ = ["PG_HISTORY", "PgStore"]

PG_HISTORY: list[tuple[str, str]] = [
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
"""The PostgreSQL store's schema up to the one migration list (`MIGRATIONS`,
applied after it): (name, SQL) in order, each applied once per database
(`a2a_migrations`). The tool-call journal's table is the journal's
(`journal.TABLE`, created by it); a database made before keeps
`m003_tool_call_host` among the names applied, the step that table's
`added` columns now take."""


class PgStore(Store):
    """The orchestrator's store in PostgreSQL (see the module docstring)."""

    def __init__(self, url: str) -> None:
        # Not the SQLite file `Store.__init__` opens: the same store on another dialect.
        self.path = None
        self.url = url
        shared = [(name, ";\n".join(statements)) for name, statements in MIGRATIONS]
        connection = PgConnection(url, "store", [*PG_HISTORY, *shared])
        self.db = PgDatabase(connection, own=True)
        self.journal = ToolJournal(self.db)
        self.leases = LeaseTable(connection, "session")
        """Which replica runs each session (`leases.py`, `session_leases.py`)."""

    def close(self) -> None:
        self.db.close()
