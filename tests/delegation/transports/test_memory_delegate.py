"""`MemoryDelegate`: children played by a function, through a real Session.

The session, its store (a real SQLite file) and the handles are the real
ones; only the child is a function in place of a model or a role server,
which is what the in-memory transport is for.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from a2a_orchestrator import Delegate, MemoryDelegate
from a2a_orchestrator.delegation.base import ChildConfig, ChildHandle
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.memory import Handler, Turn
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    Started,
    ToolCalled,
    ToolResult,
)
from a2a_orchestrator.runtime.render import CANCELED_TEXT
from a2a_orchestrator.runtime.selectors import Selector
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

NETWORK = Network.of(AgentSpec(name="echo", role="echo"))


@asynccontextmanager
async def session_with(handler: Handler, workdir: Path, **kwargs: object) -> AsyncIterator[Session]:
    delegate: Delegate = MemoryDelegate(handler)  # the Protocol, as a caller holds it
    store = Store(workdir / ".a2a" / "orchestrator.db")
    try:
        async with Session(
            store, workdir=workdir, network=NETWORK, delegates={"local": delegate}, **kwargs
        ) as session:
            yield session
    finally:
        store.close()


def kinds(events: list[ChildEvent]) -> list[str]:
    return [event.kind for event in events]


async def drain(handle: ChildHandle, start: int = 0) -> list[ChildEvent]:
    return [event async for event in handle.events(start)]


async def test_a_plain_function_answers_and_the_store_keeps_it(tmp_path: Path) -> None:
    turns: list[Turn] = []

    def echo(turn: Turn) -> str:
        turns.append(turn)
        return f"echo: {turn.text}"

    with anyio.fail_after(10):
        async with session_with(echo, tmp_path) as session:
            events = [e async for e in session.spawn_child(ChildConfig(role="echo", prompt="hi"))]
            child_id = next(iter(session.children))
            record = await session.store.get_child(child_id)
            stored = await session.store.events(session.id, child_id=child_id)

    assert kinds(events) == ["started", "message", "done"]
    assert events[-1] == Done(text="echo: hi")
    assert [(t.child_id, t.text, t.number) for t in turns] == [(child_id, "hi", 1)]
    assert turns[0].agent.name == "echo" and turns[0].config.prompt == "hi"
    assert record is not None
    assert (record.status, record.result, record.transport) == ("completed", "echo: hi", "local")
    assert [row.kind for row in stored] == ["input", "started", "message", "done"]


async def test_an_async_generator_streams_events_and_follow_ups_see_the_history(
    tmp_path: Path,
) -> None:
    async def worker(turn: Turn) -> AsyncIterator[str | ChildEvent]:
        if turn.number == 1:
            yield ToolCalled(call_id="c1", tool="read_file", arguments={"path": "a"})
            yield ToolResult(call_id="c1", tool="read_file", output="A", success=True)
            yield "read a"
            return
        yield Done(text=f"turn {turn.number} after {len(turn.history)} messages: {turn.text}")

    with anyio.fail_after(10):
        async with session_with(worker, tmp_path) as session:
            handle = await session.spawn(ChildConfig(role="echo", prompt="read a"))
            first = await handle.result()
            start = len(handle.log)
            await handle.send("and now?")
            second = await handle.result()
            later = handle.log[start:]

    assert first == Done(text="read a")
    assert kinds(list(handle.log[:start])) == [
        "started",
        "tool_called",
        "tool_result",
        "message",
        "done",
    ]
    assert kinds(list(later)) == ["started", "done"]
    assert second == Done(text="turn 2 after 2 messages: and now?")


async def test_cancel_stops_a_turn_that_would_never_end(tmp_path: Path) -> None:
    entered = anyio.Event()

    async def stuck(turn: Turn) -> str:
        entered.set()
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    with anyio.fail_after(10):
        async with session_with(stuck, tmp_path) as session:
            handle = await session.spawn(ChildConfig(role="echo", prompt="wait"))
            await entered.wait()
            assert await handle.cancel() is True
            result = await handle.result()
            record = await session.store.get_child(handle.child_id)

    assert result == Failed(reason="aborted", message=CANCELED_TEXT)
    assert record is not None and (record.status, record.reason) == ("failed", "aborted")


async def test_a_handler_that_raises_fails_its_child_alone(tmp_path: Path) -> None:
    def handler(turn: Turn) -> str:
        if turn.config.prompt == "break":
            raise ValueError("broken on purpose")
        return "fine"

    with anyio.fail_after(10):
        async with session_with(handler, tmp_path) as session:
            broken = await session.spawn(ChildConfig(role="echo", prompt="break"))
            fine = await session.spawn(ChildConfig(role="echo", prompt="work"))
            results = await session.wait_all()

    assert results[broken.child_id] == Failed(
        reason="error", message="ValueError: broken on purpose"
    )
    assert results[fine.child_id] == Done(text="fine")


async def test_a_paused_child_takes_no_step_until_resumed(tmp_path: Path) -> None:
    def steps(turn: Turn) -> Iterator[str]:
        yield "one"
        yield "two"

    with anyio.fail_after(10):
        async with session_with(steps, tmp_path) as session:

            async def pause_at_one(handle: ChildHandle, event: ChildEvent) -> None:
                if isinstance(event, AssistantMessage) and event.text == "one":
                    await handle.pause()

            session.add_listener(pause_at_one)
            handle = await session.spawn(ChildConfig(role="echo", prompt="go"))
            # Watchers hear of events beside the child's turn; the rule holds
            # the child at "one" until the listener's pause confirms it.
            await handle.pause_on("at-one", Selector(kind="message", contains="one"))
            while not handle.paused:
                await anyio.sleep(0.01)
            # Held after "one": the handler's next item is not taken.
            await anyio.sleep(0.2)
            held = kinds(list(handle.log))
            await handle.resume()
            result = await handle.result()

    assert held == ["started", "message"]
    assert result == Done(text="two")
    assert kinds(list(handle.log)) == ["started", "message", "message", "done"]


async def test_a_question_waits_for_the_answer(tmp_path: Path) -> None:
    def asks(turn: Turn) -> ChildEvent | str:
        if turn.number == 1:
            return InputRequired(question="which file?")
        return f"editing {turn.text}"

    with anyio.fail_after(10):
        async with session_with(asks, tmp_path) as session:
            handle = await session.spawn(ChildConfig(role="echo", prompt="edit"))
            asked = await handle.result()
            status = handle.status
            await handle.send("a.txt")
            answered = await handle.result()

    assert asked == InputRequired(question="which file?")
    assert status == "input_required"
    assert answered == Done(text="editing a.txt")


async def test_a_later_session_reopens_the_child_from_the_store(tmp_path: Path) -> None:
    seen: list[Turn] = []

    def remembers(turn: Turn) -> str:
        seen.append(turn)
        return f"answer {turn.number}"

    with anyio.fail_after(10):
        async with session_with(remembers, tmp_path, session_id="s1") as session:
            handle = await session.spawn(ChildConfig(role="echo", prompt="first"))
            await handle.result()
        async with session_with(remembers, tmp_path, session_id="s1") as again:
            reopened = await again.child(handle.child_id)
            before = list(reopened.log)
            await reopened.send("second")
            result = await reopened.result()
            events = await drain(reopened)

    assert kinds(before) == ["started", "message", "done"]
    assert result == Done(text="answer 1")  # numbered from 1 in each process
    assert seen[-1].history == (
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer 1"},
    )
    assert kinds(events) == ["started", "message", "done"] * 2
    assert isinstance(events[3], Started)
