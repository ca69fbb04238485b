"""Watchers: who hears of a session's child events, off the children's path.

A child's event is stored before anyone hears of it, and that append is all
the child waits for. Each watcher (a control plane's delivery, a
supervisor's subscriptions, reactions, a relay to a UI, any listener) gets
the stored events through a bounded stream of its own, read by a task in
the session's task group, so a watcher that is slow (a hook's subprocess, a
parent's turn, a peer over HTTP) or fails never stalls or fails a child.

Contract:
- Each watcher hears events in the order they were stored, one at a time.
- A watcher that raises is logged and goes on with the next event: its
  error is its own, never the child's.
- A watcher that falls `WATCHER_BUFFER` events behind is detached (logged):
  memory stays bounded and the children go on.
- `publish(..., after)` awaits `after` once every watcher has dealt with
  the event (at once when there is none); a run that holds itself at an
  event for its parent to decide on is released there if nobody did.
- Removing a watcher lets it finish the events it was given, then stops it.
- A tap (`tap`) is a watcher that is its own stream: a plain function that
  only puts the event into a stream its reader owns (a relay to a UI), so
  it is called as the event is published, with no task between.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..runtime.events import ChildEvent

if TYPE_CHECKING:
    from .base import ChildHandle, Listener

Tap = Callable[["ChildHandle", ChildEvent], None]

__all__ = ["WATCHER_BUFFER", "Watchers"]

logger = logging.getLogger(__name__)

WATCHER_BUFFER = 10_000
"""Events a watcher may be behind before it is detached."""

After = Callable[[], Awaitable[None]]


class _Countdown:
    """Runs `after` once the last of `count` watchers is done with an event."""

    def __init__(self, count: int, after: After | None) -> None:
        self.count = count
        self.after = after

    async def done(self) -> None:
        self.count -= 1
        if self.count == 0 and self.after is not None:
            try:
                await self.after()
            except Exception:
                logger.exception("releasing a child after its watchers failed")


_Item = tuple["ChildHandle", ChildEvent, _Countdown]


class _Watcher:
    def __init__(self, listener: Listener, handled: Callable[[], None]) -> None:
        self.listener = listener
        self.handled = handled
        self.send: MemoryObjectSendStream[_Item]
        self.receive: MemoryObjectReceiveStream[_Item]
        self.send, self.receive = anyio.create_memory_object_stream[_Item](WATCHER_BUFFER)
        self.attached = True
        self.started = False

    async def consume(self) -> None:
        async with self.receive:
            async for handle, event, countdown in self.receive:
                try:
                    await self.listener(handle, event)
                except Exception:
                    # The watcher's failure (a template, a hook, a closed
                    # peer) is the watcher's: the child's own result stands.
                    logger.exception(
                        "watcher failed on %s of child %s", event.kind, handle.child_id
                    )
                await countdown.done()
                self.handled()


class Watchers:
    """A session's watchers (see the module docstring)."""

    def __init__(self) -> None:
        self._watchers: list[_Watcher] = []
        self._taps: list[Tap] = []
        self._tg: TaskGroup | None = None
        self._pending = 0
        """Events handed to watchers that they have not dealt with yet."""
        self._idle = anyio.Event()
        self._idle.set()

    def start(self, tg: TaskGroup) -> None:
        """Run the watchers' tasks in `tg` (the session's), now and from now on."""
        self._tg = tg
        for watcher in self._watchers:
            self._run(watcher)

    def _run(self, watcher: _Watcher) -> None:
        if self._tg is not None and not watcher.started:
            watcher.started = True
            self._tg.start_soon(watcher.consume, name="watcher")

    def _handled(self) -> None:
        self._pending -= 1
        if self._pending == 0:
            self._idle.set()

    async def drained(self) -> None:
        """Return once every watcher has dealt with every event published so
        far (and with those published meanwhile)."""
        while self._pending:
            await self._idle.wait()

    def add(self, listener: Listener) -> Callable[[], None]:
        """Feed `listener` every event published from now on; returns a
        function that removes it."""
        watcher = _Watcher(listener, self._handled)
        self._watchers.append(watcher)
        self._run(watcher)
        return lambda: self._detach(watcher)

    def tap(self, tap: Tap) -> Callable[[], None]:
        """Call `tap` with every event published from now on, as it is
        published; it must not block. Returns a function that removes it."""
        self._taps.append(tap)

        def remove() -> None:
            if tap in self._taps:
                self._taps.remove(tap)

        return remove

    def _detach(self, watcher: _Watcher) -> None:
        if watcher.attached:
            watcher.attached = False
            self._watchers.remove(watcher)
            watcher.send.close()

    async def publish(self, handle: ChildHandle, event: ChildEvent, after: After | None) -> None:
        """Hand a stored event to every watcher without waiting for them."""
        for tap in list(self._taps):
            try:
                tap(handle, event)
            except Exception:
                logger.exception("tap failed on %s of child %s", event.kind, handle.child_id)
        watchers = list(self._watchers)
        countdown = _Countdown(len(watchers), after)
        if not watchers:
            if after is not None:
                await after()
            return
        for watcher in watchers:
            try:
                watcher.send.send_nowait((handle, event, countdown))
                if self._pending == 0:
                    self._idle = anyio.Event()
                self._pending += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._detach(watcher)  # its task ended (the session is closing)
                await countdown.done()
            except anyio.WouldBlock:
                logger.error(
                    "a watcher fell %d events behind; detached (child %s goes on)",
                    WATCHER_BUFFER,
                    handle.child_id,
                )
                self._detach(watcher)
                await countdown.done()
