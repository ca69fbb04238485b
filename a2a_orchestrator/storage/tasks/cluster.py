"""The shared stores of role server replicas, and their event stream.

`PgTaskStore` (`postgres.py`) keeps every task with a version (a save from a
stale version fails, so a replica's write never silently replaces
another's, and a cancel recorded by one replica stops the writer on
another) and appends each applied event to `task_events` in the same
statement. `NotifiedTaskEventStream` (`notified.py`) tells the other
replicas of each stored event by `LISTEN/NOTIFY` and reads it from that
log, so `DefaultRequestHandlerV2` serves SubscribeToTask on any replica with
the live events of the replica running the task, and an idle subscription
costs the database nothing. `notifier` is the process's one listening
connection; its owner runs it (`Notifier.running`). Tasks, their push
configs (`push.py`), events and notifications are all on asyncpg.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from ..database.postgres import PgConnection
from ..notify import Notifier
from .notified import NotifiedTaskEventStream
from .postgres import PgTaskStore

__all__ = ["ClusterStores"]


@dataclass(frozen=True)
class ClusterStores:
    """The task store and event stream replicas share, on one database."""

    url: str
    """The database's URL (asyncpg's connections: tasks, journal, leases)."""
    engine: AsyncEngine
    """SQLAlchemy's engine, which the server made from `--db` (its URL)."""
    tasks: PgTaskStore
    events: NotifiedTaskEventStream
    notifier: Notifier

    @classmethod
    def on(cls, engine: AsyncEngine) -> ClusterStores:
        url = engine.url.render_as_string(hide_password=False)
        notifier = Notifier(url)
        return cls(
            url=url,
            engine=engine,
            tasks=PgTaskStore(url),
            events=NotifiedTaskEventStream(PgConnection(url, "task event stream"), notifier),
            notifier=notifier,
        )

    async def initialize(self) -> None:
        """Create the tables (idempotent) and listen for stored events."""
        await self.tasks.create()
        await self.events.initialize()

    async def close(self) -> None:
        self.tasks.close()
        self.events.connection.close()
        await self.engine.dispose()
