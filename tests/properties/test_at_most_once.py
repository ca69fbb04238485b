"""Side effects at most once: a tool call's start is journaled before it runs,
and a crash never makes it run twice (real processes, SIGKILL, real SQLite)."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.crash.crash_command import command_script, network
from support.processes import CRASH, journaled_processes, running_with_text, until_none
from support.servers import role_server, start_role_server
from support.waiting import wait_for_text

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.conversation import Conversation
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    Done,
    Failed,
    Started,
    ToolCalled,
    ToolResult,
)
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.runtime.transcript import (
    INTERRUPTED_CALL,
    NOT_STARTED_CALL,
    rebuild_transcript,
)
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.journal import ToolJournal
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools import Tool
from a2a_orchestrator.tools.procs import marked_processes

pytestmark = pytest.mark.anyio

# Long enough that the kill lands while it sleeps; "end" would prove a survivor.
COMMAND = "echo start >> runs.txt; sleep 3; echo end >> runs.txt"


def _batch(*ids: str) -> list[Any]:
    return [
        "go",
        Started(),
        *[ToolCalled(call_id=i, tool="run_command", arguments={"command": i}) for i in ids],
    ]


def test_a_started_call_without_result_is_answered_interrupted_not_replayed() -> None:
    entries = [
        *_batch("c1", "c2", "c3"),
        ToolResult(call_id="c1", tool="run_command", output="ok", success=True),
    ]
    messages = rebuild_transcript("sys", entries, interrupted={"c2"})
    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in messages[2:]] == [
        ("assistant", None, None),
        ("tool", "c1", "ok"),
        ("tool", "c2", INTERRUPTED_CALL),
        ("tool", "c3", NOT_STARTED_CALL),
    ]


def test_a_step_none_of_whose_calls_started_is_played_again() -> None:
    messages = rebuild_transcript("sys", _batch("c1", "c2"), interrupted=set())
    assert [m["role"] for m in messages] == ["system", "user"]


def test_without_a_journal_every_open_call_counts_as_possibly_run() -> None:
    messages = rebuild_transcript("sys", [*_batch("c1"), AssistantMessage(text="x")][:4])
    assert messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": INTERRUPTED_CALL}


async def test_the_start_is_on_disk_before_the_tool_runs(tmp_path: Path) -> None:
    journal = ToolJournal.open(tmp_path / "j.db")
    seen: list[list[str]] = []

    async def probe(args: dict[str, Any]) -> str:
        # Read through a second connection, as a recovering process would.
        other = ToolJournal.open(tmp_path / "j.db")
        seen.append([row.call_id for row in await other.unfinished("ctx")])
        other.close()
        return "probed"

    tool = Tool(name="probe", description="probe", run=probe)
    model = ScriptedModel([{"tool_calls": [{"name": "probe", "id": "p1"}]}, {"text": "done"}])
    conversation = Conversation(model=model, tools=[tool], journal=journal.scoped("ctx"))

    async def emit(event: Any) -> None:
        pass

    with anyio.fail_after(10):
        terminal = await conversation.run("go", emit)
    assert isinstance(terminal, Done)
    assert seen == [["p1"]]
    assert await journal.unfinished() == []
    journal.close()


async def test_a_call_that_only_reads_is_not_journaled(tmp_path: Path) -> None:
    """Running it again is harmless, so it costs no journal writes: it runs
    with a journal that cannot be written, beside a call that is refused."""
    journal = ToolJournal.open(tmp_path / "j.db")
    journal.close()  # every write now fails
    ran: list[str] = []

    async def run(args: dict[str, Any]) -> str:
        ran.append(args["name"])
        return "ran"

    tools = [
        Tool(name="look", description="reads", run=run, read_only=True),
        Tool(name="touch", description="writes", run=run),
    ]
    calls = [
        {"name": "look", "id": "l1", "arguments": {"name": "look"}},
        {"name": "touch", "id": "t1", "arguments": {"name": "touch"}},
    ]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "done"}])
    conversation = Conversation(model=model, tools=tools, journal=journal.scoped("ctx"))
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    with anyio.fail_after(10):
        await conversation.run("go", emit)
    assert ran == ["look"]
    results = {e.call_id: e for e in events if isinstance(e, ToolResult)}
    assert results["l1"].success and results["l1"].output == "ran"
    assert not results["t1"].success and results["t1"].output.startswith("Not run")


def test_the_file_tools_that_only_read_say_so(tmp_path: Path) -> None:
    from a2a_orchestrator.tools import TOOL_NAMES, Workspace, build_tools

    tools = build_tools([n for n in TOOL_NAMES if n != "run_command"], Workspace(tmp_path))
    assert {t.name for t in tools if t.read_only} == {"read_file", "list_files", "grep"}


async def test_a_call_whose_start_cannot_be_recorded_does_not_run(tmp_path: Path) -> None:
    journal = ToolJournal.open(tmp_path / "j.db")
    journal.close()  # every write now fails
    ran: list[str] = []

    async def touch(args: dict[str, Any]) -> str:
        ran.append("ran")
        return "ran"

    model = ScriptedModel([{"tool_calls": [{"name": "touch", "id": "t1"}]}, {"text": "done"}])
    conversation = Conversation(
        model=model,
        tools=[Tool(name="touch", description="touch", run=touch)],
        journal=journal.scoped("ctx"),
    )
    events: list[Any] = []

    async def emit(event: Any) -> None:
        events.append(event)

    with anyio.fail_after(10):
        await conversation.run("go", emit)
    results = [e for e in events if isinstance(e, ToolResult)]
    assert ran == []
    assert len(results) == 1 and not results[0].success
    assert results[0].output.startswith("Not run: its start could not be recorded")


def _no_leftovers(journal_file: Path) -> list[int]:
    import sqlite3

    conn = sqlite3.connect(journal_file)
    markers = [r[0] for r in conn.execute("SELECT marker FROM tool_calls")]
    conn.close()
    return [pid for marker in markers for pid in marked_processes(marker)]


async def test_kill_9_of_the_orchestrator_mid_command_runs_it_once(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    store_path = tmp_path / "o.db"
    runs = workdir / "runs.txt"
    parent = subprocess.Popen(
        [
            sys.executable,
            str(CRASH / "crash_command.py"),
            str(store_path),
            "s1",
            str(workdir),
            COMMAND,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        await wait_for_text(runs, "start")
        parent.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(parent.wait)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()

    store = Store(store_path)
    model = ScriptedModel(command_script(COMMAND))
    with anyio.fail_after(30):
        async with Session(
            store, workdir=workdir, network=network(), models=lambda n: model, session_id="s1"
        ) as session:
            [handle] = await session.recover()
            result = await handle.result()
        # Until nothing of the command runs, at most past its own time: a
        # survivor would have written "end".
        await until_none(lambda: journaled_processes(store_path) + running_with_text(COMMAND), 3.5)
    rows = await store.journal.unfinished()
    store.close()
    assert isinstance(result, Done), result
    assert result.text == "tool said: " + INTERRUPTED_CALL
    assert runs.read_text() == "start\n"
    assert rows == []
    assert _no_leftovers(store_path) == []


async def test_kill_9_of_a_role_server_mid_command_runs_it_once(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    call = {"name": "run_command", "arguments": {"command": COMMAND}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "done"}]))
    db = tmp_path / "role.db"
    runs = tmp_path / "runs.txt"
    process, url = start_role_server(tmp_path, 0, db, script)
    port = int(url.rsplit(":", 1)[1])
    store = Store(tmp_path / "o.db")
    remote = Network.of(AgentSpec(name="remote", role="coder", url=url))
    try:
        with anyio.fail_after(45):
            async with Session(
                store,
                workdir=tmp_path,
                network=remote,
                remote=functools.partial(RemoteDelegate, lost_after=20),
            ) as session:
                handle = await session.spawn(ChildConfig(role="remote", prompt="run it"))
                await wait_for_text(runs, "start")
                process.send_signal(signal.SIGKILL)
                process.wait()
                process, _ = start_role_server(tmp_path, port, db, script)
                first = await handle.result()
                await handle.send("go on")
                second = await handle.result()
            # Until nothing of the command runs, at most past its own time: a
            # survivor would have written "end".
            await until_none(lambda: journaled_processes(db) + running_with_text(COMMAND), 3.5)
    finally:
        store.close()
        process.send_signal(signal.SIGTERM)
        process.wait(10)
    journal = ToolJournal.open(db)
    open_rows = await journal.unfinished()
    closed = {row.call_id for row in await journal.interrupted_calls(handle.run.context_id)}
    journal.close()
    assert isinstance(first, Failed) and first.reason == "lost"
    assert isinstance(second, Done) and second.text == "done"
    assert runs.read_text() == "start\n"
    assert open_rows == [] and len(closed) == 1
    assert _no_leftovers(db) == []


async def test_a_role_server_killed_after_a_call_closed_but_before_its_result_was_saved(
    tmp_path: Path,
) -> None:
    """The role server dies right after closing a finished call's journal
    row, before the task store saved the call's frames (the result is sent
    behind the runtime, the announcement was coalesced): the call ran, so
    the next turn's model is told it was interrupted, and it never runs again."""
    script = tmp_path / "script.json"
    call = {"name": "run_command", "arguments": {"command": "echo ran >> runs.txt"}}
    script.write_text(json.dumps([{"tool_calls": [call]}, {"text": "done"}]))
    db = tmp_path / "role.db"
    kill_after = "UPDATE tool_calls SET finished_at"
    launcher = (str(CRASH / "crash_serve.py"), kill_after)
    process, url = start_role_server(tmp_path, 0, db, script, launcher=launcher)
    port = int(url.rsplit(":", 1)[1])
    seen: list[list[dict[str, Any]]] = []

    def after_restart(messages: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append(list(messages))
        return {"text": "went on"}

    store = Store(tmp_path / "o.db")
    remote = Network.of(AgentSpec(name="remote", role="coder", url=url))
    try:
        with anyio.fail_after(45):
            async with Session(
                store,
                workdir=tmp_path,
                network=remote,
                remote=functools.partial(RemoteDelegate, lost_after=20),
            ) as session:
                handle = await session.spawn(ChildConfig(role="remote", prompt="run it"))
                await anyio.to_thread.run_sync(process.wait)
                assert process.returncode == -signal.SIGKILL
                model = ScriptedModel(after_restart)
                async with run_role_server(
                    find_role("coder"), model, tmp_path, db=str(db), port=port
                ):
                    first = await handle.result()
                    await handle.send("go on")
                    second = await handle.result()
    finally:
        store.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    assert isinstance(first, Failed) and first.reason == "lost"
    assert isinstance(second, Done) and second.text == "went on"
    assert (tmp_path / "runs.txt").read_text() == "ran\n"
    (messages,) = seen
    assert [m["content"] for m in messages if m["role"] == "tool"] == [INTERRUPTED_CALL]


def test_a_call_journaled_but_never_announced_is_put_back_as_interrupted() -> None:
    """A role server killed after a call's start reached the journal but before
    its announcement reached the task store: the rebuilt conversation must
    still hold the call, answered as interrupted, or the model would play the
    step (and the command) again."""
    from a2a_orchestrator.server.executor import _restore_lost_calls
    from a2a_orchestrator.storage.journal import JournalRow

    row = JournalRow(
        marker="m",
        scope="ctx",
        call_id="c1",
        tool="run_command",
        arguments={"command": "echo once"},
        runner_pid=1,
        runner_ticks=1,
        runner_boot="",
        pgid=None,
        pgid_ticks=None,
    )
    lost = Failed(reason="lost", message="the role server stopped while this task ran")
    per_task: list[list[Any]] = [["run it", Started(), lost]]
    _restore_lost_calls(per_task, [row])
    entries = [*per_task[0], "go on"]
    messages = rebuild_transcript("sys", entries, interrupted={"c1"})
    assert [(m["role"], m.get("content")) for m in messages] == [
        ("system", "sys"),
        ("user", "run it"),
        ("assistant", None),
        ("tool", INTERRUPTED_CALL),
        ("user", "go on"),
    ]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "run_command"


async def test_the_early_task_save_logs_no_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The role server stores a new task before its tools run; a2a-sdk then
    finds it stored and used to log an error for every task."""
    import logging

    from a2a_orchestrator.delegation.base import ChildConfig as _Config

    caplog.set_level(logging.WARNING)
    with anyio.fail_after(20):
        async with role_server(tmp_path, [{"text": "ok"}]) as server:
            store = Store(tmp_path / "o.db")
            remote = Network.of(AgentSpec(name="remote", role="coder", url=server.url))
            async with Session(store, workdir=tmp_path, network=remote) as session:
                handle = await session.spawn(_Config(role="remote", prompt="go"))
                result = await handle.result()
            store.close()
    assert isinstance(result, Done) and result.text == "ok"
    assert not [r for r in caplog.records if r.name.startswith("a2a") and r.levelno >= 40]
