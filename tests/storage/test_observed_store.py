"""One observing task-store wrapper (`storage.tasks.observed`) for both kinds of
a2a-sdk task store: listeners are told of each save after it is stored, in
the order added; observing an observed store gives one wrapper of the same
store (no wrapper around a wrapper) and leaves the one given as it was; a
versioned store (the replicas') stays versioned. Real stores: our SQLite
task store and a2a-sdk's versioned database store on an SQLite file."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from a2a.server.cluster import TaskVersion, VersionedDatabaseTaskStore, VersionedTaskStore
from a2a.server.context import ServerCallContext
from a2a.server.tasks import TaskStore
from a2a.types import Task, TaskState, TaskStatus
from sqlalchemy.ext.asyncio import create_async_engine

from a2a_orchestrator.storage.tasks.observed import OnSave, inside, observed
from a2a_orchestrator.storage.tasks.sqlite import SQLiteTaskStore, TaskOwner

pytestmark = pytest.mark.anyio


def _task(task_id: str) -> Task:
    return Task(id=task_id, context_id="c1", status=TaskStatus(state=TaskState.TASK_STATE_WORKING))


async def test_listeners_hear_each_save_in_order_through_one_wrapper(tmp_path: Path) -> None:
    store = SQLiteTaskStore(tmp_path / "t.db")
    heard: list[tuple[str, str, bool]] = []

    def listener(name: str) -> OnSave:
        async def on_save(task: Task, context: ServerCallContext) -> None:
            # Told after the save: the task is stored already.
            stored = await store.get(task.id, context)
            heard.append((name, task.id, stored is not None))

        return on_save

    context = ServerCallContext(user=TaskOwner("alice"))
    try:
        with anyio.fail_after(10):
            quotas = observed(store, listener("quotas"))
            both = observed(quotas, listener("metrics"))
            await both.save(_task("t1"), context)
            await quotas.save(_task("t2"), context)
    finally:
        store.close()
    assert isinstance(both, TaskStore)
    assert inside(both) is store and inside(quotas) is store
    assert heard == [
        ("quotas", "t1", True),
        ("metrics", "t1", True),
        # The store observed once is as it was: its one listener only.
        ("quotas", "t2", True),
    ]


async def test_a_versioned_store_stays_versioned(tmp_path: Path) -> None:
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'cluster.db'}")
    store = VersionedDatabaseTaskStore(engine, create_table=True)
    heard: list[str] = []

    async def on_save(task: Task, context: ServerCallContext) -> None:
        heard.append(task.id)

    context = ServerCallContext(user=TaskOwner("alice"))
    try:
        with anyio.fail_after(20):
            await store.initialize()
            wrapped = observed(observed(store, on_save), on_save)
            assert isinstance(wrapped, VersionedTaskStore)
            assert not isinstance(wrapped, TaskStore)
            assert inside(wrapped) is store
            version = await wrapped.save(
                _task("t1"),
                event=None,
                prev=None,
                prev_version=TaskVersion.MISSING,
                context=context,
            )
            got = await wrapped.get("t1", context)
    finally:
        await engine.dispose()
    assert heard == ["t1", "t1"]
    assert got is not None and got.task.id == "t1" and got.version == version
