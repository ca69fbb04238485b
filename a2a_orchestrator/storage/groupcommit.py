"""`GroupWriter`: one writer per SQLite file, committing writes in groups.

Every event a child emits is written before anyone hears of it, so writes
sit on the children's critical path. One transaction (and one worker-thread
hop) per write caps a busy session at a few thousand events a second; a
transaction for many writes costs about as much as one for a single write.

Contract:
- `write(fn)` runs `fn(conn)` inside a transaction and returns its result
  once that transaction is committed: what it wrote is on disk (as durable
  as the file's settings make it) and visible to every later read.
- Writes that arrive while a commit is in flight wait for it, then go
  together in the next one: one transaction, committed on the event loop
  when the file is free (`SQLiteFile.write`), else in one worker-thread
  hop. Order is kept:
  writes are applied in the order `write` was called.
- Each write of a group of several runs under its own savepoint: one that
  raises is rolled back alone and its caller gets the error (a sqlite3
  error as `StoreError`); the other writes of the group commit. The SQLite
  writer rolls a group of one back whole instead (no savepoint: two
  statements a commit), with the same error to its caller. A commit that
  fails fails them all.
- A caller cancelled while its write waits for the next group takes the
  write back (it is not written); once its group is being committed, the
  commit goes through (shielded), as a single write in a thread would.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import anyio

from ..errors import StoreError
from .sqlitefile import SQLiteFile

__all__ = ["GroupCommit", "GroupWriter", "Write"]

T = TypeVar("T")


class Write:
    """One caller's write waiting for, or taken by, a group."""

    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False


class GroupCommit:
    """The grouping shared by every store's writer: a queue of writes, one
    group committed at a time by `flush`, each caller woken once its group is
    done (see the module docstring's contract). `flush(batch)` applies the
    batch in one transaction and commits it: a write's own error is left on
    `item.error` (each write under a savepoint of its own), or, for a group
    of one, raised by `flush` (the transaction rolled back), which gives it
    to the caller all the same."""

    def __init__(self, flush: Callable[[list[Write]], Awaitable[None]]) -> None:
        self._flush = flush
        self._queue: list[Write] = []
        self._committing = False
        self._committed = anyio.Event()

    async def _enqueue(self, fn: Callable[[Any], Any]) -> Any:
        item = Write(fn)
        self._queue.append(item)
        while not item.done:
            if self._committing:
                # Joins the next group: whoever wakes first commits it.
                committed = self._committed
                try:
                    await committed.wait()
                except BaseException:
                    if item in self._queue:  # not taken by a commit: never written
                        self._queue.remove(item)
                    raise
            else:
                await self._commit()
        if item.error is not None:
            raise item.error
        return item.result

    async def _commit(self) -> None:
        batch, self._queue = self._queue, []
        self._committing = True
        try:
            # Shielded: the group holds other callers' writes.
            with anyio.CancelScope(shield=True):
                await self._flush(batch)
        except Exception as exc:  # the store failed (closed, or the commit did)
            for item in batch:
                item.error = exc
        finally:
            for item in batch:
                item.done = True
            self._committing = False
            committed, self._committed = self._committed, anyio.Event()
            committed.set()


class GroupWriter(GroupCommit):
    """Group commit over one `SQLiteFile` (see the module docstring)."""

    def __init__(self, file: SQLiteFile) -> None:
        super().__init__(self._flush_batch)
        self._file = file

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return cast(T, await self._enqueue(fn))

    async def _flush_batch(self, batch: list[Write]) -> None:
        await self._file.write(lambda conn: self._apply(batch, conn))

    def _apply(self, batch: list[Write], conn: sqlite3.Connection) -> None:
        """Under the file's lock, inside the group's one transaction (which
        `SQLiteFile.write` begins and commits, here or in a worker thread)."""
        if len(batch) == 1:
            # A group of one needs no savepoint (two statements a commit):
            # what it raises rolls the whole transaction back, and its caller
            # gets the error from the commit (a sqlite3 error as `StoreError`).
            [item] = batch
            item.result = item.fn(conn)
            return
        for item in batch:
            conn.execute("SAVEPOINT group_write")
            try:
                item.result = item.fn(conn)
            except Exception as exc:
                conn.execute("ROLLBACK TO group_write")
                item.error = self._translated(exc)
            conn.execute("RELEASE group_write")

    def _translated(self, exc: Exception) -> BaseException:
        if isinstance(exc, sqlite3.Error):
            error = StoreError(f"{self._file.what} {self._file.path}: {exc}")
            error.__cause__ = exc
            return error
        return exc
