"""Stops are final, aborts are total, and a finished child is read from the store.

- `agent_abort` on an idle child ends it (Creo reports it `done`) instead of
  being a silent no-op; a running one ends `aborted`. Either way it refuses
  messages until it is resumed.
- The supervisor's `stop(signal="terminate")` is final too, across a
  restart, until `resume`.
- Waiting on a finished remote child answers from the store while its role
  server is down.

Through both transports where they apply (remote children on a real role
server on 127.0.0.1); only the models are scripted.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from support.servers import role_server
from support.sessions import TRANSPORTS, behaviour, plane_for, session_for

from a2a_orchestrator.control.plane import ControlPlane, control_tools
from a2a_orchestrator.control.supervisor import Supervisor, supervisor_tool
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ControlError, ToolError
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

TERMINATED = "was terminated; it takes no messages until it is resumed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_aborting_an_idle_child_ends_it_until_it_is_resumed(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path) as plane:
            child = await plane.spawn_agent("coder", "plain job")
            await plane.wait_agent(child.child_id)
            aborted = await plane.agent_abort([child.child_id])
            report = await plane.agent_manage()
            with pytest.raises(ControlError, match=TERMINATED):
                await plane.send_message(child.child_id, "are you there?")
            with pytest.raises(ToolError, match=TERMINATED):
                await control_tools(plane)["send_message"].run(
                    {"child_id": child.child_id, "text": "are you there?"}
                )
            # Its result stays what it was: the stop ends the child, not its work.
            waited = await plane.wait_agent(child.child_id)
            resumed = await plane.resume(child.child_id)
            again = await plane.send_message(child.child_id, "one more")
            answer = await plane.wait_agent(child.child_id)
    assert aborted == {"aborted": [child.child_id], "unknown": []}
    assert report == [
        {
            "child_id": child.child_id,
            "role": "coder",
            "status": "done",
            "message": "finished plain job",
        }
    ]
    assert waited["status"] == "completed" and waited["result"] == "finished plain job"
    assert resumed == {"child_id": child.child_id, "reinstated": True, "resumed": False}
    assert again["mode"] == "turn"
    assert answer["result"] == "finished plain job / one more"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_terminate_is_final_across_a_restart_until_resumed(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(40):
        async with session_for(transport, tmp_path, behaviour) as session:
            plane = ControlPlane(session)
            tool = supervisor_tool(Supervisor(plane))

            async def act(**arguments: object) -> dict[str, object]:
                return json.loads(await tool.run(arguments))

            pid = str((await act(action="spawn", template="coder", task="sleep awhile"))["pid"])
            while not session.children[pid].log:
                await anyio.sleep(0.01)
            stopped = await act(action="stop", pid=pid, signal="terminate")
            with pytest.raises(ToolError, match=TERMINATED):
                await act(action="send", pid=pid, content="wake up")
            plane.close()
            # Another process reopens the session: the stop still holds.
            async with Session(
                session.store,
                workdir=tmp_path,
                network=session.network,
                models=session.models,
                session_id=session.id,
            ) as later:
                plane = ControlPlane(later)
                tool = supervisor_tool(Supervisor(plane))
                with pytest.raises(ToolError, match=TERMINATED):
                    await act(action="send", pid=pid, content="wake up")
                resumed = await act(action="resume", pid=pid)
                sent = await act(action="send", pid=pid, content="wake up")
                answer = await plane.wait_agent(pid)
                plane.close()
    assert stopped == {"pid": pid, "signal": "terminate", "stopped": True}
    assert resumed == {"pid": pid, "paused": False, "terminated": False}
    assert sent["mode"] == "turn"
    assert answer["status"] == "completed"
    assert answer["result"] == "finished sleep awhile / wake up"


async def test_a_finished_remote_child_is_read_from_the_store_while_its_server_is_down(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / ".a2a" / "orchestrator.db")
    with anyio.fail_after(30):
        async with role_server(tmp_path, behaviour) as server:
            network = Network.of(AgentSpec(name="coder", role="coder", url=server.url))
            async with Session(store, workdir=tmp_path, network=network) as first:
                plane = ControlPlane(first)
                child = await plane.spawn_agent("coder", "plain job")
                await child.wait()
                plane.close()
        # The role server is gone; a later process of the session asks.
        async with Session(store, workdir=tmp_path, network=network, session_id=first.id) as later:
            plane = ControlPlane(later)
            waited = await plane.wait_agent(child.child_id)
            full = await plane.result(child.child_id)
            report = await plane.agent_manage()
            # What does need the agent fails as the tool's answer, naming it.
            with pytest.raises(ToolError, match=f"agent at {server.url} is unreachable"):
                await supervisor_tool(Supervisor(plane)).run(
                    {"action": "session", "pid": child.child_id}
                )
            plane.close()
    assert waited == {
        "child_id": child.child_id,
        "status": "completed",
        "result": "finished plain job",
    }
    assert full == "finished plain job"
    assert report == [
        {
            "child_id": child.child_id,
            "role": "coder",
            "status": "idle",
            "message": "finished plain job",
        }
    ]
