"""A parent orchestrator process for the crash-recovery tests.

Run as `python crash_parent.py STORE SESSION WORKDIR REMOTE_URL`: it spawns a
quick local child (which finishes), a slow local child and a slow remote
child, prints READY, and waits to be killed with SIGKILL.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

from a2a_orchestrator.delegation import ChildConfig
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.network import AgentSpec, Network
from a2a_orchestrator.session import Session
from a2a_orchestrator.store import Store


def local_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The local children's model: chosen by the child's task."""
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if prompt == "quick":
        return {"text": "quick done"}
    if steps == 0:
        command = "sleep 1.5 && echo ran >> local-runs.txt"
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}
    return {"text": "slow done"}


def network(remote_url: str) -> Network:
    return Network.of(
        AgentSpec(name="coder", role="coder"),
        AgentSpec(name="remote-coder", role="coder", url=remote_url),
    )


async def main(store_path: str, session_id: str, workdir: str, remote_url: str) -> None:
    model = ScriptedModel(local_script)
    store = Store(store_path)
    async with Session(
        store,
        workdir=Path(workdir),
        network=network(remote_url),
        models=lambda name: model,
        session_id=session_id,
    ) as session:
        quick = await session.spawn(ChildConfig(role="coder", prompt="quick"), child_id="quick")
        await quick.wait()
        await session.spawn(ChildConfig(role="coder", prompt="slow"), child_id="local-slow")
        await session.spawn(
            ChildConfig(role="remote-coder", prompt="remote slow"), child_id="remote-slow"
        )
        print("READY", flush=True)
        await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
