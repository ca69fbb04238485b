"""`SQLiteFile`: one sqlite3 connection used from worker threads, safely.

Both of our SQLite stores (the orchestrator's `Store`, a role server's
`SQLiteTaskStore`) keep one connection per file and run every call in a
worker thread (`anyio.to_thread`) under a lock: the event loop never blocks
on disk, and calls from many tasks serialise. WAL lets readers (the CLI) see
a file while a server writes it; synchronous=NORMAL under WAL is durable
against a crash of the process (kill -9), the failure these files exist for.
A sqlite3 error raised by a call is raised as `StoreError` (its cause kept),
so callers catch one of this package's errors, naming the file.

Writes (`write`) are the exception to the worker thread when they can be:
a worker-thread hop costs about five times a small WAL commit (160 us of
CPU against 36 on a loaded 2-core machine), and every child event is one.
A write runs here, on the event loop, when the connection is free and the
file's write lock is taken at once (`BEGIN IMMEDIATE` with no busy wait);
otherwise (a call in a thread holds the connection, another process holds
the lock) it goes to a worker thread and waits there as before. Under
synchronous=NORMAL a WAL commit does not sync; the sync is the checkpoint's,
so the connection makes no automatic checkpoints and `write` starts a
passive one every `CHECKPOINT_EVERY` commits (a file nobody calls `write`
on keeps SQLite's automatic checkpoints). The checkpoint runs in the
background and no write waits for it (one took 32-50 ms, and was awaited by
whichever child's write started it): a thread of its own on a connection of
its own, so writes keep committing on the event loop while it syncs (a
passive checkpoint takes no lock a writer needs). One runs at a time (a
checkpoint due while one runs is skipped: the next one takes its pages); an
error is logged, never raised to a writer; `close` waits for a running one
and starts no other. Reads bounded by an index (`read`) run here the same
way as writes: under WAL a read waits for no lock.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.lowlevel

from ..errors import ConfigError, StoreError

__all__ = ["CHECKPOINT_EVERY", "SQLiteFile"]

T = TypeVar("T")

logger = logging.getLogger(__name__)

CHECKPOINT_EVERY = 200
"""Commits between two checkpoints (a few hundred WAL pages at most for
event-sized rows; SQLite's own default is 1,000 pages)."""

_BUSY_TIMEOUT_MS = 30_000


class SQLiteFile:
    """An open SQLite file (see the module docstring); `what` names it in errors."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(
                str(self.path), check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000
            )
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open {what} {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self._closed = False
        self._commits: int | None = None  # None: SQLite's own checkpoints
        # The background checkpoint (see the module docstring): its thread
        # while one runs, and its connection, opened by the first one.
        self._checkpoints = threading.Lock()
        self._checkpointing: threading.Thread | None = None
        self._checkpointer: sqlite3.Connection | None = None

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` in a worker thread, alone on the connection."""

        def locked() -> T:
            with self._lock:
                if self._closed:
                    raise ConfigError(f"{self.what} {self.path} is closed")
                try:
                    return fn()
                except sqlite3.Error as exc:
                    raise StoreError(f"{self.what} {self.path}: {exc}") from exc

        return await anyio.to_thread.run_sync(locked)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` in one transaction and commit it: here when the
        connection and the file's write lock are free at once, else in a
        worker thread (see the module docstring). On an error `fn` raised,
        the transaction is rolled back and the error raised (a sqlite3 error
        as `StoreError`). Never cancelled midway: it is done when it returns."""
        if self._commits is None:
            # From the first `write` on, checkpoints (the syncs) run in a
            # worker thread, never in a commit made on the event loop.
            await self.run(lambda: self.conn.execute("PRAGMA wal_autocheckpoint=0"))
            self._commits = 0
        written = self._write_here(fn)
        if written is not None:
            result = written[0]
            # Written without a thread hop: still let other tasks run (a
            # child emitting in a loop must not starve its relay), without
            # a cancellation that would hide a write that is done.
            await anyio.lowlevel.cancel_shielded_checkpoint()
        else:
            result = await self.run(lambda: _transaction(self.conn, fn, immediate=False))
        self._commits = (self._commits or 0) + 1
        if self._commits >= CHECKPOINT_EVERY:
            self._commits = 0
            self._start_checkpoint()
        return result

    def _write_here(self, fn: Callable[[sqlite3.Connection], T]) -> tuple[T] | None:
        """`(result,)` when written here, None when the connection or the
        file's write lock is busy (nothing was written)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                raise ConfigError(f"{self.what} {self.path} is closed")
            conn = self.conn
            if conn.in_transaction:  # not ours to commit: left to the thread path
                return None
            conn.execute("PRAGMA busy_timeout = 0")
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code
                if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    return None  # another process writes: wait in a thread
                raise StoreError(f"{self.what} {self.path}: {exc}") from exc
            finally:
                conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            try:
                return (_transaction(conn, fn, immediate=True),)
            except sqlite3.Error as exc:
                raise StoreError(f"{self.what} {self.path}: {exc}") from exc
        finally:
            self._lock.release()

    async def read(self, fn: Callable[[], T]) -> T:
        """Run `fn` (a read bounded by an index: it waits for no lock under
        WAL) here when the connection is free, else in a worker thread."""
        if not self._lock.acquire(blocking=False):
            return await self.run(fn)
        try:
            if self._closed:
                raise ConfigError(f"{self.what} {self.path} is closed")
            try:
                result = fn()
            except sqlite3.Error as exc:
                raise StoreError(f"{self.what} {self.path}: {exc}") from exc
        finally:
            self._lock.release()
        await anyio.lowlevel.cancel_shielded_checkpoint()
        return result

    def _start_checkpoint(self) -> None:
        """Start a checkpoint in the background unless one is running."""
        running = self._checkpointing
        if running is not None and running.is_alive():
            return  # the next one due takes this one's pages too
        thread = threading.Thread(
            target=self._checkpoint_in_background, name=f"checkpoint {self.path.name}", daemon=True
        )
        self._checkpointing = thread
        thread.start()

    def _checkpoint_in_background(self) -> None:
        with self._checkpoints:  # `close` takes it to wait for this one
            if self._closed:
                return
            try:
                if self._checkpointer is None:
                    self._checkpointer = sqlite3.connect(
                        str(self.path), check_same_thread=False, timeout=_BUSY_TIMEOUT_MS / 1000
                    )
                self._checkpoint(self._checkpointer)
            except sqlite3.Error:
                # The next checkpoint (or SQLite's own, on the last close)
                # syncs what this one did not; the writes are committed.
                logger.exception("%s %s: checkpoint failed", self.what, self.path)

    def _checkpoint(self, conn: sqlite3.Connection) -> None:
        """One passive checkpoint on the checkpoint connection `conn`."""
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def run_here(self, fn: Callable[[], T]) -> T:
        """Run `fn` on this thread, alone on the connection (for a last write
        on close, where there is no event loop to wait on)."""
        with self._lock:
            if self._closed:
                raise ConfigError(f"{self.what} {self.path} is closed")
            return fn()

    def close(self) -> None:
        """Close the file, after a checkpoint running in the background
        (none starts after this)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with self._checkpoints:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
        with self._lock:
            self.conn.close()


def _transaction(
    conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], *, immediate: bool
) -> T:
    """`fn(conn)` in a transaction (`immediate`: already begun), committed,
    or rolled back when anything raises."""
    try:
        if not immediate and not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")
        result = fn(conn)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise
    return result
