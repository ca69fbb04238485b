"""No write waits for a WAL checkpoint: `SQLiteFile.write` starts one every
`CHECKPOINT_EVERY` commits in the background, one at a time, on a connection
of its own, and returns once its commit is done; writes keep committing on
the event loop while it runs; `close` waits for a running one and starts no
other; a failing checkpoint is logged and the writes stand."""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from a2a_orchestrator.storage.sqlitefile import CHECKPOINT_EVERY, SQLiteFile

pytestmark = pytest.mark.anyio


class _HeldCheckpoints(SQLiteFile):
    """Each checkpoint waits for the test's `release` before it runs (the
    real checkpoint then): the test holds one as long as it likes, to see
    what waits for it. A held checkpoint stands for a slow sync."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, "test file")
        self.started = threading.Event()
        self.release = threading.Event()
        self.checkpoints = 0

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        self.started.set()
        self.release.wait(30)  # past every test's bound
        super()._checkpoint(conn)
        self.checkpoints += 1


def _held(path: Path) -> _HeldCheckpoints:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE rows (n INTEGER PRIMARY KEY)")
    conn.close()
    return _HeldCheckpoints(path)


def _rows(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [n for (n,) in conn.execute("SELECT n FROM rows ORDER BY n")]
    finally:
        conn.close()


async def _write(file: SQLiteFile, n: int) -> None:
    await file.write(lambda conn: conn.execute("INSERT INTO rows VALUES (?)", (n,)))


async def test_the_write_that_starts_a_checkpoint_returns_while_it_runs(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    file = _held(path)
    try:
        with anyio.fail_after(10):
            for n in range(CHECKPOINT_EVERY):
                await _write(file, n)
            # The last write started the checkpoint and returned: it is held.
            assert await anyio.to_thread.run_sync(file.started.wait, 10)
            assert file.checkpoints == 0
            # Later writes commit, on the loop, while the checkpoint runs,
            # and do not start a second one.
            for n in range(CHECKPOINT_EVERY, 2 * CHECKPOINT_EVERY + 10):
                await _write(file, n)
            assert file.checkpoints == 0
            assert _rows(path) == list(range(2 * CHECKPOINT_EVERY + 10))
            file.release.set()
            while file.checkpoints == 0:
                await anyio.sleep(0.005)
        assert file.checkpoints == 1
    finally:
        file.release.set()
        file.close()


async def test_close_waits_for_a_running_checkpoint_and_starts_no_other(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    file = _held(path)
    with anyio.fail_after(20):
        for n in range(CHECKPOINT_EVERY):
            await _write(file, n)
        assert await anyio.to_thread.run_sync(file.started.wait, 10)
        closed = threading.Event()

        def close() -> None:
            file.close()
            closed.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, close)
            # close waits for the held checkpoint...
            assert not await anyio.to_thread.run_sync(closed.wait, 0.3)
            assert file.checkpoints == 0
            file.release.set()
        # ...which ran to its end before the file closed.
        assert closed.is_set()
        assert file.checkpoints == 1
    with pytest.raises(Exception, match="closed"):
        await _write(file, -1)
    # Closed cleanly: every write is in the file, and the WAL is gone (the
    # last connection's close checkpoints it whole).
    assert _rows(path) == list(range(CHECKPOINT_EVERY))
    assert not (tmp_path / "f.db-wal").exists()


async def test_a_checkpoint_due_after_close_does_not_run(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    file = _held(path)
    file.release.set()
    with anyio.fail_after(20):
        for n in range(CHECKPOINT_EVERY - 1):
            await _write(file, n)
    file.close()
    # As a checkpoint started just before close would find it.
    file._checkpoint_in_background()
    assert file.checkpoints == 0
    assert not file.started.is_set()


async def test_a_failing_checkpoint_is_logged_and_the_writes_stand(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class _Failing(SQLiteFile):
        # A real sqlite3 error from the checkpoint connection: a statement
        # SQLite refuses, where the checkpoint would be.
        def _checkpoint(self, conn: sqlite3.Connection) -> None:
            conn.execute("SELECT n FROM no_such_table")

    path = tmp_path / "f.db"
    _held(path).close()
    file = _Failing(path, "test file")
    try:
        with anyio.fail_after(20), caplog.at_level(logging.ERROR):
            for n in range(CHECKPOINT_EVERY + 5):
                await _write(file, n)
            while not any("checkpoint failed" in r.getMessage() for r in caplog.records):
                await anyio.sleep(0.005)
        assert _rows(path) == list(range(CHECKPOINT_EVERY + 5))
    finally:
        file.close()
