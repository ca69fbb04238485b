"""A child's events are written behind it (`outbox.py`): in few transactions,
in order, announced only once on disk, a turn's end waited for, a parent's
input stored after what the child emitted before it, and a failed write
failing that child alone.

Children are played by `MemoryDelegate` functions through a real Session
on a real SQLite file; SQLite's own trace counts the commits.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest
from support.crash.crash_tool import mark_script, network, with_mark
from support.processes import CRASH

from a2a_orchestrator import MemoryDelegate
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.outbox import Outbox
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.memory import Handler, Turn
from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import ChildEvent, Done, Failed, ToolCalled, ToolResult
from a2a_orchestrator.runtime.transcript import INTERRUPTED_CALL
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

NETWORK = Network.of(AgentSpec(name="busy", role="busy"))
CALLS = 300


def calls(count: int) -> list[ChildEvent]:
    events: list[ChildEvent] = []
    for n in range(count):
        events.append(ToolCalled(call_id=f"c{n}", tool="probe", arguments={"n": n}))
        events.append(ToolResult(call_id=f"c{n}", tool="probe", output=str(n), success=True))
    return events


async def busy(turn: Turn) -> AsyncIterator[str | ChildEvent]:
    for event in calls(CALLS):
        yield event
    yield f"made {CALLS} calls"


def stored_uuids(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT uuid FROM events")}
    finally:
        conn.close()


@asynccontextmanager
async def session_of(handler: Handler, workdir: Path) -> AsyncIterator[Session]:
    """A real Session on a real file (`workdir/orchestrator.db`) whose
    children `handler` plays."""
    store = Store(workdir / "orchestrator.db")
    try:
        async with Session(
            store, workdir=workdir, network=NETWORK, delegates={"local": MemoryDelegate(handler)}
        ) as session:
            yield session
    finally:
        store.close()


def refuse_results(path: Path, child_id: str) -> None:
    """A trigger, in the real file, that refuses `child_id`'s tool results
    as SQLite itself refuses a write."""
    conn = sqlite3.connect(path)
    conn.execute(
        f"""CREATE TRIGGER refuse BEFORE INSERT ON events
        WHEN NEW.child_id = '{child_id}' AND NEW.kind = 'tool_result'
        BEGIN SELECT RAISE(ABORT, 'write refused'); END"""
    )
    conn.commit()
    conn.close()


async def test_a_busy_child_is_stored_in_few_transactions_in_order_and_heard_after_disk(
    tmp_path: Path,
) -> None:
    path = tmp_path / "orchestrator.db"
    statements: list[str] = []
    heard: list[ChildEvent] = []
    heard_before_disk: list[str] = []
    with anyio.fail_after(30):
        async with session_of(busy, tmp_path) as session:
            store = session.store
            store._file.conn.set_trace_callback(statements.append)
            async with session.relay() as relay:
                handle = await session.spawn(ChildConfig(role="busy", prompt="go"))
                async for item in relay:
                    # Heard: so it must be in the file already, read by
                    # another connection.
                    if item.event.uuid not in stored_uuids(path):
                        heard_before_disk.append(item.event.kind)
                    heard.append(item.event)
                    if isinstance(item.event, Done | Failed):
                        break
            store._file.conn.set_trace_callback(None)
            result = await handle.result()
            rows = await store.events(session.id, child_id=handle.child_id)

    expected = [event.kind for event in calls(CALLS)]
    assert result == Done(text=f"made {CALLS} calls")
    assert heard_before_disk == []
    assert [e.kind for e in heard] == ["started", *expected, "message", "done"]
    assert [e.uuid for e in heard] == [e.uuid for e in handle.log]
    assert [row.kind for row in rows] == ["input", "started", *expected, "message", "done"]
    assert [row.uuid for row in rows[1:]] == [e.uuid for e in handle.log]
    commits = sum(1 for s in statements if s.strip().upper() == "COMMIT")
    # At most one transaction per event (a batch holds what the child made
    # while the write before was in flight). This child is as fast as the
    # loop and each commit is made on it, so its batches are mostly of one:
    # the bound of half the events held only while the write that made a
    # WAL checkpoint due waited for it (every 200 commits), and none does now.
    assert 1 <= commits <= len(rows)


async def test_input_given_while_events_are_pending_is_stored_after_them(
    tmp_path: Path,
) -> None:
    emitted = anyio.Event()
    gate = anyio.Event()

    async def worker(turn: Turn) -> AsyncIterator[str | ChildEvent]:
        if turn.number == 1:
            for event in calls(100):
                yield event
            emitted.set()
            await gate.wait()
        yield f"turn {turn.number}"

    with anyio.fail_after(30):
        async with session_of(worker, tmp_path) as session:
            store = session.store
            handle = await session.spawn(ChildConfig(role="busy", prompt="go"))
            await emitted.wait()
            await handle.send("next")  # queued behind the running turn
            await handle.steer("now")
            gate.set()
            while len([e for e in handle.log if isinstance(e, Done)]) < 3:
                await handle.wait()
            rows = await store.events(session.id, child_id=handle.child_id)

    kinds = [row.kind for row in rows]
    last_call = max(i for i, kind in enumerate(kinds) if kind == "tool_result")
    first_input_after = min(i for i, kind in enumerate(kinds) if i > 0 and kind == "input")
    assert kinds.count("tool_result") == 100
    assert first_input_after > last_call


async def test_a_write_behind_that_fails_fails_that_child_alone(tmp_path: Path) -> None:
    path = tmp_path / "orchestrator.db"

    async def worker(turn: Turn) -> AsyncIterator[str | ChildEvent]:
        if turn.config.prompt == "break":
            # Refuse this child's tool results from now on, in the real file.
            refuse_results(path, turn.child_id)
        for event in calls(50):
            yield event
            await anyio.lowlevel.checkpoint()
        yield "all stored"

    with anyio.fail_after(30):
        async with session_of(worker, tmp_path) as session:
            broken = await session.spawn(ChildConfig(role="busy", prompt="break"))
            failed = await broken.result()
            sound = await session.spawn(ChildConfig(role="busy", prompt="fine"))
            fine = await sound.result()

    assert isinstance(failed, Failed) and failed.reason == "error"
    assert "StoreError" in failed.message and "write refused" in failed.message
    assert isinstance(broken.error, StoreError)
    assert fine == Done(text="all stored")


async def test_back_pressure_bounds_what_is_queued_and_keeps_order() -> None:
    batches: list[int] = []
    delivered: list[int] = []

    async def write(events: Sequence[ChildEvent]) -> list[bool]:
        batches.append(len(events))
        await anyio.sleep(0.001)  # a commit takes a while: the child outruns it
        return [True] * len(events)

    async def deliver(event: ChildEvent, fresh: bool) -> None:
        assert isinstance(event, ToolCalled) and fresh
        delivered.append(int(event.arguments["n"]))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            outbox = Outbox(write, deliver, lambda: None, limit=8)
            outbox.attach(tg)
            most = 0
            for n in range(100):
                event = ToolCalled(call_id=f"c{n}", tool="probe", arguments={"n": n})
                await outbox.put(event, wait=False)
                most = max(most, outbox.pending)
            await outbox.drain()

    assert delivered == list(range(100))
    assert max(batches) <= 8
    assert most <= 9  # the limit, and the one put that then waits for it


async def test_a_quick_turn_costs_three_commits_spawn_included(tmp_path: Path) -> None:
    """A spawn stores the child's row and its first input together, and the
    turn's three events share transactions: three commits at most where a
    write each made five."""
    statements: list[str] = []
    with anyio.fail_after(10):
        async with session_of(lambda turn: f"echo {turn.text}", tmp_path) as session:
            store = session.store
            await (await session.spawn(ChildConfig(role="busy", prompt="warm"))).result()
            store._file.conn.set_trace_callback(statements.append)
            handle = await session.spawn(ChildConfig(role="busy", prompt="hi"))
            result = await handle.result()
            store._file.conn.set_trace_callback(None)
            rows = await store.events(session.id, child_id=handle.child_id)
            record = await store.get_child(handle.child_id)

    assert result == Done(text="echo hi")
    assert [row.kind for row in rows] == ["input", "started", "message", "done"]
    assert record is not None and record.status == "completed"
    assert sum(1 for s in statements if s.strip().upper() == "COMMIT") <= 3


async def recovered(store_path: Path, workdir: Path, *, read_only: bool = False) -> ChildEvent:
    """The result of the crashed session's child `c1` (`crash_tool.py`),
    recovered by a new session on the same store, with the same tool."""
    store = Store(store_path)
    model = ScriptedModel(mark_script)
    try:
        with anyio.fail_after(30):
            async with Session(
                store, workdir=workdir, network=network(), models=lambda n: model, session_id="s1"
            ) as session:
                with_mark(session, workdir, read_only=read_only)
                [handle] = await session.recover()
                return await handle.result()
    finally:
        store.close()


@pytest.mark.parametrize(
    ("moment", "lost", "runs"),
    [
        # The call's start is journaled, its announcement not yet written
        # (the tool may have run before the kill landed, or not).
        ("start", ["started", "tool_called"], ("", "ran\n")),
        # The tool ran and its journal row is closed; its result (and maybe
        # its announcement) not yet written.
        ("finish", ["tool_result"], ("ran\n",)),
    ],
)
async def test_a_call_whose_events_a_kill_9_lost_is_told_interrupted_never_run_again(
    tmp_path: Path, moment: str, lost: list[str], runs: tuple[str, ...]
) -> None:
    # The crash this test is about leaves the child's `lost` events off the
    # file. Whether they reach it before the journal's commit (the kill's
    # moment) depends on when the event loop runs the outbox's flush, and a
    # loaded machine can run it first: such a run is not this crash, and the
    # crash is made again in a fresh directory (a few times at most).
    for attempt in range(5):
        store_path = tmp_path / f"try{attempt}" / "o.db"
        workdir = tmp_path / f"try{attempt}" / "work"
        workdir.mkdir(parents=True)
        crash = [sys.executable, str(CRASH / "crash_tool.py"), str(store_path), "s1", str(workdir)]
        with anyio.fail_after(60):
            crashed = await anyio.run_process([*crash, moment], check=False)
        assert crashed.returncode == -9, crashed.stderr.decode()
        conn = sqlite3.connect(store_path)
        try:
            stored = [kind for (kind,) in conn.execute("SELECT kind FROM events ORDER BY seq")]
        finally:
            conn.close()
        if not set(lost) & set(stored):
            break
    else:
        pytest.fail(f"in 5 crashes, events {lost} always reached the file before the kill")
    runs_file = workdir / "runs.txt"
    ran_before = runs_file.read_text() if runs_file.exists() else ""
    assert ran_before in runs

    result = await recovered(store_path, workdir)
    # The journal says the call started: it may have run, so it is not run
    # again, and the model is told so (not that it never ran).
    assert isinstance(result, Done) and result.text == "tool said: " + INTERRUPTED_CALL
    assert (runs_file.read_text() if runs_file.exists() else "") == ran_before


async def test_a_call_that_only_reads_a_kill_9_interrupted_is_run_again(tmp_path: Path) -> None:
    """No side effect, no journal row: recovery runs the read again, where a
    journaled call is answered as interrupted (the test above)."""
    store_path, workdir = tmp_path / "o.db", tmp_path / "work"
    workdir.mkdir()
    crash = [sys.executable, str(CRASH / "crash_tool.py"), str(store_path), "s1", str(workdir)]
    with anyio.fail_after(60):
        crashed = await anyio.run_process([*crash, "read"], check=False)
    assert crashed.returncode == -9, crashed.stderr.decode()
    runs_file = workdir / "runs.txt"
    assert runs_file.read_text() == "ran\n"
    conn = sqlite3.connect(store_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM tool_calls").fetchone() == (0,)
    finally:
        conn.close()

    result = await recovered(store_path, workdir, read_only=True)
    assert isinstance(result, Done) and result.text == "tool said: marked"
    assert runs_file.read_text() == "ran\nran\n"


async def test_a_turn_that_raises_after_a_refused_write_still_stores_its_failure(
    tmp_path: Path,
) -> None:
    """The store refuses a child's tool results; the child's turn then
    raises before it emits anything else. The failure is stored all the
    same (alone, once the refused batch is dropped), with the child's row."""
    path = tmp_path / "orchestrator.db"

    async def worker(turn: Turn) -> AsyncIterator[str | ChildEvent]:
        refuse_results(path, turn.child_id)
        for event in calls(1):
            yield event
        raise RuntimeError("the handler broke")

    with anyio.fail_after(30):
        async with session_of(worker, tmp_path) as session:
            store = session.store
            handle = await session.spawn(ChildConfig(role="busy", prompt="go"))
            failed = await handle.result()
            record = await store.get_child(handle.child_id)
            rows = await store.events(session.id, child_id=handle.child_id)

    assert isinstance(failed, Failed) and failed.reason == "error"
    assert record is not None and record.status == "failed"
    assert [row.kind for row in rows][-1] == "failed"
    assert "tool_result" not in [row.kind for row in rows]
