"""`NotifiedTaskEventStream`: a2a-sdk's cross-replica event stream, pushed.

The replica running a task stores each applied event in `task_events` (the
task store, in the transaction that saves the task) and then `publish`es
it: a notification on `CHANNEL` whose payload is the task id and the
version the event made, never the event. A replica serving SubscribeToTask
for a task that runs elsewhere waits on those notifications and reads the
new rows of that task from `task_events` (the table and columns a2a-sdk's
`DatabaseTaskEventStream` reads), so an idle subscription runs no
statement, and an event reaches it one notification and one read after it
was stored.

Contract:
- A subscription registers before its first read, so an event stored after
  that read is notified to it; a notification whose version the
  subscription has already yielded is not read again.
- While the process's listening connection (`notify.Notifier`) is down,
  notifications are lost: every subscription polls the table every `poll`
  seconds (the SDK's stream's way), and reads once more when the
  connection is back.
- Events come in the order of `seq`, each after `after` at most once.
- A notification that cannot be sent (the database unreachable) is logged,
  not raised: the event is stored and the task goes on; its remote
  subscribers read it with the task's next event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from a2a.server.cluster.database_event_stream import stream_response_to_event
from a2a.server.cluster.event_stream import TaskEventStream, VersionedEvent
from a2a.server.cluster.version import TaskVersion
from a2a.types.a2a_pb2 import StreamResponse

from ...errors import StoreError
from ..database.postgres import PgConnection
from ..notify import Notifier, notify

__all__ = ["CHANNEL", "NotifiedTaskEventStream"]

logger = logging.getLogger(__name__)

CHANNEL = "a2a_task_events"
"""The notification channel of stored task events: payload `version task_id`."""

POLL = 0.5
"""Seconds between a subscription's reads while notifications do not arrive
(the SDK's own stream's interval)."""


class _Subscription:
    def __init__(self) -> None:
        self.wake = anyio.Event()
        self.newest = -1
        """The highest version yielded so far."""

    def poke(self) -> None:
        self.wake.set()


def _version(version: TaskVersion) -> int | None:
    value: Any = version._value  # the SDK's own stream reads it the same way
    return value if isinstance(value, int) else None


class NotifiedTaskEventStream(TaskEventStream):
    """A `TaskEventStream` on `LISTEN/NOTIFY` (module docstring): reads and
    notifications on `connection`, notifications heard through `notifier`."""

    def __init__(
        self,
        connection: PgConnection,
        notifier: Notifier,
        *,
        table: str = "task_events",
        poll: float = POLL,
    ) -> None:
        self.connection = connection
        self.notifier = notifier
        self.table = table
        self.poll = poll
        self._subscriptions: dict[str, set[_Subscription]] = {}
        self._listening = False

    async def initialize(self) -> None:
        """Listen on `CHANNEL` (once; the table is the task store's)."""
        if not self._listening:
            self._listening = True
            await self.notifier.listen(CHANNEL, self._heard)
            self.notifier.on_change(self._changed)

    async def publish(self, task_id: str, event: VersionedEvent) -> None:
        """Notify the other replicas that `task_id` has a new stored event."""
        version = _version(event.version)
        payload = f"{version if version is not None else -1} {task_id}"
        try:
            await self.connection.run(lambda tx: notify(tx, CHANNEL, payload))
        except StoreError as exc:
            # The event is stored: the task goes on; remote subscribers
            # read it with the task's next event.
            logger.warning("could not notify task %s's event: %s", task_id, exc)

    async def subscribe(
        self, task_id: str, *, after: TaskVersion
    ) -> AsyncGenerator[VersionedEvent, None]:
        """The stored events of `task_id` newer than `after`, as they are stored."""
        await self.initialize()
        subscription = _Subscription()
        self._subscriptions.setdefault(task_id, set()).add(subscription)
        try:
            cursor = await self._start(task_id, after)
            while True:
                subscription.wake = anyio.Event()
                rows = await self._read(task_id, cursor)
                for row in rows:
                    cursor = row["seq"]
                    version = TaskVersion(row["task_version"])
                    subscription.newest = max(subscription.newest, row["task_version"])
                    if not version.is_after(after):
                        continue
                    response = StreamResponse()
                    response.ParseFromString(row["event_data"])
                    yield VersionedEvent(event=stream_response_to_event(response), version=version)
                if self.notifier.up:
                    await subscription.wake.wait()
                else:
                    with anyio.move_on_after(self.poll):
                        await subscription.wake.wait()
        finally:
            held = self._subscriptions.get(task_id)
            if held is not None:
                held.discard(subscription)
                if not held:
                    del self._subscriptions[task_id]

    async def destroy(self, task_id: str) -> None:
        """Nothing to release: the log is kept, subscribers stop by themselves."""
        del task_id

    async def _start(self, task_id: str, after: TaskVersion) -> int:
        """The `seq` to read from so nothing after `after` is missed."""
        if after.is_missing:
            return 0
        version = _version(after)
        if version is None:
            raise TypeError(f"task versions here are integers, got {after!r}")
        row = await self._run(
            lambda tx: tx.fetchrow(
                f"SELECT max(seq) AS seq FROM {self.table} WHERE task_id = ? AND task_version <= ?",
                (task_id, version),
            )
        )
        return int(row["seq"] or 0) if row is not None else 0

    async def _read(self, task_id: str, cursor: int) -> list[dict[str, Any]]:
        return await self._run(
            lambda tx: tx.fetch(
                f"SELECT seq, task_version, event_data FROM {self.table} "
                "WHERE task_id = ? AND seq > ? ORDER BY seq",
                (task_id, cursor),
            )
        )

    async def _run(self, fn: Any) -> Any:
        """`fn` on the connection; while the database is unreachable, tried
        again every `poll` seconds (the subscriber waits, as on the SDK's stream)."""
        while True:
            try:
                return await self.connection.run(fn)
            except StoreError as exc:
                logger.warning("reading task events failed (retried in %g s): %s", self.poll, exc)
                await anyio.sleep(self.poll)

    def _heard(self, payload: str) -> None:
        version, _, task_id = payload.partition(" ")
        try:
            stored = int(version)
        except ValueError:
            return  # not ours: nothing else is sent on the channel
        for subscription in self._subscriptions.get(task_id, ()):
            if stored < 0 or stored > subscription.newest:
                subscription.poke()

    def _changed(self, _up: bool) -> None:
        # Down: every subscription starts polling; up: each reads once what
        # it may have missed while notifications were lost.
        for held in self._subscriptions.values():
            for subscription in held:
                subscription.poke()
