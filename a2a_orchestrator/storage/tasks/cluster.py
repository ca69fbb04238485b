"""The shared task store of role server replicas, and their event stream.

a2a-sdk's `VersionedDatabaseTaskStore` keeps every task with a version (a
save from a stale version fails, so a replica's write never silently
replaces another's, and a cancel recorded by one replica stops the writer
on another) and appends each applied event to `task_events` in the same
transaction. `NotifiedTaskEventStream` (`notified.py`) tells the other
replicas of each stored event by `LISTEN/NOTIFY` and reads it from that
log, so `DefaultRequestHandlerV2` serves SubscribeToTask on any replica with
the live events of the replica running the task, and an idle subscription
costs the database nothing. `notifier` is the process's one listening
connection; its owner runs it (`Notifier.running`).
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.server.cluster import VersionedDatabaseTaskStore
from sqlalchemy.ext.asyncio import AsyncEngine

from ..database.postgres import PgConnection
from ..notify import Notifier
from .notified import NotifiedTaskEventStream

__all__ = ["ClusterStores"]


@dataclass(frozen=True)
class ClusterStores:
    """The task store and event stream replicas share, on one database."""

    engine: AsyncEngine
    tasks: VersionedDatabaseTaskStore
    events: NotifiedTaskEventStream
    notifier: Notifier

    @classmethod
    def on(cls, engine: AsyncEngine) -> ClusterStores:
        url = engine.url.render_as_string(hide_password=False)
        notifier = Notifier(url)
        return cls(
            engine=engine,
            tasks=VersionedDatabaseTaskStore(engine, create_table=True),
            events=NotifiedTaskEventStream(PgConnection(url, "task event stream"), notifier),
            notifier=notifier,
        )

    async def initialize(self) -> None:
        """Create the tables (idempotent) and listen for stored events."""
        await self.tasks.initialize()
        await self.events.initialize()

    def close(self) -> None:
        self.events.connection.close()
