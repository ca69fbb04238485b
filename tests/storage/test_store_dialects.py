"""One `Store` on two dialects: the same calls give the same answers on an
SQLite file and on PostgreSQL (`tests/support/postgres.py`, a real server), and an
SQLite file made by the code before (its sqlite-utils migrations only, some
of them) opens, migrates forward and keeps its rows."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlite_utils
from support.postgres import Postgres

from a2a_orchestrator.models.base import ToolCall
from a2a_orchestrator.storage.store import (
    MIGRATIONS,
    ROOT_ID,
    SQLITE_HISTORY,
    ChildRecord,
    RunnerRecord,
    Store,
)
from a2a_orchestrator.storage.store_pg import PgStore

pytestmark = pytest.mark.anyio


def _child(child_id: str, parent_id: str = "") -> ChildRecord:
    return ChildRecord(
        child_id=child_id,
        session_id="s1",
        role="coder",
        status="running",
        transport="local",
        trace_id="t",
        created_at=time.time(),
        parent_id=parent_id,
        config={"k": [1]},
    )


async def _scenario(store: Store) -> dict[str, Any]:
    """Every call of the store, its answers as plain data."""
    seen: dict[str, Any] = {}
    sid = await store.create_session("s1", title="t", metadata={"owner": "x"})
    await store.create_session("s1", title="again")  # kept, not replaced
    await store.set_session_metadata(sid, "k", {"a": 1})
    session = await store.get_session(sid)
    assert session is not None
    seen["session"] = (session["title"], session["metadata"])
    seen["sessions"] = [s["id"] for s in await store.list_sessions()]
    await store.append_events([(sid, "c1", "input", {"text": "go"}, "u0")], new_child=_child("c1"))
    await store.add_child(_child("c2", parent_id="c1"))
    await store.update_child("c2", status="completed", config={"z": 2})
    spent = {"input_tokens": 3, "output_tokens": 4, "model_calls": 1, "seconds": 0.5, "cost": 0.25}
    stored = await store.append_events(
        [
            (sid, "c2", "done", {"text": "ok", "spent": spent}, "u1"),
            (sid, "c2", "done", {"text": "ok", "spent": spent}, "u1"),  # the same uuid
            (sid, None, "done", {"text": "root", "spent": spent}, "u2"),
        ]
    )
    seen["stored"] = [e.uuid if e is not None else None for e in stored]
    seen["again"] = await store.append_event(sid, "note", {}, uuid="u1")
    events = await store.events(sid)
    seen["events"] = [(e.uuid, e.child_id, e.kind, e.payload) for e in events]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    seen["page"] = [e.uuid for e in await store.events(sid, after=events[0].seq, limit=1)]
    seen["kinds"] = [e.uuid for e in await store.events(sid, kinds=["done"])]
    seen["no kinds"] = await store.events(sid, kinds=[])
    root = await store.last_root_turn_end(sid)
    seen["root end"] = root.uuid if root is not None else None
    seen["children"] = [(c.child_id, c.status, c.config) for c in await store.list_children()]
    seen["done children"] = [
        c.child_id for c in await store.list_children(session_id=sid, statuses=["completed"])
    ]
    child = await store.get_child("c2")
    seen["child"] = child.parent_id if child is not None else None
    seen["usage"] = {k: v.as_dict() for k, v in (await store.child_usage(sid)).items()}
    seen["subtree"] = {k: v.as_dict() for k, v in (await store.subtree_usage(sid)).items()}
    seen["below c1"] = (await store.descendants_usage(sid, "c1")).as_dict()
    seen["total"] = (await store.session_usage(sid)).as_dict()
    await store.put_subscription("sub", sid, "c1", {"on": ["done"]})
    await store.put_subscription("sub", sid, "c1", {"on": ["failed"]})  # replaced
    seen["subs"] = await store.subscriptions(sid, "c1")
    seen["deleted"] = (
        await store.delete_subscription("sub"),
        await store.delete_subscription("sub"),
    )
    runner = RunnerRecord(
        session_id=sid,
        token="tok",
        pid=1,
        host="h",
        boot_id="b",
        start_ticks=7,
        started_at=1.0,
        heartbeat_at=1.0,
    )
    await store.put_runner(runner)
    changed = await store.update_runner(sid, "tok", heartbeat_at=2.0)
    refused = await store.update_runner(sid, "other", heartbeat_at=3.0)
    got = await store.get_runner(sid)
    seen["runner"] = (
        changed.heartbeat_at if changed else None,
        refused,
        got.heartbeat_at if got else None,
    )
    token = await store.push_token("c2")
    seen["push"] = (
        token == await store.push_token("c2"),
        await store.push_token("c1", create=False),
    )
    with pytest.raises(Exception, match="c9"):
        await store.update_child("c9", status="failed")
    return seen


async def test_sqlite_and_postgresql_answer_alike(postgres: Postgres, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        sqlite_store = Store(tmp_path / "s.db")
        try:
            on_sqlite = await _scenario(sqlite_store)
        finally:
            sqlite_store.close()
        pg_store = PgStore(postgres.url(postgres.database("dialects")))
        try:
            on_postgresql = await _scenario(pg_store)
        finally:
            pg_store.close()
    assert on_sqlite == on_postgresql
    # And the answers are the right ones, not merely the same.
    assert on_sqlite["session"] == ("t", {"owner": "x", "k": {"a": 1}})
    assert on_sqlite["stored"] == ["u1", None, "u2"] and on_sqlite["again"] is None
    assert on_sqlite["root end"] == "u2"
    assert on_sqlite["usage"]["c2"]["input_tokens"] == 3 and ROOT_ID in on_sqlite["usage"]
    assert on_sqlite["below c1"]["cost"] == 0.25
    assert on_sqlite["total"]["output_tokens"] == 8
    assert on_sqlite["subs"] == [{"id": "sub", "on": ["failed"]}]
    assert on_sqlite["deleted"] == (True, False)
    assert on_sqlite["runner"] == (2.0, None, 2.0)
    assert on_sqlite["push"] == (True, None)
    assert on_sqlite["no kinds"] == []


async def test_an_sqlite_file_made_before_opens_and_migrates_forward(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    # The code before: its sqlite-utils migrations (here only up to m007,
    # an older file still) and rows written as it wrote them.
    db = sqlite_utils.Database(path)
    SQLITE_HISTORY.apply(db, stop_before="m008_tool_call_host")
    db["sessions"].insert(
        {"id": "s1", "title": "old", "parent_session": "", "metadata": "{}", "created_at": 1.0}
    )
    db.execute(
        "INSERT OR IGNORE INTO events (uuid, session_id, child_id, kind, payload, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        ("u1", "s1", None, "done", json.dumps({"text": "hi", "spent": {"cost": 1.5}}), 1.0),
    )
    db.conn.commit()
    db.close()

    with anyio.fail_after(20):
        store = Store(path)
        try:
            sessions = await store.list_sessions()
            first = await store.events("s1")
            later = await store.append_event("s1", "note", {"n": 1}, uuid="u2")
            usage = await store.child_usage("s1")  # m009 counted the old root turn
            marker = await store.journal.started(
                "c1", ToolCall(id="x", name="read_file", arguments={})
            )
        finally:
            store.close()
    conn = sqlite3.connect(path)
    try:
        applied = {name for (name,) in conn.execute("SELECT name FROM _sqlite_migrations")}
        shared = {name for (name,) in conn.execute("SELECT name FROM a2a_migrations")}
        columns = {row[1] for row in conn.execute("PRAGMA table_info(tool_calls)")}
    finally:
        conn.close()
    assert [s["title"] for s in sessions] == ["old"]
    assert [e.uuid for e in first] == ["u1"]
    assert later is not None and later.seq > first[0].seq
    assert usage[ROOT_ID].cost == 1.5
    assert marker
    assert {"m008_tool_call_host", "m009_root_usage"} <= applied
    assert shared == {name for name, _ in MIGRATIONS}
    assert "runner_host" in columns


async def test_opening_an_up_to_date_file_takes_no_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    Store(path).close()
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # another process writing, for long
        started = time.monotonic()
        # Synchronous: were the open to wait for the lock, it would wait out
        # the busy timeout (30 s) and fail.
        store = Store(path)
        try:
            assert await store.list_sessions() == []
        finally:
            store.close()
        assert time.monotonic() - started < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()
