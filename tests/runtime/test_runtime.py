"""The agent runtime with a scripted model (the only fake: no live model calls)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.processes import running_with_args

from a2a_orchestrator.models import (
    ChatMessage,
    ModelItem,
    Restart,
    ScriptedModel,
    TextDelta,
    ToolSpec,
    Usage,
)
from a2a_orchestrator.runtime import conversation as runtime
from a2a_orchestrator.runtime.conversation import DELTA_INTERVAL, Conversation
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    MessageDelta,
    MessageRestarted,
    Started,
    ToolCalled,
    ToolResult,
)
from a2a_orchestrator.tools import Workspace, build_tools

pytestmark = pytest.mark.anyio


class Recorder:
    def __init__(self) -> None:
        self.events: list[ChildEvent] = []

    async def __call__(self, event: ChildEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events if e.kind != "message_delta"]


def conversation(tmp_path: Path, script: Any, **kwargs: Any) -> Conversation:
    tools = build_tools(["write_file", "read_file", "run_command"], Workspace(tmp_path))
    return Conversation(
        model=ScriptedModel(script), tools=tools, system_prompt="You code.", **kwargs
    )


async def test_tool_calls_then_final_answer(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {
                "text": "Writing it.",
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "a.txt", "content": "hello"}}
                ],
            },
            {"text": "Done.\nTASK_DONE"},
        ],
        role="coder",
    )
    rec = Recorder()
    with anyio.fail_after(10):
        terminal = await conv.run("write a.txt", rec)
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert rec.kinds() == ["started", "message", "tool_called", "tool_result", "message", "done"]
    assert isinstance(rec.events[0], Started) and rec.events[0].role == "coder"
    assert isinstance(terminal, Done) and terminal.text == "Done.\nTASK_DONE"
    assert terminal.usage.input_tokens > 0 and terminal.usage.output_tokens > 0
    deltas = "".join(e.text for e in rec.events if isinstance(e, MessageDelta))
    assert deltas == "Writing it.Done.\nTASK_DONE"
    # The transcript: system, user, assistant(+call), tool, assistant.
    assert [m["role"] for m in conv.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_failing_tool_is_reported_and_the_loop_goes_on(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"tool_calls": [{"name": "read_file", "arguments": {"path": "missing.txt"}}]},
            {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
            {"text": "gave up"},
        ],
    )
    rec = Recorder()
    with anyio.fail_after(10):
        await conv.run("read it", rec)
    results = [e for e in rec.events if isinstance(e, ToolResult)]
    assert [r.success for r in results] == [False, False]
    assert "missing.txt" in results[0].output
    assert "Unknown tool 'no_such_tool'" in results[1].output
    assert isinstance(rec.events[-1], Done)


async def test_max_turns_ends_failed(tmp_path: Path) -> None:
    def forever(messages: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]}

    conv = conversation(tmp_path, forever, max_turns=3)
    rec = Recorder()
    with anyio.fail_after(10):
        terminal = await conv.run("loop", rec)
    assert isinstance(terminal, Failed) and terminal.reason == "max_turns"
    assert sum(isinstance(e, ToolCalled) for e in rec.events) == 3
    assert rec.events[-1] == terminal


async def test_timeout_ends_failed(tmp_path: Path) -> None:
    conv = conversation(tmp_path, [{"text": "slow", "delay": 30}], timeout=0.3)
    rec = Recorder()
    with anyio.fail_after(10):
        terminal = await conv.run("go", rec)
    assert isinstance(terminal, Failed) and terminal.reason == "timeout"
    assert rec.kinds() == ["started", "failed"]


async def test_model_error_ends_failed_with_reason_error(tmp_path: Path) -> None:
    conv = conversation(tmp_path, [{"error": "endpoint exploded"}])
    rec = Recorder()
    with anyio.fail_after(10):
        terminal = await conv.run("go", rec)
    assert isinstance(terminal, Failed) and terminal.reason == "error"
    assert "endpoint exploded" in terminal.message


async def test_abort_mid_command_kills_it(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "run_command", "arguments": {"command": "echo ok > pid; sleep 30.377"}}
                ]
            }
        ],
    )
    rec = Recorder()
    terminal: ChildEvent | None = None

    async def run() -> None:
        nonlocal terminal
        terminal = await conv.run("go", rec)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
                await anyio.sleep(0.02)
            conv.abort()
    assert isinstance(terminal, Failed) and terminal.reason == "aborted"
    assert running_with_args("sleep", "30.377") == []
    assert not conv.running


async def test_ask_parent_then_follow_up_continues_the_conversation(tmp_path: Path) -> None:
    seen: list[list[dict[str, Any]]] = []

    def script(messages: Any) -> dict[str, Any]:
        seen.append(list(messages))
        if not any(m["role"] == "tool" for m in messages):
            return {
                "tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which port?"}}]
            }
        return {"text": f"Using {messages[-1]['content']}"}

    conv = Conversation(model=ScriptedModel(script), ask_parent=True)
    rec = Recorder()
    with anyio.fail_after(10):
        first = await conv.run("configure the server", rec)
        assert isinstance(first, InputRequired) and first.question == "Which port?"
        assert conv.pending_question is not None
        second = await conv.run("8080", rec)
    assert isinstance(second, Done) and second.text == "Using 8080"
    # The answer went back as the ask_parent call's tool result.
    assert seen[-1][-1]["role"] == "tool" and seen[-1][-1]["content"] == "8080"
    assert conv.pending_question is None


async def test_pause_holds_at_step_boundary_and_time_paused_does_not_count(tmp_path: Path) -> None:
    conv = conversation(
        tmp_path,
        [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "a", "content": "1"}}]},
            {"text": "finished"},
        ],
        timeout=1.0,
    )
    rec = Recorder()
    conv.pause()
    terminal: ChildEvent | None = None

    async def run() -> None:
        nonlocal terminal
        terminal = await conv.run("go", rec)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.sleep(1.3)  # longer than the timeout, while paused
            assert rec.kinds() == ["started"]
            assert conv.paused
            conv.resume()
    assert isinstance(terminal, Done) and terminal.text == "finished"


async def test_inbox_absorbed_at_step_boundary_steering_first_deduped(tmp_path: Path) -> None:
    inbox_seen: list[list[str]] = []

    def script(messages: Any) -> dict[str, Any]:
        inbox_seen.append([m["content"] for m in messages if m["role"] == "user"])
        if len(inbox_seen) == 1:
            # Input arriving during step 0 waits for the next step boundary.
            conv.deliver("uuid-1", "child result")
            assert not conv.deliver("uuid-1", "child result again")  # same uuid: dropped
            conv.steer("steer: hurry")
            return {"tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]}
        return {"text": "ok"}

    conv = Conversation(model=ScriptedModel(script))
    rec = Recorder()
    with anyio.fail_after(10):
        await conv.run("task", rec)
    # Step 0 saw only the task; step 1 saw steering first, then the child result.
    assert inbox_seen[0] == ["task"]
    assert inbox_seen[1] == ["task", "steer: hurry", "child result"]


async def test_input_queued_between_turns_is_in_the_first_model_call(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def script(messages: Any) -> dict[str, Any]:
        seen.append([m["content"] for m in messages if m["role"] == "user"])
        return {"text": "ok"}

    conv = Conversation(model=ScriptedModel(script))
    conv.deliver("uuid-1", "child result")
    conv.steer("injected")
    with anyio.fail_after(10):
        await conv.run("task", Recorder())
    # One model call, with what was waiting ahead of the turn's own input.
    assert seen == [["injected", "child result", "task"]]


async def test_conversations_are_isolated(tmp_path: Path) -> None:
    model = ScriptedModel(lambda messages: {"text": f"saw {len(messages)} messages"})
    one = Conversation(model=model, system_prompt="A")
    two = Conversation(model=model, system_prompt="B")
    with anyio.fail_after(10):
        await one.run("first", Recorder())
        await one.run("second", Recorder())
        done = await two.run("only", Recorder())
    assert isinstance(done, Done) and done.text == "saw 2 messages"
    assert all(m.get("content") != "first" for m in two.messages)


async def test_second_concurrent_run_is_refused(tmp_path: Path) -> None:
    conv = conversation(tmp_path, [{"text": "slow", "delay": 0.5}, {"text": "x"}])
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conv.run, "a", Recorder())
            await anyio.sleep(0.05)
            with pytest.raises(RuntimeError, match="already running"):
                await conv.run("b", Recorder())


async def test_event_dicts_round_trip() -> None:
    from a2a_orchestrator.models import Usage
    from a2a_orchestrator.runtime.events import event_from_dict, event_to_dict

    for event in [
        Started(role="r", model="m"),
        MessageDelta(text="d"),
        MessageRestarted(reason="cut"),
        AssistantMessage(text="t"),
        ToolCalled(call_id="c", tool="t", arguments={"a": 1}),
        ToolResult(call_id="c", tool="t", output="o", success=False),
        InputRequired(question="q"),
        Done(text="x", usage=Usage(input_tokens=1, output_tokens=2)),
        Failed(reason="timeout", message="m"),
    ]:
        assert event_from_dict(event_to_dict(event)) == event
    with pytest.raises(ValueError):
        event_from_dict({"kind": "nope"})


async def test_an_answer_to_ask_parent_comes_before_queued_input(tmp_path: Path) -> None:
    def script(messages: Any) -> dict[str, Any]:
        if not any(m["role"] == "tool" for m in messages):
            return {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Color?"}}]}
        return {"text": "ok"}

    conv = Conversation(model=ScriptedModel(script), ask_parent=True)
    with anyio.fail_after(10):
        await conv.run("task", Recorder())
        conv.steer("injected")
        await conv.run("blue", Recorder())
    # The answer is the call's tool result, right after the call; then the rest.
    tail = [(m["role"], m.get("content")) for m in conv.messages[-4:]]
    assert tail[:3] == [("assistant", None), ("tool", "blue"), ("user", "injected")]


class CutOnce:
    """A model whose stream is cut and begun again, as `OpenAIModel` yields
    it after a dropped connection (the model is the one fake here)."""

    name = "cut-once"

    def __init__(self, *, shown: bool) -> None:
        self.shown = shown
        """Whether the first attempt streams long enough for a delta to go out."""

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncIterator[ModelItem]:
        yield TextDelta(text="Half ")
        if self.shown:
            await anyio.sleep(DELTA_INTERVAL * 2)
        yield TextDelta(text="an answer")
        yield Restart(reason="model endpoint unreachable mid-stream")
        yield TextDelta(text="Another, whole answer.")
        yield Usage(input_tokens=5, output_tokens=4)


@pytest.mark.parametrize("shown", [True, False])
async def test_a_restart_withdraws_what_was_sent_and_the_turn_keeps_the_retry(
    shown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not shown:
        # Nothing goes out before the end of the call, however slow the machine.
        monkeypatch.setattr(runtime, "DELTA_INTERVAL", 60.0)
    conv = Conversation(model=CutOnce(shown=shown), system_prompt="You code.")
    recorder = Recorder()
    with anyio.fail_after(10):
        outcome = await conv.run("go", recorder)
    events = recorder.events
    assert isinstance(outcome, Done) and outcome.text == "Another, whole answer."
    withdrawn = [n for n, e in enumerate(events) if isinstance(e, MessageRestarted)]
    deltas = [e.text for e in events if isinstance(e, MessageDelta)]
    if shown:
        # What went out is withdrawn once; what follows is the retry's alone.
        [at] = withdrawn
        assert events[at].reason == "model endpoint unreachable mid-stream"
        assert deltas == ["Half an answer", "Another, whole answer."]
        assert isinstance(events[at - 1], MessageDelta) and events[at - 1].text == "Half an answer"
    else:
        # Nothing had gone out (deltas are coalesced): nothing to withdraw.
        assert withdrawn == [] and deltas == ["Another, whole answer."]
    assert [e.text for e in events if isinstance(e, AssistantMessage)] == ["Another, whole answer."]
    assert conv.messages[-1] == {"role": "assistant", "content": "Another, whole answer."}
    assert conv.usage == Usage(input_tokens=5, output_tokens=4)
