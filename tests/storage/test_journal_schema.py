"""The tool-call journal's table is stated once (`journal.TABLE`) and made by
the journal on whichever database holds it: a PostgreSQL store made by the
code before (its `tool_calls` from the store's first migration, without the
runner's host, `m003` not applied) opens, and its journal adds the column
and keeps the old rows; a fresh PostgreSQL store and a role server's SQLite
journal file get the same table. Real PostgreSQL (`tests/support/postgres.py`), real
SQLite files."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import asyncpg
import pytest
from support.postgres import Postgres

from a2a_orchestrator.models.base import ToolCall
from a2a_orchestrator.storage.journal import TABLE, ToolJournal
from a2a_orchestrator.storage.store_pg import PG_HISTORY, PgStore

pytestmark = pytest.mark.anyio

# What the store's first migration made of the journal before the journal
# made its own table (the PostgreSQL store's m001, tool_calls part).
_OLD_TOOL_CALLS = """
CREATE TABLE tool_calls (
    marker TEXT PRIMARY KEY, scope TEXT NOT NULL, call_id TEXT NOT NULL,
    tool TEXT NOT NULL, arguments TEXT NOT NULL, runner_pid BIGINT NOT NULL,
    runner_ticks BIGINT NOT NULL, runner_boot TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL, pgid BIGINT, pgid_ticks BIGINT,
    finished_at DOUBLE PRECISION, outcome TEXT
);
CREATE INDEX tool_calls_open ON tool_calls (scope) WHERE finished_at IS NULL;
"""


async def _columns(conn: asyncpg.Connection) -> set[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'tool_calls'"
    )
    return {row["column_name"] for row in rows}


async def test_a_postgresql_store_made_before_opens_and_its_journal_migrates(
    postgres: Postgres,
) -> None:
    url = postgres.url(postgres.database("old"))
    with anyio.fail_after(60):
        conn = await asyncpg.connect(url)
        try:
            # The old code's database: m001 and m002 applied, with the
            # journal's table of then and one open row in it.
            await conn.execute(
                "CREATE TABLE a2a_migrations "
                "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            for name, sql in PG_HISTORY[:2]:
                await conn.execute(sql)
                await conn.execute("INSERT INTO a2a_migrations VALUES ($1, $2)", name, time.time())
            await conn.execute(_OLD_TOOL_CALLS)
            await conn.execute(
                "INSERT INTO tool_calls (marker, scope, call_id, tool, arguments, runner_pid, "
                "runner_ticks, runner_boot, started_at) "
                "VALUES ('old', 'child-1', 'c0', 'read_file', '{}', 1, 1, 'boot', 1.0)"
            )
            assert "runner_host" not in await _columns(conn)

            store = PgStore(url)
            try:
                marker = await store.journal.started(
                    "child-1", ToolCall(id="c1", name="read_file", arguments={"path": "a"})
                )
                rows = await store.journal.started_calls("child-1")
                sessions = await store.list_sessions()
            finally:
                store.close()
            columns = await _columns(conn)
            applied = {r["name"] for r in await conn.fetch("SELECT name FROM a2a_migrations")}
        finally:
            await conn.close()
    assert "runner_host" in columns
    assert [(row.marker, row.runner_host) for row in rows] == [
        ("old", None),  # judged by its boot id alone, as it was
        (marker, rows[1].runner_host),
    ]
    assert rows[1].runner_host
    assert sessions == []
    # The later store migrations ran (m003's step is the journal's now).
    assert {name for name, _ in PG_HISTORY} <= applied


async def test_every_journal_database_gets_the_one_table(
    postgres: Postgres, tmp_path: Path
) -> None:
    url = postgres.url(postgres.database("fresh"))
    expected = {part.split()[0] for part in TABLE.columns.split(", ")}
    with anyio.fail_after(60):
        store = PgStore(url)
        try:
            await store.journal.create()
            await store.journal.create()  # idempotent
        finally:
            store.close()
        conn = await asyncpg.connect(url)
        try:
            pg_columns = await _columns(conn)
        finally:
            await conn.close()
        journal = ToolJournal.open(tmp_path / "journal.db")
        try:
            await journal.scoped("ctx").started(ToolCall(id="c1", name="x", arguments={}))
        finally:
            journal.close()
    db = sqlite3.connect(tmp_path / "journal.db")
    try:
        sqlite_columns = {row[1] for row in db.execute("PRAGMA table_info(tool_calls)")}
        indexes = {row[1] for row in db.execute("PRAGMA index_list(tool_calls)")}
    finally:
        db.close()
    assert pg_columns == sqlite_columns == expected
    assert {"tool_calls_open", "tool_calls_scope"} <= indexes
