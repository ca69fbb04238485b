"""One delegation interface, two transports: the same scenarios give the same events.

The remote side is a real role server on 127.0.0.1; the local side runs the
same role in-process. Only the model is scripted (the same script both ways).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import SCENARIOS, TRANSPORTS, config, drain, run_all_scenarios, session_for

from a2a_orchestrator.runtime.events import ChildEvent, Done, Failed, ToolResult

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_scenarios_through_one_interface(
    transport: str, scenario: str, tmp_path: Path
) -> None:
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, SCENARIOS[scenario]) as session:
            handle = await session.spawn(config(f"run {scenario}"))
            events = await drain(handle)
            record = await session.store.get_child(handle.child_id)
    expected = EXPECTED[scenario]
    assert [e.kind for e in events if e.kind != "message_delta"] == expected
    assert record is not None and record.transport == transport
    if scenario == "success":
        assert (tmp_path / "a.txt").read_text() == "A"
        assert isinstance(events[-1], Done) and events[-1].text == "All done.\nTASK_DONE"
        assert record.status == "completed" and record.result == "All done.\nTASK_DONE"
    else:
        result = next(e for e in events if isinstance(e, ToolResult))
        assert not result.success and "exit code 3" in result.output
    SEQUENCES.setdefault(scenario, {})[transport] = events


EXPECTED = {
    "success": ["started", "message", "tool_called", "tool_result", "message", "done"],
    "failing_tool": ["started", "tool_called", "tool_result", "message", "done"],
}
SEQUENCES: dict[str, dict[str, list[ChildEvent]]] = {}


async def test_both_transports_give_identical_event_sequences(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        local = await run_all_scenarios("local", tmp_path / "local")
        remote = await run_all_scenarios("remote", tmp_path / "remote")
    assert set(local) == {"success", "failing_tool", "input_required", "cancel", "max_turns"}
    for name in local:
        # Events compare by value (their uuids are identity, not value).
        assert local[name] == remote[name], name
    kinds = [e.kind for e in local["input_required"] if e.kind != "message_delta"]
    assert kinds[-3:] == ["started", "message", "done"]
    cancel = local["cancel"][-1]
    assert isinstance(cancel, Failed) and cancel.reason == "aborted"
    assert cancel.message == "canceled by request"
    exhausted = local["max_turns"][-1]
    assert isinstance(exhausted, Failed) and exhausted.reason == "max_turns"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_spawn_child_iterator_and_dropping_it_does_not_cancel(
    transport: str, tmp_path: Path
) -> None:
    script = [
        {
            "text": "step one",
            "delay": 0.3,
            "tool_calls": [{"name": "write_file", "arguments": {"path": "one", "content": "1"}}],
        },
        {"text": "finished", "delay": 0.3},
    ]
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            kinds = []
            async for event in session.spawn_child(config("go")):
                kinds.append(event.kind)
                if event.kind == "started":
                    break  # drop the iterator
            (child_id,) = session.children
            handle = session.children[child_id]
            result = await handle.result()
            events = await session.store.events(session.id, child_id=child_id)
    assert kinds == ["started"]
    assert isinstance(result, Done) and result.text == "finished"
    assert (tmp_path / "one").read_text() == "1"
    stored_kinds = [e.kind for e in events]
    assert stored_kinds[0] == "input" and stored_kinds[-1] == "done"
    assert "message_delta" not in stored_kinds


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_child_config_is_applied(transport: str, tmp_path: Path) -> None:
    seen: list[list[dict[str, Any]]] = []

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append(list(messages))
        return {"text": "ok"}

    shared = (
        {"role": "user", "content": "context from the parent"},
        {"role": "assistant", "content": "noted"},
    )
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            handle = await session.spawn(
                config(
                    "task",
                    system_prompt="You are terse.",
                    tools=("read_file",),
                    shared_context=shared,
                )
            )
            await handle.wait()
            isolated = await session.spawn(config("second"))
            await isolated.wait()
    first, second = seen[0], seen[1]
    assert first[0] == {"role": "system", "content": "You are terse."}
    assert [m["content"] for m in first[1:]] == ["context from the parent", "noted", "task"]
    # The second child sees nothing of the first: isolated by default.
    assert [m["role"] for m in second] == ["system", "user"] and second[1]["content"] == "second"
    assert "You are terse." not in second[0]["content"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_completed_child_continues_in_the_same_conversation(
    transport: str, tmp_path: Path
) -> None:
    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        users = [m["content"] for m in messages if m["role"] == "user"]
        return {"text": " + ".join(users)}

    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            handle = await session.spawn(config("first"))
            assert (await handle.result()) == Done(
                text="first", usage=(await handle.result()).usage
            )  # type: ignore[union-attr]
            await handle.send("second")
            result = await handle.result()
    assert isinstance(result, Done) and result.text == "first + second"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_pause_and_resume(transport: str, tmp_path: Path) -> None:
    script = [
        {
            "tool_calls": [{"name": "write_file", "arguments": {"path": "step1", "content": "1"}}],
            "delay": 0.2,
        },
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "step2", "content": "2"}}]},
        {"text": "done"},
    ]
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, script) as session:
            handle = await session.spawn(config("two steps"))
            while not any(e.kind == "started" for e in handle.log):
                await anyio.sleep(0.01)
            # Paused while the model thinks: its tool call is a step boundary too.
            await handle.pause()
            while not any(e.kind == "tool_called" for e in handle.log):
                await anyio.sleep(0.01)
            await anyio.sleep(0.5)
            paused_at = [e.kind for e in handle.log]
            assert not (tmp_path / "step1").exists()
            await handle.resume()
            result = await handle.result()
    assert paused_at[-1] == "tool_called"
    assert isinstance(result, Done) and (tmp_path / "step2").exists()
