"""Watchers are off the child's critical section, and a store failure is one
child's: a blocked watcher does not delay a child's completion, a failing
one does not fail it, and a child whose writes fail ends failed alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import TRANSPORTS, config, session_for
from support.storage import refuse_child

from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.delegation.base import ChildHandle
from a2a_orchestrator.delegation.hooks import CompleteInfo, Hooks
from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.runtime.events import ChildEvent, Done, Failed

pytestmark = pytest.mark.anyio


def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return {"text": "answer to " + " + ".join(users), "delay": 0.05}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_blocked_watcher_does_not_delay_the_child(transport: str, tmp_path: Path) -> None:
    release = anyio.Event()
    blocked = anyio.Event()
    heard: list[str] = []

    async def stuck(handle: ChildHandle, event: ChildEvent) -> None:
        heard.append(event.kind)
        if event.kind == "started":
            blocked.set()
            await release.wait()

    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            remove = session.add_listener(stuck)
            child = await session.spawn(config("one"))
            result = await child.result()
            # The child is done, and its end is stored, while the watcher
            # still sits on the child's first event.
            record = await session.store.get_child(child.child_id)
            stored = await session.store.events(session.id, child_id=child.child_id)
            assert blocked.is_set() and not release.is_set()
            heard_while_blocked = list(heard)
            release.set()
            while "done" not in heard:
                await anyio.sleep(0.01)
            remove()
    assert isinstance(result, Done) and result.text == "answer to one"
    assert record is not None and record.status == "completed"
    assert stored[-1].kind == "done"
    assert heard_while_blocked == ["started"]
    # Once released, the watcher hears every event, in order.
    assert heard == [e.kind for e in child.log]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_blocked_complete_hook_does_not_delay_the_child(
    transport: str, tmp_path: Path
) -> None:
    release = anyio.Event()
    entered = anyio.Event()
    completed: list[CompleteInfo] = []
    hooks = Hooks()

    async def complete(info: CompleteInfo) -> None:
        entered.set()
        await release.wait()
        completed.append(info)

    hooks.on("complete", complete)
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            plane = ControlPlane(session, hooks=hooks)
            child = await plane.spawn_agent("coder", "one")
            second = await plane.spawn_agent("coder", "two")
            await entered.wait()
            await child.wait()
            await second.wait()
            records = {r.child_id: r for r in await session.store.list_children()}
            assert not release.is_set()
            release.set()
            # `wait_agent` answers once the result is delivered, hook included.
            answers = [await plane.wait_agent(h.child_id) for h in (child, second)]
            plane.close()
    assert {r.status for r in records.values()} == {"completed"}
    assert [a["status"] for a in answers] == ["completed", "completed"]
    assert sorted(info.child_id for info in completed) == sorted([child.child_id, second.child_id])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_failing_watcher_does_not_fail_the_child(transport: str, tmp_path: Path) -> None:
    heard: list[str] = []

    async def broken(handle: ChildHandle, event: ChildEvent) -> None:
        heard.append(event.kind)
        raise RuntimeError("the watcher broke")

    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            remove = session.add_listener(broken)
            child = await session.spawn(config("one"))
            result = await child.result()
            while "done" not in heard:
                await anyio.sleep(0.01)
            remove()
            again = await session.spawn(config("two"))
            second = await again.result()
            record = await session.store.get_child(child.child_id)
    assert isinstance(result, Done) and isinstance(second, Done)
    assert [e.kind for e in child.log if e.kind in ("done", "failed")] == ["done"]
    assert record is not None and record.status == "completed"
    # It was told of every event though it raised on each.
    assert heard == [e.kind for e in child.log]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_store_failure_fails_that_child_alone(transport: str, tmp_path: Path) -> None:
    """Once its prompt is stored, every write of one child's events fails (a
    trigger in the real file), and every write of another from the start:
    each ends failed in memory, with the `StoreError`; their sibling
    completes, and the session goes on."""
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, script) as session:
            refuse_child(session.store.path, "doomed", "NEW.kind != 'input'")
            refuse_child(session.store.path, "unborn")
            doomed = await session.spawn(config("one"), child_id="doomed")
            unborn = await session.spawn(config("zero"), child_id="unborn")
            sibling = await session.spawn(config("two"))
            failed = await doomed.result()
            never = await unborn.result()
            done = await sibling.result()
            later = await (await session.spawn(config("three"))).result()
            sibling_record = await session.store.get_child(sibling.child_id)
    for handle, outcome in ((doomed, failed), (unborn, never)):
        assert isinstance(outcome, Failed) and outcome.reason == "error"
        assert "StoreError" in outcome.message and "child write refused" in outcome.message
        assert handle.status == "failed" and isinstance(handle.error, StoreError)
    assert isinstance(done, Done) and done.text == "answer to two"
    assert sibling_record is not None and sibling_record.status == "completed"
    assert isinstance(later, Done) and later.text == "answer to three"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_store_failure_is_recorded_when_it_still_can_be(
    transport: str, tmp_path: Path
) -> None:
    """Only the child's `started` write fails: its turn's failure, naming the
    store failure, is stored with its status."""
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, script) as session:
            refuse_child(session.store.path, "flaky", "NEW.kind = 'started'")
            flaky = await session.spawn(config("one"), child_id="flaky")
            sibling = await session.spawn(config("two"))
            failed = await flaky.result()
            done = await sibling.result()
            record = await session.store.get_child("flaky")
            stored = await session.store.events(session.id, child_id="flaky")
    assert isinstance(failed, Failed) and failed.reason == "error"
    assert isinstance(done, Done)
    assert record is not None and record.status == "failed" and record.reason == "error"
    assert "StoreError" in record.result and "child write refused" in record.result
    assert [e.kind for e in stored] == ["input", "failed"]
