"""`FrameBatcher`: a turn's child events as few A2A frames (the batch extension).

Every status update a role server sends costs a2a-sdk about half a
millisecond whatever it holds (the task manager's save, a copy of the whole
task per subscriber, one JSON encoding and one parse), so a child making a
hundred tool calls a second is bound by frames, not by events. A caller that
activates `wire.BATCH_EXTENSION` (the `A2A-Extensions` header) gets the
WORKING events (deltas, messages, tool calls and results) that a turn emits
without yielding in between as one status update: one message whose parts
are the events (`wire.working_part`, each with its kind and uuid in the
part's metadata), its metadata `{EVENT_KEY: "batch"}`. A caller that does not
activate it gets one frame per event, exactly as before (`wire.publish`).

Contract:
- Order: frames go out in the order of their events; one send at a time.
- No delay: `publish` of a WORKING event only queues it and wakes the
  flusher, a task that sends what has accumulated as soon as it runs, which
  is the first time the turn yields (awaits something that waits). A batch
  also goes out at once when it reaches `MAX_EVENTS` or `MAX_BYTES`, and
  when the caller says `now` (an event a pause rule holds the turn at: it
  reaches the caller before the turn waits).
- The turn's end with the events before it: an event that ends the turn
  (Done, Failed, InputRequired) while events are still queued goes in their
  batch, as its last part (its usage, spend and reason in the part's
  metadata), and the batch's status update has that event's state; Done's
  result artifact goes out just before it. A turn that emits its answer and
  ends without yielding (most turns' last step) so costs the caller no frame
  for its last batch: each frame costs a2a-sdk about 0.6 ms at both ends.
  With nothing queued, the event goes out alone as without batches. A
  caller of the extension's v1 (`wire.BATCH_EXTENSION_V1`) gets every
  turn-ending event alone, as v1 promised, and each batch names the
  version its caller activated. The bounds hold for the end too: a batch
  with no room left for it goes out first, the end alone after it.
- Other state changes alone: Started first sends what is queued, then goes
  out alone; a new task's Started goes in the task's own first frame
  instead (`executor.py`).
- A batch of one event is sent as that event's own frame.
- `flushing()` owns the flusher: on leaving it, what is queued is sent and
  the flusher is cancelled and awaited.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
from a2a.types import Part, TaskState

from ..runtime.events import ChildEvent
from .wire import (
    BATCH_EXTENSION,
    BATCH_KIND,
    EVENT_ID_KEY,
    EVENT_KEY,
    end_turn,
    publish,
    send_ending,
    to_wire,
    working_meta,
    working_part,
)

if TYPE_CHECKING:
    from a2a.server.tasks import TaskUpdater

__all__ = ["MAX_BYTES", "MAX_EVENTS", "FrameBatcher"]

MAX_EVENTS = 256
"""Events in one batch at most."""

MAX_BYTES = 1024 * 1024
"""Encoded size of one batch's parts at most (well under gRPC's default 4 MiB
message limit); an event larger than this goes in a frame of its own."""


class FrameBatcher:
    """Sends one turn's child events through `updater`, batched (see the module docstring)."""

    def __init__(
        self,
        updater: TaskUpdater,
        *,
        max_events: int = MAX_EVENTS,
        max_bytes: int = MAX_BYTES,
        extension: str = BATCH_EXTENSION,
    ) -> None:
        self._updater = updater
        self._extension = extension
        """The version of the batch extension the caller activated, named in
        each batch; under v2 a turn-ending event may end a batch."""
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._pending: list[tuple[ChildEvent, Part]] = []
        self._bytes = 0
        # Taken without a checkpoint when free: the flusher, once it runs,
        # sends what is queued then, not after the turn's next step.
        self._sending = anyio.Lock(fast_acquire=True)
        self._wake = anyio.Event()
        self._failure: Exception | None = None
        """Why the flusher's send failed (raised to the turn at its next event)."""

    async def publish(self, event: ChildEvent, *, now: bool = False) -> None:
        """Send `event`, in a batch when it is a WORKING event; `now`: the
        batch holding it goes out before this returns."""
        self._check()
        part = working_part(event)
        if part is None:
            async with self._sending:
                if self._pending and self._extension == BATCH_EXTENSION:
                    ending = await end_turn(self._updater, event)
                    if ending is not None:
                        await self._end_batch(event, *ending)
                        return
                await self._send_pending()
                await publish(self._updater, event)
            return
        size = part.ByteSize()
        if self._pending and self._bytes + size > self._max_bytes:
            await self.flush()
        self._pending.append((event, part))
        self._bytes += size
        if now:
            await self.flush()
        elif len(self._pending) >= self._max_events or self._bytes >= self._max_bytes:
            await self.flush()
            # A turn that never yields would queue every frame before the
            # server writes any: the full batch goes on its way first.
            await anyio.lowlevel.checkpoint()
        else:
            self._wake.set()

    async def flush(self) -> None:
        """Send what is queued (after any send in progress)."""
        async with self._sending:
            await self._send_pending()

    async def _end_batch(
        self, event: ChildEvent, state: TaskState, part: Part, meta: dict[str, Any]
    ) -> None:
        """Send what is queued with `event`, the turn's end (`end_turn`'s
        `state`, `part` and `meta`), as its last part; when the batch's bytes
        leave no room for it, the batch and then the event alone."""
        last = Part()
        last.CopyFrom(part)
        last.metadata.update(to_wire(meta))
        # Room by count there always is: a batch goes out on reaching
        # `max_events`, so fewer are ever queued here.
        if self._bytes + last.ByteSize() > self._max_bytes:
            await self._send_pending()
            await send_ending(self._updater, event, (state, part, meta))
            return
        self._pending.append((event, last))
        await self._send_pending(state)

    async def _send_pending(self, state: TaskState = TaskState.TASK_STATE_WORKING) -> None:
        """Send what is queued: one event as its own frame, more as a batch
        in `state` (WORKING, or the state of the turn's end it closes with)."""
        # Taken before the first await: events queued while this sends
        # belong to the next frame.
        pending, self._pending, self._bytes = self._pending, [], 0
        if not pending:
            return
        if len(pending) == 1:
            await publish(self._updater, pending[0][0])
            return
        parts = []
        for event, part in pending:
            part.metadata.update({**to_wire(working_meta(event)), EVENT_ID_KEY: event.uuid})
            parts.append(part)
        message = self._updater.new_agent_message(parts, metadata={EVENT_KEY: BATCH_KIND})
        message.extensions.append(self._extension)
        await self._updater.update_status(state, message)

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _flush_when_woken(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self.flush()
            except Exception as exc:
                # The turn's next emit raises it, as a send of its own would.
                self._failure = exc
                return

    @contextlib.asynccontextmanager
    async def flushing(self) -> AsyncIterator[FrameBatcher]:
        """The flusher runs while this is entered; leaving sends what is left."""
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._flush_when_woken)
            try:
                yield self
                self._check()
                await self.flush()
            except Exception as exc:
                # Raised outside the task group, so the caller sees the error
                # itself rather than an exception group around it.
                failure = exc
            finally:
                tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
