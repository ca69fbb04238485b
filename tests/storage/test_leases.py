"""One leases table and mechanism (`leases.py`) for orchestrator sessions and
role server conversations, on a real PostgreSQL (`tests/support/postgres.py`): the
two kinds share `a2a_leases` without touching each other's rows; a lease
given back is free (or handed off: taken over at once); a conversation's
turns count every take; a PostgreSQL store made by the code before, with a
live lease in its `session_leases` table, opens with that lease kept."""

from __future__ import annotations

import time

import anyio
import asyncpg
import pytest
from support.postgres import Postgres

from a2a_orchestrator.storage.database.postgres import PgConnection
from a2a_orchestrator.storage.leases import ConversationLeases, StaleLease
from a2a_orchestrator.storage.store_pg import PG_HISTORY, PgStore

pytestmark = pytest.mark.anyio


async def test_sessions_and_conversations_share_one_table(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("leases"))
    store = PgStore(url)
    a = ConversationLeases(PgConnection(url, "leases"), "A", 30)
    b = ConversationLeases(PgConnection(url, "leases"), "B", 30)
    try:
        with anyio.fail_after(60):
            await store.list_sessions()  # migrated: the table is there
            await a.create()  # idempotent beside the store's migration
            # The same key as a session and as a conversation: two leases.
            session = await store.leases.claim("k1", "S", 30, url="http://s")
            first = await a.acquire("k1", "t1", "alice")
            refused = await b.acquire("k1", "t2", "bob")
            holders = (await a.holder("k1"), (await store.leases.get("k1")))
            await a.release("k1")  # free: B takes it, one more turn
            second = await b.acquire("k1", "t2", "bob")
            # B dies: its lease runs out; A takes it over, one more turn.
            await b.table.give_back("k1", "B", hand_off=True)
            # Not by a new turn: B's turn is adopted first.
            jumped = await a.acquire("k1", "t3", "bob")
            (stale,) = await a.expired()
            adopted = await a.adopt(stale)
            lost = await b.adopt(
                StaleLease(context_id="k1", task_id="t2", owner="bob", replica="B")
            )
            kept = await store.leases.renew("S", ["k1"], 30)
    finally:
        a.close()
        b.close()
        store.close()
    assert session.holder == "S" and session.url == "http://s"
    assert first is not None and first.turns == 1
    assert refused is None
    assert holders[0] == "A" and holders[1] is not None and holders[1].holder == "S"
    assert second is not None and second.turns == 2
    assert jumped is None
    assert (stale.context_id, stale.task_id, stale.owner, stale.replica) == ("k1", "t2", "bob", "B")
    assert adopted is not None and adopted.turns == 3
    assert lost is None
    assert kept == {"k1"}


async def test_a_store_made_before_keeps_its_live_session_leases(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("old"))
    with anyio.fail_after(60):
        conn = await asyncpg.connect(url)
        try:
            # The code before: migrations up to m004, a lease in session_leases.
            await conn.execute(
                "CREATE TABLE a2a_migrations "
                "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            for name, sql in PG_HISTORY[:3]:
                await conn.execute(sql)
                await conn.execute("INSERT INTO a2a_migrations VALUES ($1, $2)", name, time.time())
            await conn.execute(
                "INSERT INTO session_leases (session_id, owner, url, expires_at, claimed_at) "
                "VALUES ('s1', 'A', 'http://a', $1, $2)",
                time.time() + 60,
                time.time(),
            )
            store = PgStore(url)
            try:
                lease = await store.leases.get("s1")
                taken = await store.leases.claim("s1", "B", 30, url="http://b")
            finally:
                store.close()
            tables = {
                row["tablename"] for row in await conn.fetch("SELECT tablename FROM pg_tables")
            }
        finally:
            await conn.close()
    assert lease is not None and (lease.holder, lease.url) == ("A", "http://a") and lease.live
    assert taken.holder == "A"  # still A's: B is told who holds it
    assert "session_leases" not in tables
