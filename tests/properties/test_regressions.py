"""Regressions found in review: each test names the failure it guards against."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import TRANSPORTS, session_for

from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.control.reactions import Reaction, Reactions
from a2a_orchestrator.delegation.hooks import Hooks
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.runtime.selectors import Selector

pytestmark = pytest.mark.anyio


def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    users = [m["content"] for m in messages if m["role"] == "user"]
    return {"text": "answer to " + " + ".join(users), "delay": 0.1}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_slow_watcher_of_done_does_not_leave_wait_agent_hanging(
    transport: str, tmp_path: Path
) -> None:
    """A listener awaiting on the terminal event used to wake the plane before
    the child was idle, and nothing woke it again: wait_agent timed out."""
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            plane = ControlPlane(session, wait_bounds_ms=(10_000, 60_000))
            rule = Reaction(event=Selector(kind="done"), inject="done: {{ event.content }}")
            reactions = Reactions(plane, [rule])
            child = await plane.spawn_agent("coder", "one")
            answer = await plane.wait_agent(child.child_id)
            report = await plane.agent_manage(block_for=5)
            reactions.close()
            plane.close()
    assert answer["status"] == "completed"
    assert report[0]["status"] == "idle"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_delivery_survives_a_restart_and_happens_once(transport: str, tmp_path: Path) -> None:
    """Delivery state lived in memory: after a restart wait_agent on a finished
    child timed out, and re-deliveries stored the result twice."""
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, script) as session:
            async with Session(
                session.store,
                workdir=tmp_path,
                network=session.network,
                models=session.models,
                session_id="s",
            ) as first:
                plane = ControlPlane(first)
                child = await plane.spawn_agent("coder", "one")
                await plane.wait_agent(child.child_id)
                plane.close()
            async with Session(
                session.store,
                workdir=tmp_path,
                network=session.network,
                models=session.models,
                session_id="s",
            ) as second:
                plane = ControlPlane(second, wait_bounds_ms=(100, 1000))
                again = await plane.wait_agent(child.child_id)
                report = await plane.agent_manage(block_for=1)
                plane.close()
            results = await session.store.events("s", kinds=["subagent_result"])
    assert again["status"] == "completed" and again["result"] == "answer to one"
    assert [e["child_id"] for e in report] == [child.child_id]
    assert len(results) == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_follow_up_turn_is_recorded_as_running(transport: str, tmp_path: Path) -> None:
    """A follow-up left the row 'completed' while it ran, so a crash lost it."""
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            plane = ControlPlane(session)
            child = await plane.spawn_agent("coder", "one")
            await plane.wait_agent(child.child_id)
            await child.send("two")
            while not any(e.kind == "started" for e in child.log[4:]):
                await anyio.sleep(0.01)
            during = await session.store.get_child(child.child_id)
            final = await child.result()
            after = await session.store.get_child(child.child_id)
            plane.close()
    assert during is not None and during.status == "running" and during.completed_at is None
    assert isinstance(final, Done) and final.text == "answer to one + two"
    assert after is not None and after.status == "completed"


async def test_a_failing_watcher_does_not_unmake_a_result(tmp_path: Path) -> None:
    """A listener's exception used to add a second terminal event (failed)."""
    hooks = Hooks()

    def broken(info: Any) -> None:
        raise RuntimeError("the hook broke")

    hooks.on("complete", broken)
    with anyio.fail_after(20):
        async with session_for("local", tmp_path, script) as session:

            async def explode(handle: Any, event: Any) -> None:
                if event.kind == "done":
                    raise RuntimeError("the watcher broke")

            remove = session.add_listener(explode)
            plane = ControlPlane(session, hooks=hooks)
            child = await plane.spawn_agent("coder", "one")
            answer = await plane.wait_agent(child.child_id)
            remove()
            plane.close()
            record = await session.store.get_child(child.child_id)
    terminals = [e.kind for e in child.log if e.kind in ("done", "failed")]
    assert terminals == ["done"]
    assert answer["status"] == "completed"
    assert record is not None and record.status == "completed"


def test_a_turn_aborted_mid_tool_keeps_the_rest_of_the_transcript() -> None:
    """An aborted step's open call used to swallow every later turn on rebuild."""
    from a2a_orchestrator.runtime.events import AssistantMessage, Failed, Started, ToolCalled
    from a2a_orchestrator.runtime.transcript import UNFINISHED_CALL, rebuild_transcript

    entries = [
        "first",
        Started(),
        ToolCalled(call_id="c1", tool="run_command", arguments={}),
        Failed(reason="aborted", message="interrupted"),
        "second",
        Started(),
        AssistantMessage(text="hi"),
        Done(text="hi"),
        "third",
        Started(),
        AssistantMessage(text="bye"),
    ]
    messages = rebuild_transcript("sys", entries)
    assert [(m["role"], m.get("content")) for m in messages] == [
        ("system", "sys"),
        ("user", "first"),
        ("assistant", None),
        ("tool", UNFINISHED_CALL),
        ("user", "second"),
        ("assistant", "hi"),
        ("user", "third"),
        ("assistant", "bye"),
    ]


async def test_a_follow_up_that_raises_ends_failed_not_silently(tmp_path: Path) -> None:
    """The check for a terminal event read the previous turn's and dropped this one."""
    from a2a_orchestrator.delegation.base import ChildHandle

    class Run:
        transport, model, task_id, context_id = "local", "m", "", ""
        turns = 0

        async def turn(self, text: Any, emit: Any) -> None:
            self.turns += 1
            if self.turns == 2:
                raise RuntimeError("agent gone")
            await emit(Done(text="first"))

        async def aclose(self) -> None:
            pass

    handle = ChildHandle(child_id="c", agent="a", role="r", run=Run())  # type: ignore[arg-type]
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            handle.start(tg)
            await handle.send("one")
            first = await handle.result()
            await handle.send("two")
            second = await handle.result()
            tg.cancel_scope.cancel()
    assert isinstance(first, Done)
    assert second.kind == "failed" and "agent gone" in second.message  # type: ignore[union-attr]


async def test_interrupt_spares_the_turn_queued_behind(tmp_path: Path) -> None:
    """The interrupt flag used to also fail the follow-up queued behind the turn."""
    with anyio.fail_after(20):
        async with session_for("local", tmp_path, script) as session:
            plane = ControlPlane(session)
            child = await plane.spawn_agent("coder", "one")
            while not child.log:
                await anyio.sleep(0.01)
            await child.send("two")
            assert await child.interrupt()
            final = await child.result()
            plane.close()
    kinds = [e.kind for e in child.log if e.kind in ("done", "failed")]
    assert kinds == ["failed", "done"]
    assert isinstance(final, Done) and final.text.startswith("answer to one")
