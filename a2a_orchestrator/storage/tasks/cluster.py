"""The shared stores of role server replicas.

`PgTaskStore` (`postgres.py`) keeps every task with a version (a save from a
stale version fails, so a replica's write never silently replaces
another's, and a cancel recorded by one replica stops the writer on
another) and appends each applied event to `task_events` in the same
statement; a2a-sdk's `DatabaseTaskEventStream` tails that log, so
`DefaultRequestHandlerV2` serves SubscribeToTask on any replica with the
live events of the replica running the task. The event stream alone is
a2a-sdk's on SQLAlchemy's engine; the tasks and their push configs
(`push.py`) are on asyncpg.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.server.cluster import DatabaseTaskEventStream
from sqlalchemy.ext.asyncio import AsyncEngine

from .postgres import PgTaskStore

__all__ = ["ClusterStores"]

EVENT_POLL = 0.2
"""Seconds between a remote subscriber's looks at the event log (the SDK's
default, 0.5 s, makes every relayed event up to that late)."""


@dataclass(frozen=True)
class ClusterStores:
    """The task store and event stream replicas share, on one database."""

    url: str
    """The database's URL (asyncpg's connections: tasks, journal, leases)."""
    engine: AsyncEngine
    """SQLAlchemy's engine, for a2a-sdk's event stream."""
    tasks: PgTaskStore
    events: DatabaseTaskEventStream

    @classmethod
    def on(cls, engine: AsyncEngine) -> ClusterStores:
        url = engine.url.render_as_string(hide_password=False)
        return cls(
            url=url,
            engine=engine,
            tasks=PgTaskStore(url),
            events=DatabaseTaskEventStream(engine, create_table=True, poll_interval_s=EVENT_POLL),
        )

    async def initialize(self) -> None:
        """Create the tables (idempotent)."""
        await self.tasks.create()
        await self.events.initialize()

    async def close(self) -> None:
        self.tasks.close()
        await self.engine.dispose()
