"""SQLiteTaskStore against the TaskStore contract, and the SQLAlchemy-URL path."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from a2a.auth.user import UnauthenticatedUser
from a2a.server.context import ServerCallContext
from a2a.types import GetTaskRequest, ListTasksRequest, Task, TaskState, TaskStatus
from conftest import a2a_client, role_server
from starlette.authentication import SimpleUser

from a2a_orchestrator.taskstore import SQLiteTaskStore

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
