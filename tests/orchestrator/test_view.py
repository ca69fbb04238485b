"""The live tree: rich's Live + Tree on a terminal, one line per event elsewhere."""

from __future__ import annotations

from io import StringIO

import anyio
import anyio.lowlevel
import pytest
from rich.console import Console

from a2a_orchestrator.delegation.session import RelayedEvent
from a2a_orchestrator.models.base import Usage
from a2a_orchestrator.orchestrator.view import LiveTree
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    MessageDelta,
    MessageRestarted,
    Started,
    ToolCalled,
    ToolResult,
)

pytestmark = pytest.mark.anyio


def relayed(child_id: str, role: str, event: ChildEvent, parent_id: str = "") -> RelayedEvent:
    return RelayedEvent(
        child_id=child_id,
        parent_id=parent_id,
        agent=role,
        role=role,
        transport="remote",
        event=event,
    )


RUN = [
    relayed("arch01aa", "architect", Started(role="architect", model="scripted")),
    relayed("arch01aa", "architect", Done(text="## Approach", usage=Usage(input_tokens=40))),
    relayed("code01bb", "coder", Started(role="coder")),
    relayed("code01bb", "coder", ToolCalled(call_id="c1", tool="write_file", arguments={})),
    relayed("help01cc", "helper", Started(role="helper"), parent_id="code01bb"),
    relayed("help01cc", "helper", Done(text="helped", usage=Usage(output_tokens=5)), "code01bb"),
    relayed(
        "code01bb", "coder", ToolResult(call_id="c1", tool="write_file", output="", success=True)
    ),
    relayed("code01bb", "coder", Failed(reason="error", message="tests fail")),
]


async def play(tree: LiveTree) -> None:
    send, receive = anyio.create_memory_object_stream[RelayedEvent](len(RUN))

    async def work() -> str:
        for item in RUN:
            await send.send(item)
            await anyio.lowlevel.checkpoint()  # the view draws between events, as in a run
        return "finished"

    with anyio.fail_after(10):
        async with send, receive:
            assert await tree.follow_while(receive, work()) == "finished"


async def test_on_a_terminal_the_tree_is_drawn_live_with_roles_and_statuses() -> None:
    screen = StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system="standard")
    tree = LiveTree("pipeline  session 3f2a", console=console, expected=["architect", "coder"])
    assert tree.live
    await play(tree)
    output = screen.getvalue()
    # Redrawn in place: cursor movements, and several frames.
    assert "\x1b[" in output and output.count("pipeline  session 3f2a") > 1
    final = Console(file=StringIO(), width=120)
    with final.capture() as captured:
        final.print(tree.tree())
    frame = captured.get()
    lines = frame.splitlines()
    assert lines[0] == "pipeline  session 3f2a"
    architect = next(line for line in lines if "architect" in line)
    coder = next(line for line in lines if "coder" in line)
    helper = next(line for line in lines if "helper" in line)
    assert "arch01" in architect and "completed" in architect and "40 tok" in architect
    assert "failed:error" in coder and "tests fail" in coder and "(Σ 5 tok)" in coder
    assert "completed" in helper and 'done "helped"' in helper
    # The helper is drawn under the coder that spawned it, one level deeper.
    assert lines.index(helper) > lines.index(coder)
    assert helper.index("helper") > coder.index("coder")
    # The last frame on the terminal is the final state.
    assert "failed:error" in output.rsplit("pipeline  session 3f2a", 1)[1]


async def test_elsewhere_each_event_is_one_line_and_the_tree_is_printed_once() -> None:
    out = StringIO()
    tree = LiveTree("resume  session 3f2a", out=out)
    assert not tree.live
    await play(tree)
    tree.draw()
    lines = out.getvalue().splitlines()
    assert lines[: len(RUN)] == [
        "[architect arch01 remote] started (scripted)",
        '[architect arch01 remote] done "## Approach"',
        "[coder code01 remote] started",
        "[coder code01 remote] calls write_file",
        "[helper help01 remote] started",
        '[helper help01 remote] done "helped"',
        "[coder code01 remote] write_file ok",
        "[coder code01 remote] failed (error) tests fail",
    ]
    assert lines[len(RUN)] == "resume  session 3f2a"
    assert lines[len(RUN) + 1 :] == tree.lines()[1:]
    assert "\x1b" not in out.getvalue()


def frame_of(tree: LiveTree) -> str:
    console = Console(file=StringIO(), width=120)
    with console.capture() as captured:
        console.print(tree.tree())
    return captured.get()


async def test_a_restarted_message_replaces_the_half_shown_text_with_a_mark() -> None:
    """A stream cut mid-answer: on a terminal the withdrawn text leaves the
    row at once and the message begun again is marked until the child moves
    on; in a log (no deltas) the withdrawal is one line and the message is marked."""
    cut = "model endpoint http://127.0.0.1:1/v1 unreachable mid-stream"
    events = [
        Started(role="coder"),
        MessageDelta(text="Draft one: the plan"),
        MessageRestarted(reason=cut),
        MessageDelta(text="Second try"),
        AssistantMessage(text="Second try, whole."),
        ToolCalled(call_id="c1", tool="read_file", arguments={"path": "a.py"}),
    ]
    screen = Console(file=StringIO(), force_terminal=True, width=120)
    live = LiveTree("run", console=screen)
    out = StringIO()
    log = LiveTree("run", out=out)
    frames = []
    for event in events:
        live.update(relayed("code01bb", "coder", event))
        log.update(relayed("code01bb", "coder", event))
        frames.append(frame_of(live))
    assert "Draft one" in frames[1]
    assert "Draft one" not in frames[2] and "text withdrawn (stream cut; restarted)" in frames[2]
    assert 'says "Second try" (stream cut; restarted)' in frames[3]
    assert 'says "Second try, whole." (stream cut; restarted)' in frames[4]
    assert "restarted" not in frames[5] and "calls read_file a.py" in frames[5]
    assert out.getvalue().splitlines() == [
        "[coder code01 remote] started",
        "[coder code01 remote] text withdrawn (stream cut; restarted)",
        '[coder code01 remote] says "Second try, whole." (stream cut; restarted)',
        "[coder code01 remote] calls read_file a.py",
    ]


async def test_the_mark_ends_with_the_restarted_message() -> None:
    # Input that came during the step makes the turn go on with a new
    # message, no tool call between: that one was never cut.
    events = [
        Started(role="coder"),
        MessageDelta(text="Draft one"),
        MessageRestarted(reason="cut"),
        AssistantMessage(text="Second try, whole."),
        MessageDelta(text="About your note"),
    ]
    live = LiveTree("run", console=Console(file=StringIO(), force_terminal=True, width=120))
    for event in events:
        live.update(relayed("code01bb", "coder", event))
    frame = frame_of(live)
    assert 'says "About your note"' in frame and "restarted" not in frame
