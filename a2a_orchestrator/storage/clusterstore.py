"""The shared task store of role server replicas: a2a-sdk's cluster pieces.

`VersionedDatabaseTaskStore` keeps every task with a version (a save from a
stale version fails, so a replica's write never silently replaces
another's, and a cancel recorded by one replica stops the writer on
another) and appends each applied event to `task_events` in the same
transaction; `DatabaseTaskEventStream` tails that log, so
`DefaultRequestHandlerV2` serves SubscribeToTask on any replica with the
live events of the replica running the task.

`observed` wraps either kind of store to tell a listener of every save
(quotas, the executor's wait for a new task's first write).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from a2a.server.cluster import (
    DatabaseTaskEventStream,
    StoredTask,
    TaskVersion,
    VersionedDatabaseTaskStore,
    VersionedTaskStore,
)
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.tasks import TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task
from sqlalchemy.ext.asyncio import AsyncEngine

from .taskstore import ObservedTaskStore

__all__ = ["ClusterStores", "ObservedVersionedStore", "observed"]

OnSave = Callable[[Task, ServerCallContext], Awaitable[None]]

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


class ObservedVersionedStore(VersionedTaskStore):
    """`inner`, telling `on_save` of every task saved, after it is saved."""

    def __init__(self, inner: VersionedTaskStore, on_save: OnSave) -> None:
        self.inner = inner
        self._on_save = on_save

    async def save(
        self,
        task: Task,
        *,
        event: Event | None,
        prev: Task | None,
        prev_version: TaskVersion,
        context: ServerCallContext,
    ) -> TaskVersion:
        version = await self.inner.save(
            task, event=event, prev=prev, prev_version=prev_version, context=context
        )
        await self._on_save(task, context)
        return version

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        return await self.inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self.inner.delete(task_id, context)


def observed(
    store: TaskStore | VersionedTaskStore, on_save: OnSave
) -> TaskStore | VersionedTaskStore:
    """`store`, telling `on_save` of each save, of the same kind (versioned or not)."""
    if isinstance(store, VersionedTaskStore):
        return ObservedVersionedStore(store, on_save)
    return ObservedTaskStore(store, on_save)
