"""`SQLiteFile.write`: committed on the event loop when the file is free,
in a worker thread (waiting there, never on the loop) when another
connection holds the write lock; a failing write is rolled back; the file's
checkpoints move to the background once it is written this way."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.storage.sqlitefile import CHECKPOINT_EVERY, SQLiteFile

pytestmark = pytest.mark.anyio


def _file(path: Path) -> SQLiteFile:
    file = SQLiteFile(path, "test file")
    with file.conn:
        file.conn.execute("CREATE TABLE rows (n INTEGER PRIMARY KEY)")
    return file


def _rows(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [n for (n,) in conn.execute("SELECT n FROM rows ORDER BY n")]
    finally:
        conn.close()


async def test_a_write_is_committed_and_visible_to_another_connection(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    file = _file(path)
    try:
        with anyio.fail_after(10):
            await file.write(lambda conn: conn.execute("INSERT INTO rows VALUES (1)"))
        assert _rows(path) == [1]
    finally:
        file.close()


async def test_a_write_waits_off_the_loop_while_another_process_holds_the_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "f.db"
    file = _file(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # as another process's writer would
        other.execute("INSERT INTO rows VALUES (1)")
        ticks = 0
        written = anyio.Event()

        async def write() -> None:
            await file.write(lambda conn: conn.execute("INSERT INTO rows VALUES (2)"))
            written.set()

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(write)
                # The loop keeps running while the write waits for the lock.
                while ticks < 20:
                    await anyio.sleep(0.01)
                    ticks += 1
                assert not written.is_set()
                other.execute("COMMIT")
                await written.wait()
        assert _rows(path) == [1, 2]
    finally:
        other.close()
        file.close()


async def test_a_failing_write_is_rolled_back_as_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    file = _file(path)
    try:

        def half(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO rows VALUES (1)")
            conn.execute("INSERT INTO rows VALUES (1)")  # the primary key refuses it

        with anyio.fail_after(10), pytest.raises(StoreError):
            await file.write(half)
        await file.write(lambda conn: conn.execute("INSERT INTO rows VALUES (2)"))
        assert _rows(path) == [2]
    finally:
        file.close()


class _CountedCheckpoints(SQLiteFile):
    """Counts the checkpoints it runs (each one the real checkpoint)."""

    checkpoints = 0

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        super()._checkpoint(conn)
        self.checkpoints += 1


async def test_checkpoints_run_every_so_many_writes(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    _file(path).close()
    file = _CountedCheckpoints(path, "test file")
    statements: list[str] = []
    # SQLite's own trace of what the connection runs.
    file.conn.set_trace_callback(statements.append)
    try:
        with anyio.fail_after(30):
            for n in range(2 * CHECKPOINT_EVERY):
                await file.write(
                    lambda conn, n=n: conn.execute("INSERT INTO rows VALUES (?)", (n,))
                )
                # One checkpoint at a time: let each finish before the next is due.
                while (running := file._checkpointing) is not None and running.is_alive():
                    await anyio.sleep(0.005)
        file.conn.set_trace_callback(None)
        (auto,) = file.conn.execute("PRAGMA wal_autocheckpoint").fetchone()
        assert auto == 0  # no checkpoint inside a commit made on the loop
        # Nor on the writing connection at all: they run on their own.
        assert not any("wal_checkpoint" in s for s in statements)
        assert file.checkpoints == 2
        assert _rows(path) == list(range(2 * CHECKPOINT_EVERY))
    finally:
        file.close()
