"""An orchestrator process with a small tree of in-process children, for the
test that usage totals stay exact across a crash (`test_budgets.py`).

Run as `python crash_budget.py STORE SESSION WORKDIR`: child `c1` (role coder)
finishes a turn of two model calls; then `c2`, spawned under `c1`, makes one
model call that starts a long command; when that call's events are stored it
prints READY and waits (to be killed with SIGKILL, which is the point).
Every model call reports a fixed usage (`STEP_USAGE`), so the test knows
exactly what the tree spent.
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

STEP_USAGE = {"input_tokens": 100, "output_tokens": 20}
LONG_COMMAND = "sleep 60.731"


def tree_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """c1 lists files, then answers; c2 runs a long command, then answers
    with what the tool said (after the crash: that it was interrupted)."""
    steps = sum(1 for m in messages if m["role"] == "assistant")
    task = next(m["content"] for m in messages if m["role"] == "user")
    if steps == 0:
        call = (
            {"name": "run_command", "arguments": {"command": LONG_COMMAND}}
            if task == "second"
            else {"name": "list_files", "arguments": {}}
        )
        return {"tool_calls": [call], "usage": STEP_USAGE}
    return {"text": f"{task} done", "usage": STEP_USAGE}


def network() -> Network:
    return Network.of(AgentSpec(name="coder", role="coder"))


async def main(store_path: str, session_id: str, workdir: str) -> None:
    model = ScriptedModel(tree_script)
    async with Session(
        Store(store_path),
        workdir=Path(workdir),
        network=network(),
        models=lambda name: model,
        session_id=session_id,
    ) as session:
        first = await session.spawn(ChildConfig(role="coder", prompt="first"), child_id="c1")
        await first.wait()
        second = await session.spawn(
            ChildConfig(role="coder", prompt="second"), child_id="c2", parent_id="c1", depth=2
        )
        # READY once the first model call's events (with its spend) are stored.
        while not any(event.kind == "tool_called" for event in second.log):
            await anyio.sleep(0.02)
        print("READY", flush=True)
        await second.wait()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:4])
