"""The spawn window: a remote child's ids are stored before its first message
goes out, so an orchestrator killed around the send finds the task again.

The orchestrator is a real process (`crash_parent.py`) that stops itself with
SIGSTOP exactly at the send (an httpx event hook on its own client), and is
then killed with SIGKILL; the role server is a real uvicorn server on
127.0.0.1 whose model is scripted (the only fake) and counts its runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from a2a.helpers import new_text_message
from a2a.types import ListTasksRequest, Role, SendMessageRequest, Task
from support.crash.crash_parent import network
from support.processes import CRASH
from support.servers import a2a_client, role_server
from support.sessions import CountingScript

from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


async def _crash_at_send(store_path: Path, workdir: Path, url: str, when: str) -> None:
    """Run the orchestrator until it stops itself at the send, then SIGKILL it."""
    args = [sys.executable, str(CRASH / "crash_parent.py")]
    args += [str(store_path), "s1", str(workdir), url, when]
    parent = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        line = await anyio.to_thread.run_sync(parent.stdout.readline)
        assert line.strip() == "STOPPED", line + (parent.stderr.read() if parent.stderr else "")
        with anyio.fail_after(10):
            while _state(parent.pid) != "T":
                await anyio.sleep(0.01)
    finally:
        parent.kill()
        await anyio.to_thread.run_sync(parent.wait)


async def _tasks_in(url: str, context_id: str) -> list[Task]:
    async with a2a_client(url) as client:
        listing = await client.list_tasks(ListTasksRequest(context_id=context_id))
    return list(listing.tasks)


async def _recover(store: Store, workdir: Path, url: str) -> Done:
    async with Session(store, workdir=workdir, network=network(url), session_id="s1") as session:
        recovered = await session.recover()
        assert [h.child_id for h in recovered] == ["r1"]
        result = await recovered[0].result()
    assert isinstance(result, Done), result
    return result


async def test_killed_after_the_send_reattaches_to_the_task(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = CountingScript()
    store_path = tmp_path / "orchestrator.db"
    with anyio.fail_after(60):
        async with role_server(workdir, script, db=tmp_path / "role.db") as server:
            await _crash_at_send(store_path, workdir, server.url, "after")
            store = Store(store_path)
            before = await store.get_child("r1")
            assert before is not None
            # In the window: the ids were stored, the task's id never came back.
            assert before.status == "running" and before.a2a_task_id == ""
            assert before.a2a_context_id and before.a2a_message_id
            # The role server got the message and runs the task meanwhile.
            tasks = await _tasks_in(server.url, before.a2a_context_id)
            assert len(tasks) == 1

            result = await _recover(store, workdir, server.url)
            after = await store.get_child("r1")
            tasks = await _tasks_in(server.url, before.a2a_context_id)
            store.close()
    assert result.text == "remote done"
    assert after is not None and after.status == "completed" and after.result == "remote done"
    assert after.a2a_task_id == tasks[0].id
    # Re-attached, not run again: one task, one run of the model's first step.
    assert len(tasks) == 1 and script.runs == 1
    assert (workdir / "r1.txt").read_text() == "r1"


async def test_killed_before_the_send_sends_the_same_message_once(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = CountingScript(delay=0.2)
    store_path = tmp_path / "orchestrator.db"
    with anyio.fail_after(60):
        async with role_server(workdir, script, db=tmp_path / "role.db") as server:
            await _crash_at_send(store_path, workdir, server.url, "before")
            store = Store(store_path)
            before = await store.get_child("r1")
            assert before is not None and before.a2a_task_id == ""
            # The message never left: the agent has nothing in the context.
            assert await _tasks_in(server.url, before.a2a_context_id) == []

            result = await _recover(store, workdir, server.url)
            tasks = await _tasks_in(server.url, before.a2a_context_id)
            store.close()
    assert result.text == "remote done"
    assert len(tasks) == 1 and script.runs == 1
    # Sent again under the ids stored before the crash.
    opening = tasks[0].history[0]
    assert opening.message_id == before.a2a_message_id
    assert tasks[0].context_id == before.a2a_context_id


async def test_a_repeated_opening_message_gets_the_existing_task(tmp_path: Path) -> None:
    """A role server answers a message id it has seen in the context with
    that task (live while it runs), and runs the work once."""
    script = CountingScript(delay=0.5)
    with anyio.fail_after(30):
        async with role_server(tmp_path, script) as server, a2a_client(server.url) as client:
            message = new_text_message("work", role=Role.ROLE_USER, context_id="ctx-repeat")

            async def send() -> list[Any]:
                request = SendMessageRequest(message=message)
                return [response async for response in client.send_message(request)]

            results: list[list[Any]] = []

            async def collect() -> None:
                results.append(await send())

            async with anyio.create_task_group() as tg:
                tg.start_soon(collect)
                tg.start_soon(collect)
            late = await send()
            tasks = await _tasks_in(server.url, "ctx-repeat")
    assert len(tasks) == 1 and script.runs == 1
    task_ids = {r.task.id or r.status_update.task_id for frames in results for r in frames[:1]}
    assert task_ids == {tasks[0].id}
    # Both streams saw the turn end; the late copy gets the finished task.
    for frames in [*results, late]:
        last = frames[-1]
        state = last.task.status.state if last.HasField("task") else last.status_update.status.state
        assert state == tasks[0].status.state
    assert late[-1].task.id == tasks[0].id
