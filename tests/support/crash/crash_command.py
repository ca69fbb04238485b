"""An orchestrator process whose in-process child runs one shell command, for
the at-most-once tests and `bench/trials.py`.

Run as `python crash_command.py STORE SESSION WORKDIR COMMAND`: it spawns child
`c1` (role coder) whose scripted model runs COMMAND once, then answers with
the tool result it read; prints READY and waits for the child to end (or to be
killed with SIGKILL, which is the point).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.storage.store import Store


def command_script(command: str) -> Any:
    """Step 0 runs `command`; step 1 reports what the tool said."""

    def play(messages: list[dict[str, Any]]) -> dict[str, Any]:
        steps = sum(1 for m in messages if m["role"] == "assistant")
        if steps == 0:
            return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}
        results = [m["content"] for m in messages if m["role"] == "tool"]
        return {"text": "tool said: " + (results[-1] if results else "(nothing)")}

    return play


def network() -> Network:
    return Network.of(AgentSpec(name="coder", role="coder"))


async def main(store_path: str, session_id: str, workdir: str, command: str) -> None:
    model = ScriptedModel(command_script(command))
    async with Session(
        Store(store_path),
        workdir=Path(workdir),
        network=network(),
        models=lambda name: model,
        session_id=session_id,
    ) as session:
        child = await session.spawn(ChildConfig(role="coder", prompt="run it"), child_id="c1")
        print("READY", flush=True)
        await child.wait()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
