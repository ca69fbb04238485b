"""Crash recovery with real processes: kill -9 the orchestrator, kill -9 a role server."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from support.crash.crash_parent import local_script, network
from support.processes import CRASH
from support.servers import role_server, start_role_server
from support.waiting import wait_for

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

REMOTE_SCRIPT = [
    {
        "delay": 2.0,
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "remote.txt", "content": "remote"}}
        ],
    },
    {"text": "remote done"},
]


async def test_kill_9_the_orchestrator_then_resume(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    store_path = tmp_path / "orchestrator.db"
    with anyio.fail_after(45):
        async with role_server(workdir, REMOTE_SCRIPT, db=tmp_path / "role.db") as server:
            parent = subprocess.Popen(
                [
                    sys.executable,
                    str(CRASH / "crash_parent.py"),
                    str(store_path),
                    "s1",
                    str(workdir),
                    server.url,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                assert parent.stdout is not None
                line = await anyio.to_thread.run_sync(parent.stdout.readline)
                assert line.strip() == "READY", line + (
                    parent.stderr.read() if parent.stderr else ""
                )
                store = Store(store_path)

                async def both_underway() -> bool:
                    local = await store.events("s1", child_id="local-slow", kinds=["tool_called"])
                    remote = await store.get_child("remote-slow")
                    return bool(local) and remote is not None and bool(remote.a2a_task_id)

                await wait_for(both_underway)
                parent.send_signal(signal.SIGKILL)
                await anyio.to_thread.run_sync(parent.wait)
            finally:
                if parent.poll() is None:
                    parent.kill()

            before = {c.child_id: c for c in await store.list_children(session_id="s1")}
            assert before["quick"].status == "completed" and before["quick"].result == "quick done"
            assert before["local-slow"].status == "running"
            assert before["remote-slow"].status == "running"

            model = ScriptedModel(local_script)
            async with Session(
                store,
                workdir=workdir,
                network=network(server.url),
                models=lambda n: model,
                session_id="s1",
            ) as session:
                recovered = await session.recover()
                assert sorted(h.child_id for h in recovered) == ["local-slow", "remote-slow"]
                results = {h.child_id: await h.result() for h in recovered}
            after = {c.child_id: c for c in await store.list_children(session_id="s1")}
            events = await store.events("s1", child_id="remote-slow")
            store.close()
    assert results["local-slow"] == Done(text="slow done", usage=results["local-slow"].usage)  # type: ignore[union-attr]
    assert isinstance(results["remote-slow"], Done) and results["remote-slow"].text == "remote done"
    assert (workdir / "remote.txt").read_text() == "remote"
    # At most once: the kill lands before the command starts (the step is
    # played again and runs it once) or while it runs (it dies with the
    # orchestrator and the model is told it was interrupted; it never runs again).
    runs = workdir / "local-runs.txt"
    assert not runs.exists() or runs.read_text() == "ran\n"
    # Nothing lost, nothing orphaned, nothing recorded twice.
    assert {c: r.status for c, r in after.items()} == {
        "quick": "completed",
        "local-slow": "completed",
        "remote-slow": "completed",
    }
    uuids = [e.uuid for e in events]
    assert len(uuids) == len(set(uuids))
    assert [e.kind for e in events].count("started") == 1
    assert [e.kind for e in events][-1] == "done"


async def _spawn_remote(session: Session) -> None:
    await session.spawn(ChildConfig(role="remote", prompt="work"), child_id="r1")
    handle = session.children["r1"]
    await wait_for(lambda: _true(bool(handle.run.task_id) and bool(handle.log)))


async def _true(value: bool) -> bool:
    return value


async def test_kill_9_a_role_server_ends_the_child_lost(tmp_path: Path) -> None:
    process, url = start_role_server(tmp_path, 0, tmp_path / "role.db")
    try:
        store = Store(tmp_path / "o.db")
        network = Network.of(AgentSpec(name="remote", role="coder", url=url))
        with anyio.fail_after(30):
            async with Session(
                store,
                workdir=tmp_path,
                network=network,
                remote=functools.partial(RemoteDelegate, lost_after=1.0),
            ) as session:
                await _spawn_remote(session)
                process.send_signal(signal.SIGKILL)
                started = anyio.current_time()
                result = await session.children["r1"].result()
                elapsed = anyio.current_time() - started
        record = await store.get_child("r1")
        store.close()
    finally:
        process.kill()
        process.wait()
    assert isinstance(result, Failed) and result.reason == "lost"
    assert url in result.message
    assert record is not None and record.status == "failed" and record.reason == "lost"
    assert elapsed < 15  # bounded by lost_after plus retries, not by the child's 60 s turn


async def test_a_role_server_that_comes_back_is_reattached(tmp_path: Path) -> None:
    db = tmp_path / "role.db"
    process, url = start_role_server(tmp_path, 0, db)
    port = int(url.rsplit(":", 1)[1])
    try:
        store = Store(tmp_path / "o.db")
        network = Network.of(AgentSpec(name="remote", role="coder", url=url))
        with anyio.fail_after(40):
            async with Session(
                store,
                workdir=tmp_path,
                network=network,
                remote=functools.partial(RemoteDelegate, lost_after=20.0),
            ) as session:
                await _spawn_remote(session)
                process.send_signal(signal.SIGKILL)
                process.wait()
                process, _ = start_role_server(tmp_path, port, db)
                result = await session.children["r1"].result()
        store.close()
    finally:
        process.kill()
        process.wait()
    # The restarted server held the task and told the child what became of it.
    assert isinstance(result, Failed) and result.reason == "lost"
    assert "role server stopped while this task ran" in result.message
