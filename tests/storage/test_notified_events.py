"""The replicas' event stream by `LISTEN/NOTIFY` (`tasks/notified.py`,
`notify.py`) on a real PostgreSQL (`tests/support/postgres.py`): two
"replicas" (each its own cluster stores, listening connection and reads
connection on one database) where A stores events with a2a-sdk's versioned
task store and publishes them, and B's subscriptions hear of them.

Statements are counted on B's reads connection with asyncpg's query logger
(the real statements sent, nothing stubbed). Polling is made an hour long
where an event must come by notification, so an event that arrives in time
did not come by polling; an idle subscription sends no statement."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import asyncpg
import pytest
from a2a.server.cluster.event_stream import VersionedEvent
from a2a.server.cluster.version import TaskVersion
from a2a.server.context import ServerCallContext
from a2a.types import Task, TaskState, TaskStatus, TaskStatusUpdateEvent
from sqlalchemy.ext.asyncio import create_async_engine
from support.postgres import Postgres

from a2a_orchestrator.storage.tasks.cluster import ClusterStores

pytestmark = pytest.mark.anyio

HOUR = 3600.0
CALLER = ServerCallContext()


class Replica:
    """One process's cluster stores, its notifier running."""

    def __init__(self, stores: ClusterStores) -> None:
        self.stores = stores
        self.statements: list[str] = []

    def count_reads(self) -> None:
        """Log every statement B's reads connection sends from now on."""
        conn: Any = self.stores.events.connection._conn  # the real asyncpg connection
        assert conn is not None, "the stream has not read yet"
        conn.add_query_logger(lambda record: self.statements.append(record.query))


@asynccontextmanager
async def replicas(postgres: Postgres, *, poll: float) -> AsyncIterator[tuple[Replica, Replica]]:
    url = postgres.url(postgres.database("events"), "postgresql+asyncpg")
    async with AsyncExitStack() as stack:
        made = []
        for _ in range(2):
            stores = ClusterStores.on(create_async_engine(url))
            stores.events.poll = poll
            stores.notifier.retry = 0.2
            await stores.initialize()
            await stack.enter_async_context(stores.notifier.running())
            stack.push_async_callback(stores.close)
            made.append(Replica(stores))
        for replica in made:
            while not replica.stores.notifier.up:
                await anyio.sleep(0.01)
        yield made[0], made[1]


async def store_event(
    replica: Replica, task: Task, version: TaskVersion, state: TaskState
) -> TaskVersion:
    """Save the task in `state` with its event (as the SDK's task manager does),
    then publish the event (as the SDK's active task does)."""
    updated = Task()
    updated.CopyFrom(task)
    updated.status.CopyFrom(TaskStatus(state=state))
    event = TaskStatusUpdateEvent(
        task_id=task.id, context_id=task.context_id, status=updated.status
    )
    new = await replica.stores.tasks.save(
        updated, event=event, prev=task, prev_version=version, context=CALLER
    )
    task.CopyFrom(updated)
    await replica.stores.events.publish(task.id, VersionedEvent(event=event, version=new))
    return new


async def new_task(replica: Replica, task_id: str) -> tuple[Task, TaskVersion]:
    task = Task(id=task_id, context_id=f"ctx-{task_id}", status=TaskStatus())
    version = await store_event(replica, task, TaskVersion.MISSING, TaskState.TASK_STATE_SUBMITTED)
    return task, version


async def test_a_subscriber_on_another_replica_hears_events_by_notify_and_idles_free(
    postgres: Postgres,
) -> None:
    with anyio.fail_after(60):
        async with replicas(postgres, poll=HOUR) as (a, b):
            tasks = [await new_task(a, f"t{i}") for i in range(5)]
            subscriptions = [
                b.stores.events.subscribe(task.id, after=version) for task, version in tasks
            ]
            received: list[list[TaskState]] = [[] for _ in tasks]
            first_seen = anyio.Event()

            async def follow(i: int) -> None:
                async for versioned in subscriptions[i]:
                    received[i].append(versioned.event.status.state)
                    if i == 0:
                        first_seen.set()
                    if versioned.event.status.state == TaskState.TASK_STATE_COMPLETED:
                        return

            async with anyio.create_task_group() as tg:
                for i in range(len(tasks)):
                    tg.start_soon(follow, i)
                # Every subscription made its first read: from now on, count.
                while b.stores.events.connection._conn is None or len(
                    b.stores.events._subscriptions
                ) < len(tasks):
                    await anyio.sleep(0.01)
                await anyio.sleep(0.5)
                b.count_reads()
                await anyio.sleep(1.0)
                idle = list(b.statements)
                # One task works: only its subscription reads, once per event.
                task, version = tasks[0]
                version = await store_event(a, task, version, TaskState.TASK_STATE_WORKING)
                await first_seen.wait()
                version = await store_event(a, task, version, TaskState.TASK_STATE_COMPLETED)
                # The others end too, so every subscription stops by itself.
                for other, other_version in tasks[1:]:
                    await store_event(a, other, other_version, TaskState.TASK_STATE_COMPLETED)
    assert idle == []
    assert received[0] == [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_COMPLETED]
    assert all(r == [TaskState.TASK_STATE_COMPLETED] for r in received[1:])
    # The first task's two events read once each at most; the others' one each.
    assert len([s for s in b.statements if "task_events" in s]) <= 2 + len(tasks) - 1


async def test_events_still_arrive_while_the_listening_connection_is_killed(
    postgres: Postgres,
) -> None:
    with anyio.fail_after(60):
        async with replicas(postgres, poll=0.2) as (a, b):
            task, version = await new_task(a, "killed")
            subscription = b.stores.events.subscribe(task.id, after=version)
            received: list[TaskState] = []
            heard = anyio.Event()

            async def follow() -> None:
                async for versioned in subscription:
                    received.append(versioned.event.status.state)
                    heard.set()
                    if versioned.event.status.state == TaskState.TASK_STATE_COMPLETED:
                        return

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                while task.id not in b.stores.events._subscriptions:
                    await anyio.sleep(0.01)
                notifier = b.stores.notifier
                # Down for 5 s once killed: the event below is stored meanwhile.
                notifier.retry = 5.0
                pid = notifier.backend_pid
                # The listener's server process is ended, as an operator or a
                # failover would; an event stored now is notified to nobody on B.
                killer = await asyncpg.connect(postgres.url(_database(a)))
                try:
                    assert await killer.fetchval("SELECT pg_terminate_backend($1)", pid)
                finally:
                    await killer.close()
                while notifier.up:
                    await anyio.sleep(0.005)
                version = await store_event(a, task, version, TaskState.TASK_STATE_WORKING)
                await heard.wait()
                heard_while_down = not notifier.up and notifier.connections == 1
                # Back up (reconnected): the next event comes by notify again,
                # polling made an hour long.
                while not notifier.up:
                    await anyio.sleep(0.01)
                b.stores.events.poll = HOUR
                await store_event(a, task, version, TaskState.TASK_STATE_COMPLETED)
            reconnects = notifier.connections
    assert received == [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_COMPLETED]
    assert heard_while_down
    assert reconnects == 2


def _database(replica: Replica) -> str:
    name = replica.stores.engine.url.database
    assert name is not None
    return name
