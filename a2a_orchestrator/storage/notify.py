"""PostgreSQL `LISTEN/NOTIFY`: the one notify mechanism of the stores.

`Notifier` keeps one listening asyncpg connection per process (the replica
owns it): channels are registered with a callback each, and every
notification on a channel calls that channel's callbacks with its payload.
A notification carries a key (a task id, a row id), never the data: the
reader reads the rows it names, so a payload stays far under PostgreSQL's
8000-byte limit and nothing is lost when one is.

Contract:
- `listen(channel, callback)` registers a callback, before or while the
  notifier runs; callbacks run on the event loop and must not block.
- `running()` keeps the connection: it connects, LISTENs to every
  channel, and reconnects `retry` seconds after the connection drops (a
  database restart, `pg_terminate_backend`), then every `retry` seconds
  until it succeeds; a connection that does not answer a ping within
  `ping` seconds (checked every `ping` seconds) counts as dropped.
- A notification sent while the connection is down is lost: `up` says
  whether notifications arrive now, and every change of it is told to the
  `on_change` callbacks (after the LISTENs, when it comes back up), so a
  user re-reads what it may have missed and, while down, polls.
- `notify(tx, channel, payload)` sends one (delivered when the sending
  transaction commits); a payload of `MAX_PAYLOAD` bytes or more is a
  `ValueError`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from ..errors import ConfigError
from .database.postgres import Tx, _dsn, _shown

__all__ = ["MAX_PAYLOAD", "Notifier", "notify"]

logger = logging.getLogger(__name__)

MAX_PAYLOAD = 8000
"""PostgreSQL's limit on a notification's payload, in bytes."""

RETRY = 1.0
"""Seconds between attempts to reconnect a dropped listening connection."""

PING = 10.0
"""Seconds between checks that the listening connection still answers (and
the time it has to answer): a connection cut without a reset (a network
partition, a firewall's idle timeout) is otherwise taken for a live one,
and its notifications are lost with nobody polling."""


async def notify(tx: Tx, channel: str, payload: str) -> None:
    """Send `payload` on `channel` (delivered at the commit of `tx`'s transaction)."""
    if len(payload.encode()) >= MAX_PAYLOAD:
        raise ValueError(f"a notification's payload must stay under {MAX_PAYLOAD} bytes")
    await tx.execute("SELECT pg_notify(?, ?)", (channel, payload))


class Notifier:
    """One listening connection to the database at `url` (module docstring)."""

    def __init__(self, url: str, *, retry: float = RETRY, ping: float = PING) -> None:
        try:
            import asyncpg
        except ImportError as exc:  # the optional extra is missing
            raise ConfigError(
                "PostgreSQL notifications need asyncpg: pip install 'a2a-orchestrator[postgresql]'"
            ) from exc
        self._asyncpg = asyncpg
        self.url = url
        self.retry = retry
        self.ping = ping
        # One operation at a time on the connection (asyncpg refuses two):
        # a LISTEN added while it runs and the pings.
        self._lock = anyio.Lock()
        self.up = False
        """Whether notifications arrive now (the connection listens)."""
        self._callbacks: dict[str, list[Callable[[str], None]]] = {}
        self._on_change: list[Callable[[bool], None]] = []
        self._conn: Any = None
        self.connections = 0
        """How many times the connection was opened (reconnects + 1)."""

    async def listen(self, channel: str, callback: Callable[[str], None]) -> None:
        """Call `callback(payload)` for each notification on `channel`."""
        new = channel not in self._callbacks
        self._callbacks.setdefault(channel, []).append(callback)
        if new and self.up:
            try:
                async with self._lock:
                    await self._conn.add_listener(channel, self._dispatch)
            except (OSError, self._asyncpg.PostgresError, self._asyncpg.InterfaceError):
                # The connection is going: the reconnect LISTENs to it.
                logger.debug("LISTEN %s on a dropping connection", channel, exc_info=True)

    def on_change(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(up)` each time notifications stop or start arriving."""
        self._on_change.append(callback)

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server process id (None while down)."""
        return self._conn.get_server_pid() if self.up else None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Notifier]:
        """Keep the listening connection until the block exits."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._keep)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                self._set_up(False)
                if self._conn is not None and not self._conn.is_closed():
                    self._conn.terminate()

    async def _keep(self) -> None:
        while True:
            dropped = anyio.Event()
            try:
                self._conn = await self._asyncpg.connect(_dsn(self.url), timeout=10)
                self._conn.add_termination_listener(lambda _conn, dropped=dropped: dropped.set())
                listened: set[str] = set()
                # Until none is missing: a channel registered during an
                # await here is LISTENed too (`up` is set with no await after).
                while missing := set(self._callbacks) - listened:
                    for channel in missing:
                        await self._conn.add_listener(channel, self._dispatch)
                        listened.add(channel)
            except (
                OSError,
                TimeoutError,
                self._asyncpg.PostgresError,
                self._asyncpg.InterfaceError,
            ) as exc:
                logger.warning(
                    "cannot listen for notifications on %s (retried in %g s): %s",
                    _shown(self.url),
                    self.retry,
                    exc,
                )
                if self._conn is not None and not self._conn.is_closed():
                    self._conn.terminate()
                await anyio.sleep(self.retry)
                continue
            self.connections += 1
            self._set_up(True)
            await self._until_dropped(dropped)
            self._set_up(False)
            if not self._conn.is_closed():
                self._conn.terminate()
            logger.warning(
                "the notification connection to %s dropped; reconnecting in %g s",
                _shown(self.url),
                self.retry,
            )
            # Not at once: a database that just dropped its connections (a
            # restart, a failover) is not hammered; the users poll meanwhile.
            await anyio.sleep(self.retry)

    async def _until_dropped(self, dropped: anyio.Event) -> None:
        """Return when the connection drops or stops answering pings."""
        while True:
            with anyio.move_on_after(self.ping):
                await dropped.wait()
                return
            try:
                with anyio.fail_after(self.ping):
                    async with self._lock:
                        await self._conn.fetchval("SELECT 1")
            except (
                OSError,
                TimeoutError,
                self._asyncpg.PostgresError,
                self._asyncpg.InterfaceError,
            ) as exc:
                logger.warning(
                    "the notification connection to %s does not answer: %r", _shown(self.url), exc
                )
                return

    def _dispatch(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        for callback in list(self._callbacks.get(channel, ())):
            try:
                callback(payload)
            except Exception:
                # Contained: one user's failing callback must not stop the others'.
                logger.exception("a notification callback on %s failed", channel)

    def _set_up(self, up: bool) -> None:
        if up == self.up:
            return
        self.up = up
        for callback in list(self._on_change):
            callback(up)
