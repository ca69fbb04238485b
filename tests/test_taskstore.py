"""SQLiteTaskStore against the TaskStore contract, and the SQLAlchemy-URL path."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from a2a.auth.user import UnauthenticatedUser
from a2a.server.context import ServerCallContext
from a2a.types import GetTaskRequest, ListTasksRequest, Task, TaskState, TaskStatus
from conftest import a2a_client, role_server
from starlette.authentication import SimpleUser

from a2a_orchestrator.taskstore import SQLiteTaskStore
from a2a_orchestrator.wire import EVENT_KEY

pytestmark = pytest.mark.anyio


def as_user(name: str) -> ServerCallContext:
    from a2a.server.routes.common import StarletteUser

    return ServerCallContext(
        user=StarletteUser(SimpleUser(name)) if name else UnauthenticatedUser()
    )


def task(task_id: str, context_id: str, state: TaskState, seconds: int) -> Task:
    status = TaskStatus(state=state)
    status.timestamp.FromSeconds(seconds)
    return Task(id=task_id, context_id=context_id, status=status)


async def test_save_get_delete_and_owner_scoping(tmp_path: Path) -> None:
    store = SQLiteTaskStore(tmp_path / "t.db")
    alice, bob = as_user("alice"), as_user("bob")
    await store.save(task("t1", "c1", TaskState.TASK_STATE_WORKING, 1), alice)
    got = await store.get("t1", alice)
    assert got is not None and got.status.state == TaskState.TASK_STATE_WORKING
    assert await store.get("t1", bob) is None
    # Bob cannot overwrite Alice's task either.
    await store.save(task("t1", "c1", TaskState.TASK_STATE_FAILED, 2), bob)
    assert (await store.get("t1", alice)).status.state == TaskState.TASK_STATE_WORKING  # type: ignore[union-attr]
    await store.delete("t1", bob)
    assert await store.get("t1", alice) is not None
    await store.delete("t1", alice)
    assert await store.get("t1", alice) is None
    store.close()


async def test_list_filters_orders_and_pages(tmp_path: Path) -> None:
    store = SQLiteTaskStore(tmp_path / "t.db")
    me = as_user("me")
    for index in range(5):
        state = TaskState.TASK_STATE_COMPLETED if index % 2 else TaskState.TASK_STATE_WORKING
        await store.save(
            task(f"t{index}", "c-even" if index % 2 == 0 else "c-odd", state, index), me
        )
    await store.save(task("other", "c-even", TaskState.TASK_STATE_WORKING, 99), as_user("else"))
    page = await store.list(ListTasksRequest(page_size=2), me)
    assert [t.id for t in page.tasks] == ["t4", "t3"] and page.total_size == 5
    second = await store.list(ListTasksRequest(page_size=2, page_token=page.next_page_token), me)
    third = await store.list(ListTasksRequest(page_size=2, page_token=second.next_page_token), me)
    assert [t.id for t in second.tasks] == ["t2", "t1"]
    assert [t.id for t in third.tasks] == ["t0"] and third.next_page_token == ""
    by_context = await store.list(ListTasksRequest(context_id="c-even"), me)
    assert [t.id for t in by_context.tasks] == ["t4", "t2", "t0"]
    done = await store.list(ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED), me)
    assert [t.id for t in done.tasks] == ["t3", "t1"]
    unfinished = await store.unfinished()
    assert sorted(t.id for t, _ in unfinished) == ["other", "t0", "t2", "t4"]
    store.close()


async def test_a_sqlalchemy_url_uses_the_sdk_database_store(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'sdk.db'}"
    with anyio.fail_after(20):
        async with role_server(tmp_path, lambda m: {"text": "kept"}, db=url) as server:
            async with a2a_client(server.url) as client:
                from test_server import collect, task_id_of, user_message

                responses, _ = await collect(client, user_message("remember"))
        async with role_server(tmp_path, lambda m: {"text": "kept"}, db=url) as server:
            async with a2a_client(server.url) as client:
                stored = await client.get_task(GetTaskRequest(id=task_id_of(responses)))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert stored.artifacts[0].parts[0].text == "kept"
    assert (tmp_path / "sdk.db").exists()


# --- coalesced frame saves ----------------------------------------------------


def on_disk(path: Path, task_id: str) -> Task | None:
    """The task as another process would read it from the file."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT data FROM tasks WHERE id = ?", (task_id,)).fetchone()
    finally:
        conn.close()
    return Task.FromString(row[0]) if row else None


def frame(base: Task, text: str, kind: str = "message") -> Task:
    """`base` with one more agent frame as its status message, state unchanged."""
    from a2a.helpers import new_text_message
    from a2a.types import Role

    updated = Task()
    updated.CopyFrom(base)
    if updated.status.HasField("message"):
        updated.history.append(updated.status.message)
    message = new_text_message(text, role=Role.ROLE_AGENT)
    message.metadata.update({EVENT_KEY: kind})
    updated.status.message.CopyFrom(message)
    return updated


async def test_frames_in_one_state_are_held_and_state_changes_written_at_once(
    tmp_path: Path,
) -> None:
    from a2a_orchestrator.wire import write_at_once

    path = tmp_path / "t.db"
    # A long delay: only a write the rules call for reaches the file here.
    store = SQLiteTaskStore(path, coalesce=60.0, write_now=write_at_once)
    me = as_user("me")
    with anyio.fail_after(10):
        assert await store.get("t1", me) is None
        working = task("t1", "c1", TaskState.TASK_STATE_WORKING, 1)
        await store.save(working, me)  # a new task: written at once
        assert on_disk(path, "t1") == working

        delta = frame(working, "hel", "message_delta")
        message = frame(delta, "hello")
        await store.save(delta, me)
        await store.save(message, me)
        # Held: the file still has the first version, the store serves the latest.
        assert on_disk(path, "t1") == working
        assert await store.get("t1", me) == message
        assert await store.get("t1", as_user("else")) is None

        # A tool's result is written at once, with everything before it.
        result = frame(message, "{}", "tool_result")
        await store.save(result, me)
        assert on_disk(path, "t1") == result

        # Held again, then written by a change of state.
        called = frame(result, "{}", "tool_called")
        await store.save(called, me)
        assert on_disk(path, "t1") == result
        done = frame(called, "done", "done")
        done.status.state = TaskState.TASK_STATE_COMPLETED
        await store.save(done, me)
        assert on_disk(path, "t1") == done
        assert await store.get("t1", me) == done
    store.close()


async def test_held_frames_are_written_by_the_timer_a_listing_and_close(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    me = as_user("me")
    with anyio.fail_after(10):
        store = SQLiteTaskStore(path, coalesce=0.05)
        base = task("timer", "c1", TaskState.TASK_STATE_WORKING, 1)
        await store.save(base, me)
        later = frame(base, "after a while")
        await store.save(later, me)
        while on_disk(path, "timer") != later:  # the delay passes, the timer writes it
            await anyio.sleep(0.01)
        store.close()

        store = SQLiteTaskStore(path, coalesce=60.0)
        listed_base = task("listed", "c2", TaskState.TASK_STATE_WORKING, 2)
        await store.save(listed_base, me)
        listed = frame(listed_base, "listed")
        await store.save(listed, me)
        page = await store.list(ListTasksRequest(context_id="c2"), me)
        assert list(page.tasks) == [listed] and on_disk(path, "listed") == listed

        closing = frame(listed, "closing")
        await store.save(closing, me)
        assert on_disk(path, "listed") == listed
        store.close()
        assert on_disk(path, "listed") == closing


async def test_a_role_server_writes_a_turn_at_its_tool_results_and_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text, messages and tool calls in one state are not each a write; a
    tool's result and the end of the turn are, each with every frame before."""
    from test_server import collect, task_id_of, user_message

    from a2a_orchestrator import server as server_module
    from a2a_orchestrator import taskstore

    # Real time would let the timer write a held frame on a loaded machine;
    # a long delay leaves the writes to the rules this test is about.
    monkeypatch.setattr(server_module, "FRAME_WRITE_DELAY", 60.0)
    writes: list[int] = []
    original = taskstore.SQLiteTaskStore._write

    def counting(self: SQLiteTaskStore, rows: list[Any]) -> int:
        if rows:
            writes.append(len(rows))
        return original(self, rows)

    steps = 4
    listing = {"name": "list_files", "arguments": {"pattern": "*.txt"}}
    script = [{"text": f"step {i}", "tool_calls": [listing]} for i in range(steps)]
    script.append({"text": "all done"})
    db = tmp_path / "tasks.db"
    with anyio.fail_after(20):
        async with role_server(tmp_path, script, db=db) as server:
            async with a2a_client(server.url) as client:
                monkeypatch.setattr(taskstore.SQLiteTaskStore, "_write", counting)
                responses, events = await collect(client, user_message("work"))
                monkeypatch.setattr(taskstore.SQLiteTaskStore, "_write", original)
    stored = on_disk(db, task_id_of(responses))
    assert stored is not None and stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert stored.artifacts[0].parts[0].text == "all done"
    kinds = [
        m.metadata.fields[EVENT_KEY].string_value
        for m in [*stored.history, stored.status.message]
        if EVENT_KEY in m.metadata.fields
    ]
    # Every event the client heard is in the stored task.
    assert kinds == [e.kind for e in events]
    assert kinds.count("tool_result") == steps
    # The new task, its start (submitted -> working), each tool result, the
    # artifact and the end: nothing else.
    assert len(writes) == 2 + steps + 2
    assert len(responses) > 3 * len(writes) / 2


async def test_a_listing_by_context_reads_that_context_alone(tmp_path: Path) -> None:
    """The executor and the handler list a context's tasks at every new task:
    SQLite must read that context's index entries, not every task of the
    owner (a cost that grew with the file). Checked on the statements the
    store really runs, as SQLite's trace gives them, by SQLite's own plan."""
    path = tmp_path / "t.db"
    store = SQLiteTaskStore(path)
    me = as_user("me")
    for index in range(300):
        await store.save(task(f"t{index}", f"c{index}", TaskState.TASK_STATE_COMPLETED, index), me)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    listing = await store.list(ListTasksRequest(context_id="c7"), me)
    store._db.set_trace_callback(None)
    store.close()

    assert [t.id for t in listing.tasks] == ["t7"]
    selects = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert selects
    conn = sqlite3.connect(path)
    plans = [" ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {s}")) for s in selects]
    conn.close()
    assert all("tasks_context_updated" in plan for plan in plans), plans
