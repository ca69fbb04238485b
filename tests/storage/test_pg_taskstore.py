"""`PgTaskStore` (`storage/tasks/postgres.py`), the replicas' task store, on a
real PostgreSQL (`tests/support/postgres.py`): versions (a stale save is
refused and writes nothing; a cancel overwrites a running task but not an
ended one), the history as rows (a save writes what it added; a history
rewritten shorter loses its old rows), each applied event appended to
a2a-sdk's `task_events` log and read back by its `DatabaseTaskEventStream`,
the lease of a turn given back by the save that writes its end, listing and
the cross-owner reads."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest
from a2a.server.cluster import (
    ConcurrentTaskModificationError,
    DatabaseTaskEventStream,
    TaskVersion,
)
from a2a.server.context import ServerCallContext
from a2a.types import (
    ListTasksRequest,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from sqlalchemy.ext.asyncio import create_async_engine
from support.postgres import Postgres

from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.storage.database.postgres import PgConnection
from a2a_orchestrator.storage.leases import ConversationLeases
from a2a_orchestrator.storage.tasks.postgres import PgTaskStore
from a2a_orchestrator.storage.tasks.sqlite import TaskOwner

pytestmark = pytest.mark.anyio

ALICE = ServerCallContext(user=TaskOwner("alice"))
BOB = ServerCallContext(user=TaskOwner("bob"))


def message(message_id: str, text: str = "hi") -> Message:
    return Message(message_id=message_id, role=Role.ROLE_USER, parts=[Part(text=text)])


def task(
    task_id: str = "t1",
    state: TaskState = TaskState.TASK_STATE_WORKING,
    history: int = 1,
    context_id: str = "c1",
) -> Task:
    return Task(
        id=task_id,
        context_id=context_id,
        status=TaskStatus(state=state),
        history=[message(f"m{i}") for i in range(history)],
    )


def status(state: TaskState, task_id: str = "t1") -> TaskStatusUpdateEvent:
    return TaskStatusUpdateEvent(task_id=task_id, context_id="c1", status=TaskStatus(state=state))


@pytest.fixture
async def database(postgres: Postgres) -> str:
    return postgres.url(postgres.database("pgtasks"))


@pytest.fixture
async def store(database: str) -> AsyncIterator[PgTaskStore]:
    store = PgTaskStore(database)
    await store.create()
    try:
        yield store
    finally:
        store.close()


async def rows(database: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def test_versions_count_writes_and_a_stale_save_is_refused(
    store: PgTaskStore, database: str
) -> None:
    with anyio.fail_after(30):
        first = await store.save(
            task(), event=None, prev_version=TaskVersion.MISSING, context=ALICE
        )
        second = await store.save(task(history=2), event=None, prev_version=first, context=ALICE)
        # Another replica saving from the first version: refused.
        with pytest.raises(ConcurrentTaskModificationError):
            await store.save(task(history=5), event=None, prev_version=first, context=ALICE)
        # A first save of a task that exists: refused too.
        with pytest.raises(ConcurrentTaskModificationError):
            await store.save(task(), event=None, prev_version=TaskVersion.MISSING, context=BOB)
        stored = await store.get("t1", ALICE)
        hidden = await store.get("t1", BOB)
    assert (first, second) == (TaskVersion(1), TaskVersion(2))
    assert stored is not None and stored.version == TaskVersion(2)
    assert [m.message_id for m in stored.task.history] == ["m0", "m1"]
    assert hidden is None  # another owner's task is not found
    assert [r["seq"] for r in await rows(database, "SELECT seq FROM a2a_task_history")] == [0, 1]


async def test_a_cancel_overwrites_a_running_task_and_stops_its_writer(
    store: PgTaskStore, database: str
) -> None:
    with anyio.fail_after(30):
        version = await store.save(
            task(), event=None, prev_version=TaskVersion.MISSING, context=ALICE
        )
        # Another replica records the cancel without knowing the version.
        other = PgTaskStore(database)
        try:
            canceled = await other.save(
                task(state=TaskState.TASK_STATE_CANCELED),
                event=status(TaskState.TASK_STATE_CANCELED),
                prev_version=TaskVersion(99),
                context=ALICE,
            )
            # A cancel of an ended task is refused.
            with pytest.raises(ConcurrentTaskModificationError):
                await other.save(
                    task(state=TaskState.TASK_STATE_CANCELED),
                    event=None,
                    prev_version=canceled,
                    context=ALICE,
                )
        finally:
            other.close()
        # The writer's next save is stale: it learns of the cancel.
        with pytest.raises(ConcurrentTaskModificationError):
            await store.save(task(history=2), event=None, prev_version=version, context=ALICE)
        stored = await store.get("t1", ALICE)
    assert canceled == TaskVersion(2)
    assert stored is not None and stored.task.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_save_writes_the_history_it_added_and_a_shorter_one_whole(
    store: PgTaskStore, database: str
) -> None:
    with anyio.fail_after(30):
        version = await store.save(
            task(history=3), event=None, prev_version=TaskVersion.MISSING, context=ALICE
        )
        before = await rows(database, "SELECT seq, xmin::text AS x FROM a2a_task_history")
        version = await store.save(task(history=5), event=None, prev_version=version, context=ALICE)
        after = await rows(database, "SELECT seq, xmin::text AS x FROM a2a_task_history")
        # A history that is not an extension (shorter, another message): whole.
        shorter = task(history=2)
        shorter.history[1].message_id = "other"
        await store.save(shorter, event=None, prev_version=version, context=ALICE)
        stored = await store.get("t1", ALICE)
    untouched = {r["seq"]: r["x"] for r in before}
    # The three stored rows were not written again: the append wrote two.
    assert {r["seq"]: r["x"] for r in after if r["seq"] < 3} == untouched
    assert sorted(r["seq"] for r in after) == [0, 1, 2, 3, 4]
    assert stored is not None
    assert [m.message_id for m in stored.task.history] == ["m0", "other"]
    assert len(await rows(database, "SELECT seq FROM a2a_task_history")) == 2


async def test_each_applied_event_joins_the_sdks_event_log(
    store: PgTaskStore, database: str
) -> None:
    engine = create_async_engine(database.replace("postgresql://", "postgresql+asyncpg://"))
    stream = DatabaseTaskEventStream(engine, create_table=True, poll_interval_s=0.05)
    try:
        with anyio.fail_after(30):
            await stream.initialize()  # the table is there: left as it is
            first = task(state=TaskState.TASK_STATE_SUBMITTED)
            version = await store.save(
                first, event=first, prev_version=TaskVersion.MISSING, context=ALICE
            )
            # A save without an event (a message added) logs nothing.
            version = await store.save(
                task(state=TaskState.TASK_STATE_SUBMITTED, history=2),
                event=None,
                prev_version=version,
                context=ALICE,
            )
            await store.save(
                task(state=TaskState.TASK_STATE_COMPLETED, history=2),
                event=status(TaskState.TASK_STATE_COMPLETED),
                prev_version=version,
                context=ALICE,
            )
            seen = []
            async for versioned in stream.subscribe("t1", after=TaskVersion.MISSING):
                seen.append(versioned)
                if len(seen) == 2:
                    break
    finally:
        await engine.dispose()
    assert [v.version for v in seen] == [TaskVersion(1), TaskVersion(3)]
    assert isinstance(seen[0].event, Task) and seen[0].event.id == "t1"
    assert isinstance(seen[1].event, TaskStatusUpdateEvent)
    assert seen[1].event.status.state == TaskState.TASK_STATE_COMPLETED


async def test_the_turns_end_gives_its_lease_back_in_the_same_statement(
    store: PgTaskStore, database: str
) -> None:
    leases = ConversationLeases(PgConnection(database, "leases"), "R1", 30)
    try:
        with anyio.fail_after(30):
            assert await leases.acquire("c1", "t1", "alice") is not None
            hand_back = store.hand_back("t1", "c1", "R1")
            version = await store.save(
                task(), event=task(), prev_version=TaskVersion.MISSING, context=ALICE
            )
            # A save without an event in a state that is not running (the
            # SDK adding the next message to an input-required task) and a
            # working status keep the lease.
            version = await store.save(
                task(state=TaskState.TASK_STATE_INPUT_REQUIRED, history=2),
                event=None,
                prev_version=version,
                context=ALICE,
            )
            version = await store.save(
                task(history=2),
                event=status(TaskState.TASK_STATE_WORKING),
                prev_version=version,
                context=ALICE,
            )
            held = await leases.holder("c1")
            # A stale end writes nothing and gives nothing back.
            with pytest.raises(ConcurrentTaskModificationError):
                await store.save(
                    task(state=TaskState.TASK_STATE_COMPLETED, history=2),
                    event=status(TaskState.TASK_STATE_COMPLETED),
                    prev_version=TaskVersion(1),
                    context=ALICE,
                )
            still = (await leases.holder("c1"), hand_back.given)
            await store.save(
                task(state=TaskState.TASK_STATE_INPUT_REQUIRED, history=2),
                event=status(TaskState.TASK_STATE_INPUT_REQUIRED),
                prev_version=version,
                context=ALICE,
            )
            after = await leases.holder("c1")
    finally:
        leases.close()
    assert held == "R1"
    assert still == ("R1", False)
    assert hand_back.given and after is None
    (lease,) = await rows(database, "SELECT holder, turns FROM a2a_leases")
    assert lease["holder"] is None and lease["turns"] == 1


async def test_listing_pages_and_the_servers_own_reads(store: PgTaskStore) -> None:
    with anyio.fail_after(30):
        for n in range(5):
            t = task(f"t{n}", history=1)
            t.status.timestamp.FromNanoseconds(1_000 + n)
            await store.save(t, event=None, prev_version=TaskVersion.MISSING, context=ALICE)
        other = task("x", context_id="c2")
        await store.save(other, event=None, prev_version=TaskVersion.MISSING, context=BOB)
        first = await store.list(ListTasksRequest(context_id="c1", page_size=2), ALICE)
        second = await store.list(
            ListTasksRequest(context_id="c1", page_size=2, page_token=first.next_page_token), ALICE
        )
        empty = await store.list(ListTasksRequest(context_id="c2"), ALICE)
        owners = await store.context_owners("c2")
        opened = await store.task_opened_by("c1", "m0", ALICE)
        states = await store.states(["t0", "x", "absent"])
        await store.delete("t0", ALICE)
        gone = await store.get("t0", ALICE)
    assert [t.id for t in first.tasks] == ["t4", "t3"] and first.total_size == 5
    assert [t.id for t in second.tasks] == ["t2", "t1"] and second.total_size == 5
    assert [m.message_id for m in second.tasks[0].history] == ["m0"]
    assert empty.total_size == 0 and not empty.tasks
    assert owners == {"bob"}
    assert opened is not None and opened.id == "t4"
    assert states == {"t0": TaskState.TASK_STATE_WORKING, "x": TaskState.TASK_STATE_WORKING}
    assert gone is None


async def test_saves_at_once_commit_together_and_a_failing_one_fails_alone(
    store: PgTaskStore, database: str
) -> None:
    # A task id past task_events' 36 characters (a2a-sdk's column) makes its
    # event's insert fail: a database error inside a group of saves.
    bad = "x" * 40
    results: dict[str, object] = {}

    async def save(task_id: str) -> None:
        t = task(task_id)
        try:
            results[task_id] = await store.save(
                t, event=t, prev_version=TaskVersion.MISSING, context=ALICE
            )
        except StoreError as exc:
            results[task_id] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for n in range(20):
                group.start_soon(save, f"t{n}")
            group.start_soon(save, bad)
        stored = await rows(database, "SELECT id FROM a2a_tasks")
        logged = await rows(database, "SELECT task_id FROM task_events")
    assert isinstance(results[bad], StoreError)
    assert all(results[f"t{n}"] == TaskVersion(1) for n in range(20))
    assert sorted(r["id"] for r in stored) == sorted(f"t{n}" for n in range(20))
    assert len(logged) == 20
