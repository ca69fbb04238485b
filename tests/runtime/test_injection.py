"""Input that waits for a parent between its turns is in its next turn's first model call.

The seed's "never at step 0" rule is for input arriving while a turn runs
(the children it just spawned cannot have answered yet). An injection
without `run_turn`, or a child's result, that arrived while the parent was
idle belongs to the parent's next turn from its first step, where a parent
rebuilt from the store (a restart) would see it too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import session_for

from a2a_orchestrator.control.parent import ParentAgent
from a2a_orchestrator.models import ScriptedModel

pytestmark = pytest.mark.anyio


def child(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A child that fails a command, then gives up."""
    if not any(m["role"] == "tool" for m in messages):
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": "exit 3"}}]}
    return {"text": "gave up"}


async def test_an_injection_waiting_for_an_idle_parent_is_in_its_first_model_call(
    tmp_path: Path,
) -> None:
    calls: list[list[dict[str, Any]]] = []

    def parent_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
        calls.append([dict(m) for m in messages])
        return {"text": "noted"}

    with anyio.fail_after(30):
        async with session_for("local", tmp_path, child) as session:
            parent = ParentAgent(session, ScriptedModel(parent_model))
            await parent.supervisor.subscribe(
                inject="{{ event.role }} failed: {{ event.tool }}",
                event={"kind": "tool_result", "success": False},
            )
            handle = await parent.plane.spawn_agent("coder", "run it")
            await parent.plane.wait_agent(handle.child_id)
            assert not parent.conversation.running  # both wait for the parent's next turn
            await parent.run("What happened?")
            live = parent.conversation.messages
            reborn = await ParentAgent.restore(session, ScriptedModel(parent_model))
            restored = reborn.conversation.messages
            reborn.close()
            parent.close()
    first = [m["content"] for m in calls[0] if m["role"] == "user"]
    # One model call, and it had everything: the injection and the child's
    # result, in the order they arrived, then the turn's own input.
    assert len(calls) == 1
    assert first[0] == "coder failed: run_command"
    assert first[1].startswith("Message Type: FINAL_ANSWER") and "gave up" in first[1]
    assert first[2] == "What happened?"
    # The same transcript as a parent rebuilt from the store.
    assert [(m["role"], m.get("content")) for m in live] == [
        (m["role"], m.get("content")) for m in restored
    ]
