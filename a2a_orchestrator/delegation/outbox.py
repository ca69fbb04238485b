"""`Outbox`: one child's events on their way to its store, written behind.

A child that emits events back to back (a hundred tool calls answered at
once, a remote turn's batched frames) used to wait for one transaction per
event: the store's commit, not the child, set the pace (about 5,000 events a
second). Most events need not hold the child up: nothing depends on them
being on disk before the child takes its next step, only before anyone
hears of them. So:

- `put(event, wait=False)` queues the event and returns at once; a flusher
  task writes everything queued in one transaction (`write`), then hands
  each stored event, in order, to `deliver` (the handle records it and tells
  its watchers). Nothing is delivered before the transaction that holds it
  is committed: the guarantee "announced only once on disk" stays.
- `put(event, wait=True)` returns once that event is written and delivered
  (and with it every event put before it): the events a turn ends with, and
  those a pause rule holds the child at, are waited for, so whoever sees a
  turn end sees all of it, stored.
- `drain()` waits for every event put so far: a parent's input is stored
  after the events the child emitted before it arrived, as it was read.
- Order is kept: events are written and delivered in the order they were put.
- A write that fails fails the events of its batch: the waiting caller gets
  the error; for events nobody waited on, the next `put` raises it, so the
  child's turn fails (`StoreError`) as it did when it waited on each write.
- At most `limit` events are queued: past that, `put` waits (back pressure
  on a child that outruns its store).
- Writes are shielded: an event once put is written even if the child is
  cancelled meanwhile (as a shielded write per event was).

Without a task group to run the flusher in (`attach`), every `put` writes
and delivers in its caller, one event at a time as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.lowlevel
from anyio.abc import TaskGroup

from ..runtime.events import ChildEvent

__all__ = ["OUTBOX_LIMIT", "Outbox"]

OUTBOX_LIMIT = 512
"""Events queued before `put` waits; also the most written in one transaction."""

Write = Callable[[Sequence[ChildEvent]], Awaitable[Sequence[bool]]]
"""Stores events in one transaction; per event, False when it was stored already."""
Deliver = Callable[[ChildEvent, bool], Awaitable[None]]
"""Awaited with each event after its write, and whether it was new (False:
stored already, a replay)."""


class _Entry:
    __slots__ = ("error", "event", "index", "waited")

    def __init__(self, event: ChildEvent, index: int, waited: bool) -> None:
        self.event = event
        self.index = index
        self.waited = waited
        self.error: BaseException | None = None


class Outbox:
    """Write-behind for one child's events (see the module docstring)."""

    def __init__(
        self,
        write: Write,
        deliver: Deliver,
        delivered: Callable[[], None],
        *,
        limit: int = OUTBOX_LIMIT,
    ) -> None:
        """`deliver` is awaited with each written event in order; `delivered`
        is called after each batch (the handle wakes its readers once)."""
        self._write = write
        self._deliver = deliver
        self._delivered = delivered
        self._limit = limit
        self._queue: list[_Entry] = []
        self._put = 0
        self._done = 0
        self._flushing = False
        self._progress = anyio.Event()
        self._task_group: TaskGroup | None = None
        self._error: BaseException | None = None

    def attach(self, task_group: TaskGroup) -> None:
        """Write behind from now on, with flushers in `task_group`."""
        self._task_group = task_group

    @property
    def pending(self) -> int:
        """Events put and not yet written and delivered."""
        return self._put - self._done

    async def put(self, event: ChildEvent, *, wait: bool) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        behind = not wait and self._task_group is not None and len(self._queue) < self._limit
        self._put += 1
        entry = _Entry(event, self._put, waited=not behind)
        self._queue.append(entry)
        if behind:
            if not self._flushing:
                self._flushing = True
                assert self._task_group is not None
                self._task_group.start_soon(self._flush_task, name="outbox flush")
            return
        await self._until(entry.index)
        if entry.error is not None:
            raise entry.error

    def take_failure(self) -> BaseException | None:
        """The failure of a write-behind batch nobody has heard of yet, now
        no longer raised by the next `put` (a turn that fails anyway)."""
        error, self._error = self._error, None
        return error

    async def drain(self) -> None:
        """Wait until every event put so far is written and delivered."""
        await self._until(self._put)

    async def _until(self, index: int) -> None:
        # Shielded: the caller's events are written whatever becomes of it.
        with anyio.CancelScope(shield=True):
            while self._done < index:
                if self._flushing:
                    progress = self._progress
                    await progress.wait()
                else:
                    # No flusher running: write here, saving a task switch.
                    self._flushing = True
                    await self._flush()

    async def _flush_task(self) -> None:
        with anyio.CancelScope(shield=True):
            # One more pass of the loop first: a child that emitted an event
            # and then yielded (to its model, to a frame that is on its way)
            # often has the next ones ready by then, and they share the
            # transaction (a local turn's started, message and done: one
            # commit instead of two).
            await anyio.lowlevel.checkpoint()
            await self._flush()

    async def _flush(self) -> None:
        """Write and deliver until the queue is empty (`_flushing` is set)."""
        try:
            while self._queue:
                batch = self._queue[: self._limit]
                del self._queue[: self._limit]
                await self._flush_batch(batch)
                self._done += len(batch)
                self._delivered()
                progress, self._progress = self._progress, anyio.Event()
                progress.set()
        finally:
            self._flushing = False

    async def _flush_batch(self, batch: list[_Entry]) -> None:
        try:
            stored = await self._write([entry.event for entry in batch])
        except Exception as exc:  # the store failed: this batch is not written
            for entry in batch:
                self._failed(entry, exc)
            return
        for entry, fresh in zip(batch, stored, strict=True):
            try:
                await self._deliver(entry.event, fresh)
            except Exception as exc:  # the caller's to hear of, never the flusher's
                self._failed(entry, exc)

    def _failed(self, entry: _Entry, exc: BaseException) -> None:
        entry.error = exc
        if not entry.waited and self._error is None:
            self._error = exc
