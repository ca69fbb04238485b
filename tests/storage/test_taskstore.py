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
from starlette.authentication import SimpleUser
from support.messages import collect, task_id_of, user_message
from support.servers import a2a_client, role_server

from a2a_orchestrator.protocol.wire import EVENT_KEY
from a2a_orchestrator.storage.tasks.sqlite import SQLiteTaskStore

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


def with_messages(base: Task, *ids: str, text: str = "x") -> Task:
    """`base` with user messages of these ids in its history."""
    from a2a.helpers import new_text_message
    from a2a.types import Role

    updated = Task()
    updated.CopyFrom(base)
    for message_id in ids:
        message = new_text_message(text, role=Role.ROLE_USER)
        message.message_id = message_id
        updated.history.append(message)
    return updated


@pytest.mark.parametrize("kind", ["ours", "sdk"])
async def test_the_task_a_message_opened_is_found_by_the_messages_id(
    tmp_path: Path, kind: str
) -> None:
    """Ours reads each task's first history row alone, and parses only
    those holding the id's bytes; any other store is listed page by page:
    both answer alike."""
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types import Message

    from a2a_orchestrator.storage.tasks.observed import observed
    from a2a_orchestrator.storage.tasks.sqlite import task_opened_by

    ours = SQLiteTaskStore(tmp_path / "t.db", coalesce=60.0)
    inner = ours if kind == "ours" else InMemoryTaskStore()

    async def saved(task: Task, context: ServerCallContext) -> None:
        return None

    store = observed(inner, saved)  # as a role server wraps it
    me, other = as_user("me"), as_user("other")
    # The id's bytes in a text, under another id: found by bytes, not by id.
    decoy = Message(message_id="m-open").SerializeToString().decode()
    with anyio.fail_after(10):
        first = with_messages(task("t1", "c1", TaskState.TASK_STATE_COMPLETED, 1), "m-open")
        await store.save(first, me)
        await store.save(
            with_messages(task("t2", "c1", TaskState.TASK_STATE_WORKING, 2), "m-2", "m-late"), me
        )
        await store.save(
            with_messages(task("t3", "c1", TaskState.TASK_STATE_WORKING, 3), "m-3", text=decoy),
            me,
        )
        await store.save(
            with_messages(task("x1", "c2", TaskState.TASK_STATE_WORKING, 4), "m-x"), me
        )
        await store.save(
            with_messages(task("o1", "c1", TaskState.TASK_STATE_WORKING, 5), "m-other"), other
        )
        # A task with frames the store holds (not on the file yet): found
        # as it is now.
        opened = with_messages(task("t4", "c1", TaskState.TASK_STATE_WORKING, 6), "m-4")
        await store.save(opened, me)
        latest = frame(frame(opened, "working"), "more")
        await store.save(latest, me)

        async def found(message_id: str, who: ServerCallContext = me) -> str | None:
            answer = await task_opened_by(store, "c1", message_id, who)
            return None if answer is None else answer.id

        assert await found("m-open") == "t1"
        assert await found("m-2") == "t2"
        assert await found("m-late") is None  # it opened no task
        assert await found("m-4") == "t4"
        assert await task_opened_by(store, "c1", "m-4", me) == latest
        if kind == "ours":
            # The held frames were written first, not dropped.
            assert on_disk(tmp_path / "t.db", "t4") == latest
        assert await found("m-x") is None  # another context
        assert await found("m-other") is None  # another owner's task
        assert await found("m-other", other) == "o1"
        assert await found("m-none") is None
        whole = await task_opened_by(store, "c1", "m-open", me)
        assert whole == first
    ours.close()


async def test_a_sqlalchemy_url_uses_the_sdk_database_store(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'sdk.db'}"
    with anyio.fail_after(20):
        async with role_server(tmp_path, lambda m: {"text": "kept"}, db=url) as server:
            async with a2a_client(server.url) as client:
                responses, _ = await collect(client, user_message("remember"))
        async with role_server(tmp_path, lambda m: {"text": "kept"}, db=url) as server:
            async with a2a_client(server.url) as client:
                stored = await client.get_task(GetTaskRequest(id=task_id_of(responses)))
    assert stored.status.state == TaskState.TASK_STATE_COMPLETED
    assert stored.artifacts[0].parts[0].text == "kept"
    assert (tmp_path / "sdk.db").exists()


# --- coalesced frame saves ----------------------------------------------------


def on_disk(path: Path, task_id: str) -> Task | None:
    """The task as another process would read it from the file: its row
    holds the task without its history, each history message has a row."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT data FROM tasks WHERE id = ?", (task_id,)).fetchone()
        history = conn.execute(
            "SELECT data FROM task_history WHERE task_id = ? ORDER BY seq", (task_id,)
        ).fetchall()
    finally:
        conn.close()
    if row is None:
        return None
    assert not Task.FromString(row[0]).history, "the history is in its own rows"
    # Each row is the message as an entry of the task's history field.
    return Task.FromString(row[0] + b"".join(data for (data,) in history))


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
    from a2a_orchestrator.protocol.wire import write_at_once

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

    from a2a_orchestrator.server import app as server_module
    from a2a_orchestrator.storage.tasks import sqlite as taskstore

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
    selects = [
        s for s in statements if s.lstrip().upper().startswith("SELECT") and "FROM tasks " in s
    ]
    assert selects
    conn = sqlite3.connect(path)
    plans = [" ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {s}")) for s in selects]
    conn.close()
    assert all("tasks_context_updated" in plan for plan in plans), plans


# --- the history in rows of its own ---------------------------------------------


def exact(got: Task | None) -> bytes:
    """A task's bytes with maps in key order: a parsed Struct may serialize
    its keys in another order than the one it was built in."""
    assert got is not None
    return got.SerializeToString(deterministic=True)


def sdk_frame(task: Task, index: int) -> None:
    """What a2a-sdk's TaskManager does with one status update, in place on
    the one Task it keeps: the status message joins the history, the
    update's message becomes the status. Calls and results alternate."""
    from a2a.helpers import new_text_message
    from a2a.types import Role

    kind = "tool_result" if index % 2 else "tool_called"
    message = new_text_message(f"frame {index}", role=Role.ROLE_AGENT, task_id=task.id)
    message.metadata.update({EVENT_KEY: kind, "callId": f"c{index // 2}", "n": index})
    if task.status.HasField("message"):
        task.history.append(task.status.message)
    task.status.message.CopyFrom(message)
    task.status.timestamp.FromSeconds(1000 + index)


async def test_a_task_saved_frame_by_frame_round_trips_and_each_message_is_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 frames of one task, saved as the SDK saves them (the same Task,
    grown in place): every message reaches the file once, not once per
    later save, and the task comes back exactly, from memory and the file."""
    from a2a.helpers import new_text_message
    from a2a.types import Role

    from a2a_orchestrator.protocol.wire import write_at_once
    from a2a_orchestrator.storage.tasks import sqlite as taskstore

    written: list[int] = []
    original = taskstore.write_rows

    def counting(conn: Any, rows: Any) -> int:
        rows = list(rows)
        written.extend(len(write.messages) for write in rows)
        return original(conn, rows)

    monkeypatch.setattr(taskstore, "write_rows", counting)
    path = tmp_path / "t.db"
    me = as_user("me")
    with anyio.fail_after(60):
        for coalesce in (0.0, 60.0):
            store = SQLiteTaskStore(path, coalesce=coalesce, write_now=write_at_once)
            long = task(f"long-{coalesce}", "c1", TaskState.TASK_STATE_SUBMITTED, 1)
            long.history.append(new_text_message("go", role=Role.ROLE_USER))
            await store.save(long, me)
            long.status.state = TaskState.TASK_STATE_WORKING
            for index in range(2000):
                sdk_frame(long, index)
                await store.save(long, me)
                if index in (0, 999, 1998):
                    assert exact(await store.get(long.id, me)) == exact(long)
            assert len(long.history) == 2000
            assert exact(await store.get(long.id, me)) == exact(long)
            # What the file holds (held frames written by close).
            store.close()
            assert exact(on_disk(path, long.id)) == exact(long)
            reopened = SQLiteTaskStore(path)
            assert exact(await reopened.get(long.id, me)) == exact(long)
            [(recovered, owner)] = [
                (t, o) for t, o in await reopened.unfinished() if t.id == long.id
            ]
            assert exact(recovered) == exact(long) and owner == "me"
            listed = await reopened.list(ListTasksRequest(context_id="c1"), me)
            assert exact(listed.tasks[0]) == exact(long)
            reopened.close()
            # Each message was written once (the first frame had none to move).
            assert sum(written) == 2000
            written.clear()


async def test_a_history_that_is_not_an_extension_is_written_whole(tmp_path: Path) -> None:
    from a2a.helpers import new_text_message
    from a2a.types import Role

    def with_history(*ids: str) -> Task:
        built = task("t1", "c1", TaskState.TASK_STATE_WORKING, 1)
        for message_id in ids:
            message = new_text_message(f"text of {message_id}", role=Role.ROLE_AGENT)
            message.message_id = message_id
            built.history.append(message)
        return built

    path = tmp_path / "t.db"
    me = as_user("me")
    with anyio.fail_after(10):
        for coalesce in (0.0, 60.0):
            store = SQLiteTaskStore(path, coalesce=coalesce)
            versions = [
                with_history("a", "b", "c"),
                with_history("a", "b", "c", "d"),  # an append
                with_history("a", "x"),  # shorter
                with_history("a", "y", "z", "w"),  # another message where "x" was
                with_history("a", "y", "z", "w", "v"),  # an append to that
                with_history(),  # emptied
                with_history("q"),
            ]
            for version in versions:
                await store.save(version, me)
                assert exact(await store.get("t1", me)) == exact(version)
                await store.flush()
                assert exact(on_disk(path, "t1")) == exact(version)
            store.close()
            reopened = SQLiteTaskStore(path)
            assert exact(await reopened.get("t1", me)) == exact(versions[-1])
            # A task read back from the file is extended from what it holds.
            longer = with_history("q", "r")
            await reopened.save(longer, me)
            reopened.close()
            assert exact(on_disk(path, "t1")) == exact(longer)
            path.unlink()


async def test_another_owner_cannot_touch_a_tasks_history(tmp_path: Path) -> None:
    from a2a.helpers import new_text_message
    from a2a.types import Role

    path = tmp_path / "t.db"
    alice, bob = as_user("alice"), as_user("bob")
    with anyio.fail_after(10):
        store = SQLiteTaskStore(path, coalesce=60.0)
        hers = task("t1", "c1", TaskState.TASK_STATE_WORKING, 1)
        hers.history.append(new_text_message("hers", role=Role.ROLE_USER))
        await store.save(hers, alice)
        his = task("t1", "c1", TaskState.TASK_STATE_WORKING, 2)
        his.history.extend(new_text_message(f"his {i}", role=Role.ROLE_USER) for i in range(3))
        await store.save(his, bob)
        await store.delete("t1", bob)
        store.close()
        assert exact(on_disk(path, "t1")) == exact(hers)
        reopened = SQLiteTaskStore(path)
        assert exact(await reopened.get("t1", alice)) == exact(hers)
        assert await reopened.get("t1", bob) is None
        await reopened.delete("t1", alice)
        reopened.close()
    import sqlite3

    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM task_history").fetchone() == (0,)


async def test_held_frames_a_failed_write_took_are_written_later_in_order(
    tmp_path: Path,
) -> None:
    """A write that fails (here SQLite refusing it, by a trigger on the
    store's own connection) puts its frames back before the ones held since;
    a save written at once that fails raises and keeps what was held."""
    from a2a_orchestrator.errors import StoreError

    path = tmp_path / "t.db"
    me = as_user("me")
    from a2a_orchestrator.protocol.wire import write_at_once

    with anyio.fail_after(10):
        store = SQLiteTaskStore(path, coalesce=60.0, write_now=write_at_once)
        live = task("t1", "c1", TaskState.TASK_STATE_WORKING, 1)
        await store.save(live, me)
        written = Task()
        written.CopyFrom(live)
        for index in (0, 2):  # two calls, held
            sdk_frame(live, index)
            await store.save(live, me)
        store._db.execute(
            "CREATE TEMP TRIGGER refuse BEFORE INSERT ON task_history "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        await store.flush()  # fails, logs, keeps them
        sdk_frame(live, 4)
        await store.save(live, me)  # held after them
        held = Task()
        held.CopyFrom(live)
        sdk_frame(live, 5)  # a tool result: written at once, and refused
        with pytest.raises(StoreError):
            await store.save(live, me)
        assert exact(on_disk(path, "t1")) == exact(written)
        assert exact(await store.get("t1", me)) == exact(held)
        store._db.execute("DROP TRIGGER refuse")
        await store.save(live, me)  # the same frame again, written
        assert exact(on_disk(path, "t1")) == exact(live)
        assert exact(await store.get("t1", me)) == exact(live)
        store.close()


async def test_a_file_of_the_whole_task_layout_is_read_and_migrated(tmp_path: Path) -> None:
    """A file written before the history had rows of its own: each task's
    row holds the whole task. Opening it moves the histories into rows."""
    import sqlite3

    from a2a.helpers import new_text_message
    from a2a.types import Role

    path = tmp_path / "old.db"
    me = as_user("me")
    old = task("old", "c1", TaskState.TASK_STATE_WORKING, 5)
    for index in range(5):
        sdk_frame(old, index)
    done = task("done", "c1", TaskState.TASK_STATE_COMPLETED, 3)
    done.history.append(new_text_message("finished long ago", role=Role.ROLE_USER))
    bare = task("bare", "c2", TaskState.TASK_STATE_SUBMITTED, 2)
    with sqlite3.connect(path) as conn:
        # The schema as the previous version of the store created it.
        conn.executescript(
            """
            CREATE TABLE IF NOT EXISTS tasks (
                id TEXT PRIMARY KEY,
                owner TEXT NOT NULL,
                context_id TEXT NOT NULL,
                state INTEGER NOT NULL,
                updated_ns INTEGER NOT NULL,
                data BLOB NOT NULL
            );
            CREATE INDEX IF NOT EXISTS tasks_owner_updated
                ON tasks (owner, updated_ns DESC, id DESC);
            CREATE INDEX IF NOT EXISTS tasks_context ON tasks (context_id);
            """
        )
        for stored in (old, done, bare):
            conn.execute(
                "INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?)",
                (
                    stored.id,
                    "me",
                    stored.context_id,
                    int(stored.status.state),
                    stored.status.timestamp.ToNanoseconds(),
                    stored.SerializeToString(),
                ),
            )
    conn.close()
    with anyio.fail_after(10):
        store = SQLiteTaskStore(path)
        for stored in (old, done, bare):
            assert exact(await store.get(stored.id, me)) == exact(stored)
            assert exact(on_disk(path, stored.id)) == exact(stored)
        listed = await store.list(ListTasksRequest(context_id="c1"), me)
        assert [exact(t) for t in listed.tasks] == [exact(old), exact(done)]
        assert sorted(t.id for t, _ in await store.unfinished()) == ["bare", "old"]
        sdk_frame(old, 5)
        await store.save(old, me)
        store.close()
    assert exact(on_disk(path, "old")) == exact(old)
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT task_id, COUNT(*) FROM task_history GROUP BY task_id")
        assert dict(rows.fetchall()) == {"old": 5, "done": 1}
    conn.close()


def test_the_head_is_every_field_of_a_task_but_its_history() -> None:
    """The head is built field by field: a field a newer SDK adds to Task
    must be added there, or the store would drop it."""
    from a2a_orchestrator.storage.tasks.rows import HEAD_FIELDS

    assert {field.name for field in Task.DESCRIPTOR.fields} - {"history"} == HEAD_FIELDS
