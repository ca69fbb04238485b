"""The shared task store of role server replicas: a2a-sdk's cluster pieces.

`VersionedDatabaseTaskStore` keeps every task with a version (a save from a
stale version fails, so a replica's write never silently replaces
another's, and a cancel recorded by one replica stops the writer on
another) and appends each applied event to `task_events` in the same
transaction; `DatabaseTaskEventStream` tails that log, so
`DefaultRequestHandlerV2` serves SubscribeToTask on any replica with the
live events of the replica running the task.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.server.cluster import (
    DatabaseTaskEventStream,
    VersionedDatabaseTaskStore,
)
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["ClusterStores"]

EVENT_POLL = 0.2
"""Seconds between a remote subscriber's looks at the event log (the SDK's
default, 0.5 s, makes every relayed event up to that late)."""


@dataclass(frozen=True)
class ClusterStores:
    """The task store and event stream replicas share, on one engine."""

    engine: AsyncEngine
    tasks: VersionedDatabaseTaskStore
    events: DatabaseTaskEventStream

    @classmethod
    def on(cls, engine: AsyncEngine) -> ClusterStores:
        return cls(
            engine=engine,
            tasks=VersionedDatabaseTaskStore(engine, create_table=True),
            events=DatabaseTaskEventStream(engine, create_table=True, poll_interval_s=EVENT_POLL),
        )

    async def initialize(self) -> None:
        """Create the tables (idempotent)."""
        await self.tasks.initialize()
        await self.events.initialize()
