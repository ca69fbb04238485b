"""A parent orchestrator process for the crash-recovery tests.

Run as `python crash_parent.py STORE SESSION WORKDIR REMOTE_URL`: it spawns a
quick local child (which finishes), a slow local child and a slow remote
child, prints READY, and waits to be killed with SIGKILL.

With a fifth argument, `before` or `after`, it spawns one remote child
(`r1`) and stops itself (SIGSTOP) at its first message: `before` the request
goes out, or `after` it went out and the answer began, before a frame of it
is read (so the store has the child's ids but no task id). It prints STOPPED
just before stopping; the test then kills it with SIGKILL. The stop comes
from an httpx event hook on the client this process hands its session, not
from anything in the package: the window is made exact, not hoped for.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports import RemoteDelegate
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.storage.store import Store


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


def _stop_at_first_send() -> Any:
    stopped = False

    async def stop(request: httpx.Request) -> None:
        nonlocal stopped
        if stopped or b"SendStreamingMessage" not in request.content:
            return
        stopped = True
        print("STOPPED", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    return stop


async def spawn_window(
    store_path: str, session_id: str, workdir: str, remote_url: str, when: str
) -> None:
    stop = _stop_at_first_send()

    async def stop_after(response: httpx.Response) -> None:
        await stop(response.request)

    hooks: dict[str, list[Any]] = (
        {"request": [stop]} if when == "before" else {"response": [stop_after]}
    )
    store = Store(store_path)
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(30, read=600), event_hooks=hooks) as http,
        Session(
            store,
            workdir=Path(workdir),
            network=network(remote_url),
            session_id=session_id,
            remote=RemoteDelegate(http=http),
        ) as session,
    ):
        await session.spawn(ChildConfig(role="remote-coder", prompt="remote slow"), child_id="r1")
        await anyio.sleep_forever()


if __name__ == "__main__":
    if len(sys.argv) > 5:
        anyio.run(spawn_window, *sys.argv[1:6])
    else:
        anyio.run(main, *sys.argv[1:5])
