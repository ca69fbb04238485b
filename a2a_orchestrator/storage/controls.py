"""Control messages between role server replicas, in PostgreSQL.

A control message (pause, resume, interrupt, steer, pause rules) reaches a
task through the conversation running its turn; with replicas, the replica
that received it may not be the one running the turn. `ControlRelay`
carries it there: the sender stores it as a row of `a2a_control` naming the
replica that holds the task's lease, and notifies (`notify.py`) the row's
id on `SENT`; that replica takes the row (deletes it: taken once), applies
it, and notifies the outcome on `DONE`, which the sender waits for.

Contract:
- `send` answers True (applied), False (refused by the holder: a steer past
  its turn's last step boundary, or no turn held there any more; or nobody
  took it within `wait` seconds, the row then withdrawn so it is never
  applied late), in at most `wait` seconds plus one statement.
- A row sent while the holder's listening connection was down is taken
  when that connection is back (`Notifier.on_change`); while the sender's
  is down it learns only that the row was taken (counted as applied).
- Payloads are ids, never the message: a steer's text can be long.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..errors import StoreError
from .database import Table
from .database.postgres import PgConnection, PgDatabase, Tx
from .notify import Notifier, notify

__all__ = ["DONE", "SENT", "TABLE", "ControlMessage", "ControlRelay"]

logger = logging.getLogger(__name__)

TABLE = Table(
    name="a2a_control",
    columns=(
        "id TEXT PRIMARY KEY, replica TEXT NOT NULL, task_id TEXT NOT NULL, "
        "action TEXT NOT NULL, text TEXT NOT NULL, rules TEXT NOT NULL, "
        "sent_at DOUBLE PRECISION NOT NULL"
    ),
    indexes=("CREATE INDEX IF NOT EXISTS a2a_control_replica ON a2a_control (replica)",),
)

SENT = "a2a_control"
"""Channel of control messages stored: payload `replica id`."""
DONE = "a2a_control_done"
"""Channel of control messages applied: payload `id 1` (applied) or `id 0`."""

WAIT = 2.0
"""Seconds a sender waits for the holder's answer."""

_POLL = 0.1
"""Seconds between a sender's looks at its row while it cannot hear answers."""


@dataclass(frozen=True, kw_only=True)
class ControlMessage:
    """A control message as the replica running the task applies it."""

    id: str
    task_id: str
    action: str
    text: str = ""
    rules: Mapping[str, Any] = field(default_factory=dict)
    """`pause_on`'s rules as sent on the wire (`PAUSE_ON_KEY`)."""


@dataclass
class _Waiter:
    answered: anyio.Event = field(default_factory=anyio.Event)
    applied: bool = False


class ControlRelay:
    """This replica's end of the control relay (module docstring): `apply`
    applies a message taken here and says whether it was."""

    def __init__(
        self,
        connection: PgConnection,
        notifier: Notifier,
        replica: str,
        apply: Callable[[ControlMessage], bool],
        *,
        wait: float = WAIT,
    ) -> None:
        self.connection = connection
        self.notifier = notifier
        self.replica = replica
        self.apply = apply
        self.wait = wait
        self._waiting: dict[str, _Waiter] = {}
        self._tg: TaskGroup | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Create the table, listen, and take messages until the block exits."""
        await PgDatabase(self.connection).create(TABLE)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self.notifier.listen(SENT, self._heard_sent)
            await self.notifier.listen(DONE, self._heard_done)
            self.notifier.on_change(self._changed)
            tg.start_soon(self._take, None)  # sent while this replica was away
            try:
                yield
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    async def send(
        self, holder: str, task_id: str, action: str, text: str, rules: Mapping[str, Any]
    ) -> bool:
        """Have replica `holder` apply a control message to `task_id`'s turn."""
        message_id = uuid.uuid4().hex
        waiter = self._waiting[message_id] = _Waiter()

        async def store(tx: Tx) -> None:
            async with tx.conn.transaction():
                await tx.execute(
                    "INSERT INTO a2a_control (id, replica, task_id, action, text, rules, sent_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (message_id, holder, task_id, action, text, json.dumps(rules), time.time()),
                )
                await notify(tx, SENT, f"{holder} {message_id}")

        try:
            await self.connection.run(store)
            with anyio.move_on_after(self.wait):
                while True:
                    if self.notifier.up:
                        await waiter.answered.wait()
                        return waiter.applied
                    with anyio.move_on_after(_POLL):
                        await waiter.answered.wait()
                        return waiter.applied
                    if not await self._pending(message_id):
                        return True  # taken; its answer went unheard
            # Withdrawn unless taken meanwhile: never applied after this answer.
            return not await self._withdraw(message_id)
        finally:
            self._waiting.pop(message_id, None)

    async def _pending(self, message_id: str) -> bool:
        row = await self.connection.run(
            lambda tx: tx.fetchrow("SELECT 1 AS one FROM a2a_control WHERE id = ?", (message_id,))
        )
        return row is not None

    async def _withdraw(self, message_id: str) -> bool:
        row = await self.connection.run(
            lambda tx: tx.fetchrow(
                "DELETE FROM a2a_control WHERE id = ? RETURNING id", (message_id,)
            )
        )
        return row is not None

    def _heard_sent(self, payload: str) -> None:
        replica, _, message_id = payload.rpartition(" ")
        if replica == self.replica and self._tg is not None:
            self._tg.start_soon(self._take, message_id)

    def _heard_done(self, payload: str) -> None:
        message_id, _, applied = payload.partition(" ")
        waiter = self._waiting.get(message_id)
        if waiter is not None:
            waiter.applied = applied == "1"
            waiter.answered.set()

    def _changed(self, up: bool) -> None:
        if up and self._tg is not None:
            self._tg.start_soon(self._take, None)

    async def _take(self, message_id: str | None) -> None:
        """Take and apply the message `message_id` (None: every one sent here)."""
        sql = "DELETE FROM a2a_control WHERE replica = ?"
        params: list[Any] = [self.replica]
        if message_id is not None:
            sql += " AND id = ?"
            params.append(message_id)
        try:
            rows = await self.connection.run(
                lambda tx: tx.fetch(sql + " RETURNING id, task_id, action, text, rules", params)
            )
        except StoreError as exc:
            # Its sender withdraws it unanswered; a later reconnect takes the rest.
            logger.warning("could not take control messages: %s", exc)
            return
        for row in rows:
            message = ControlMessage(
                id=row["id"],
                task_id=row["task_id"],
                action=row["action"],
                text=row["text"],
                rules=json.loads(row["rules"]),
            )
            try:
                applied = self.apply(message)
            except Exception:
                # Contained: one bad message must not stop the others.
                logger.exception("applying control message %s failed", message.id)
                applied = False
            try:
                await self._answer(f"{message.id} {int(applied)}")
            except StoreError as exc:
                logger.warning("could not answer control message %s: %s", message.id, exc)

    async def _answer(self, answer: str) -> None:
        await self.connection.run(lambda tx: notify(tx, DONE, answer))
