"""The store's one writer: appends in the same tick share a transaction, each
caller reads its own write once its await returns, and a write that fails
fails alone (as a `StoreError`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest
from support.storage import refuse_child

from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.storage.store import ChildRecord, Store

pytestmark = pytest.mark.anyio


async def test_appends_in_the_same_tick_share_one_transaction(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with Store(path) as store:
        await store.create_session("s")
        statements: list[str] = []
        # SQLite's own trace of what the connection runs: one COMMIT per transaction.
        store._file.conn.set_trace_callback(statements.append)
        read_back: dict[int, bool] = {}

        async def append(n: int) -> None:
            event = await store.append_event("s", "note", {"n": n}, uuid=f"u{n}")
            assert event is not None
            # Read-your-writes: on disk and visible once the append returns.
            rows = await store.events("s", after=event.seq - 1, limit=1)
            read_back[n] = bool(rows) and rows[0].uuid == f"u{n}"

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for n in range(200):
                    tg.start_soon(append, n)
        store._file.conn.set_trace_callback(None)
        stored = await store.events("s")
    commits = sum(1 for s in statements if s.strip().upper() == "COMMIT")
    assert read_back == {n: True for n in range(200)}
    assert sorted(e.payload["n"] for e in stored) == list(range(200))
    assert 1 <= commits < 200


async def test_a_failing_write_fails_alone(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with Store(path) as store:
        await store.create_session("s")
        for child_id in ("good", "bad"):
            await store.add_child(
                ChildRecord(
                    child_id=child_id,
                    session_id="s",
                    role="coder",
                    status="running",
                    transport="local",
                    trace_id="t",
                    created_at=0.0,
                )
            )
        refuse_child(path, "bad")
        outcomes: dict[str, object] = {}

        async def append(child_id: str, n: int) -> None:
            try:
                outcomes[f"{child_id}{n}"] = await store.append_event(
                    "s",
                    "done",
                    {"text": "x"},
                    child_id=child_id,
                    uuid=f"{child_id}{n}",
                    child_changes={"status": "completed"},
                )
            except StoreError as exc:
                outcomes[f"{child_id}{n}"] = exc

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for n in range(5):
                    tg.start_soon(append, "good", n)
                    tg.start_soon(append, "bad", n)
        rows = await store.events("s")
        good, bad = await store.get_child("good"), await store.get_child("bad")
        usage = await store.child_usage("s")
    failures = [outcomes[f"bad{n}"] for n in range(5)]
    assert all(isinstance(f, StoreError) for f in failures)
    assert all(isinstance(f.__cause__, sqlite3.Error) for f in failures)  # type: ignore[union-attr]
    assert "child write refused" in str(failures[0]) and str(path) in str(failures[0])
    assert sorted(r.uuid for r in rows) == [f"good{n}" for n in range(5)]
    # The failed writes left nothing: not their events, nor the row change
    # or the usage row of the same transaction.
    assert good is not None and good.status == "completed"
    assert bad is not None and bad.status == "running"
    assert set(usage) == {"good"}


async def test_reads_raise_store_error(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    async with Store(path) as store:
        await store.create_session("s")
        conn = sqlite3.connect(path)
        conn.execute("DROP TABLE turn_usage")
        conn.commit()
        conn.close()
        with pytest.raises(StoreError, match="no such table"):
            await store.child_usage("s")
        # The store goes on for everything else.
        assert await store.append_event("s", "note", {}) is not None


async def test_a_write_alone_that_fails_leaves_nothing_and_the_next_commits(
    tmp_path: Path,
) -> None:
    """A group of one has no savepoint of its own: what it wrote before
    failing is rolled back with its transaction, and its caller gets the
    error (a sqlite3 error as `StoreError`, any other as raised)."""
    path = tmp_path / "store.db"
    async with Store(path) as store:
        await store.create_session("s")
        write = store._write  # the store's group writer, as its methods use it

        def half_then_sqlite_error(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE sessions SET title = 'half' WHERE id = 's'")
            conn.execute("INSERT INTO no_such_table VALUES (1)")

        def half_then_bug(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE sessions SET title = 'half' WHERE id = 's'")
            raise ValueError("a bug in the write")

        with anyio.fail_after(20):
            with pytest.raises(StoreError, match="no such table") as refused:
                await write(half_then_sqlite_error)
            with pytest.raises(ValueError, match="a bug in the write"):
                await write(half_then_bug)
            event = await store.append_event("s", "note", {"n": 1}, uuid="after")
        assert isinstance(refused.value.__cause__, sqlite3.Error)
        assert event is not None
    conn = sqlite3.connect(path)
    try:
        titles = [title for (title,) in conn.execute("SELECT title FROM sessions")]
        uuids = [uuid for (uuid,) in conn.execute("SELECT uuid FROM events")]
    finally:
        conn.close()
    assert "half" not in titles
    assert uuids == ["after"]
