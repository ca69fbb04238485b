"""`observed`: a task store that tells listeners of every task it saves.

The one observing wrapper of a role server's task stores, for either kind
a2a-sdk has: a `TaskStore` (a role server's own SQLite file,
`SQLiteTaskStore`, or the SDK's database store) and a `VersionedTaskStore`
(the replicas' shared store, `tasks/cluster.py`). The request handler must be
given a store of the kind it was, so the wrapper is of the same kind (two
classes, as the SDK has two interfaces; one body, `_Observed`).

Contract:
- A listener (`on_save(task, context)`) is told after the save returned,
  so what it is told of is stored; listeners are told in the order they
  were added, each after the one before returned. A listener's error is
  the save's error (the task is stored; the caller hears the save failed).
- Observing an observed store again gives one wrapper of the same store
  with the listener added (one wrapper whatever the number of listeners:
  quotas, metrics, the executor's wait for a new task's first write); the
  observed store given is left as it was.
- Every other call goes to the store inside (`inner`) unchanged; `inside`
  is that store, for the calls only it has.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, overload

from a2a.server.cluster import StoredTask, TaskVersion, VersionedTaskStore
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.tasks import TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task

__all__ = ["ObservedTaskStore", "ObservedVersionedStore", "OnSave", "inside", "observed"]

OnSave = Callable[[Task, ServerCallContext], Awaitable[None]]


class _Observed:
    """What both kinds of wrapper share: the store inside and the listeners."""

    def __init__(self, inner: Any, listeners: tuple[OnSave, ...]) -> None:
        self.inner = inner
        self.listeners = listeners

    async def _told(self, task: Task, context: ServerCallContext) -> None:
        for on_save in self.listeners:
            await on_save(task, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self.inner.delete(task_id, context)


class ObservedTaskStore(_Observed, TaskStore):
    """A `TaskStore` telling its listeners of every save (module docstring)."""

    inner: TaskStore

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await self.inner.save(task, context)
        await self._told(task, context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self.inner.get(task_id, context)


class ObservedVersionedStore(_Observed, VersionedTaskStore):
    """A `VersionedTaskStore` telling its listeners of every save (module docstring)."""

    inner: VersionedTaskStore

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
        await self._told(task, context)
        return version

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        return await self.inner.get(task_id, context)


@overload
def observed(store: TaskStore, on_save: OnSave) -> TaskStore: ...
@overload
def observed(store: VersionedTaskStore, on_save: OnSave) -> VersionedTaskStore: ...
@overload
def observed(
    store: TaskStore | VersionedTaskStore, on_save: OnSave
) -> TaskStore | VersionedTaskStore: ...
def observed(
    store: TaskStore | VersionedTaskStore, on_save: OnSave
) -> TaskStore | VersionedTaskStore:
    """`store`, telling `on_save` of each save, of the same kind."""
    listeners: tuple[OnSave, ...] = (on_save,)
    if isinstance(store, _Observed):
        listeners = (*store.listeners, on_save)
        store = store.inner
    if isinstance(store, VersionedTaskStore):
        return ObservedVersionedStore(store, listeners)
    return ObservedTaskStore(store, listeners)


def inside(store: object) -> object:
    """The store an observed `store` wraps (`store` itself if not observed)."""
    return store.inner if isinstance(store, _Observed) else store
