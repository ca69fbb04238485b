"""A parent's tools answer every error as a tool result, and its turn goes on.

What a real model does all the time: an agent name that does not exist, a
model it may not pick, a child id it made up, a message to a child that was
just spawned (a remote one has no task yet), an operation a foreign peer
cannot do. Each is the tool's result, with a clear message; the parent's
turn ends by its own answer. Through both transports (remote children on a
real role server on 127.0.0.1); only the models are scripted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import TRANSPORTS, behaviour, session_for

from a2a_orchestrator.control.parent import ParentAgent
from a2a_orchestrator.control.plane import ControlPlane, control_tools
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ToolError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.runtime.roles import Role, find_role
from a2a_orchestrator.server.app import build_app, build_card, open_task_store
from a2a_orchestrator.server.executor import RoleExecutor
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools import Workspace

pytestmark = pytest.mark.anyio

CONTROL = (
    "agent",
    "agent_manage",
    "wait_agent",
    "send_message",
    "agent_abort",
    "spawn_agent",
    "supervisor",
)


def parent_role(*extra: str) -> Role:
    """The shipped orchestrator with every control tool (and `extra`)."""
    role = find_role("orchestrator")
    return role.with_overrides(
        tools=(*role.tools, *(t for t in CONTROL if t not in role.tools), *extra)
    )


def scripted_parent(calls: list[tuple[str, dict[str, Any]]]) -> ScriptedModel:
    """A parent that makes `calls` one per step (`$child` is the child id the
    last successful spawn answered), then says it is done."""

    def play(messages: list[dict[str, Any]]) -> dict[str, Any]:
        steps = sum(1 for m in messages if m["role"] == "assistant")
        if steps >= len(calls):  # children's results may add steps
            return {"text": "carried on\nTASK_DONE"}
        child = ""
        for message in messages:
            if message["role"] == "tool" and '"child_id"' in message["content"]:
                child = json.loads(message["content"]).get("child_id", child)
        name, arguments = calls[steps]
        filled = {k: child if v == "$child" else v for k, v in arguments.items()}
        return {"tool_calls": [{"name": name, "arguments": filled}]}

    return ScriptedModel(play)


def tool_results(parent: ParentAgent) -> list[str]:
    return [str(m["content"]) for m in parent.conversation.messages if m["role"] == "tool"]


UNKNOWN_AGENT = "Unknown agent or role 'ghostwriter'. Agents: coder. Roles: "


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_every_tool_error_is_a_result_and_the_turn_goes_on(
    transport: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("spawn_agent", {"name": "ghostwriter", "prompt": "x"}),
        ("supervisor", {"action": "spawn", "template": "ghostwriter", "task": "x"}),
        ("spawn_agent", {"prompt": "no name"}),
        ("wait_agent", {"child_id": "nope"}),
        ("supervisor", {"action": "pause", "pid": "nope"}),
        ("supervisor", {"action": "stop", "pid": "nope", "signal": "explode"}),
        ("spawn_agent", {"name": "coder", "prompt": "steer me"}),
        # At once: a remote child has no task yet; the steer is held until
        # the agent runs the turn, then read at its next step.
        ("send_message", {"child_id": "$child", "text": "please hurry"}),
        ("wait_agent", {"child_id": "$child"}),
    ]
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, behaviour) as session:
            parent = ParentAgent(session, scripted_parent(calls), role=parent_role())
            outcome = await parent.run("orchestrate")
            parent.close()
    results = tool_results(parent)
    assert isinstance(outcome, Done) and outcome.text == "carried on\nTASK_DONE"
    assert len(results) == len(calls)
    unknown, supervised, nameless, waited, paused, signal = results[:6]
    # The clear message itself, not a wrapper around an exception's name.
    assert unknown.startswith(UNKNOWN_AGENT) and supervised.startswith(UNKNOWN_AGENT)
    assert nameless == "spawn_agent: missing argument 'name'"
    assert waited == "Unknown subagent: nope"
    assert paused == "Unknown subagent: nope"
    assert signal == "signal must be one of pause, interrupt, terminate"
    sent = json.loads(results[7])
    assert sent["delivered"] and sent["mode"] == "steer"
    assert json.loads(results[8])["result"] == "saw: steer me | please hurry"
    # Expected refusals are answers, not failures worth a traceback.
    ours = [r for r in caplog.records if r.name.startswith("a2a_orchestrator")]
    assert not [r for r in ours if r.levelno >= logging.ERROR]


async def test_the_tools_raise_only_tool_errors(tmp_path: Path) -> None:
    """The `Tool` contract: a refusal is a `ToolError`, whatever raised it below."""
    with anyio.fail_after(20):
        async with session_for("local", tmp_path, behaviour) as session:
            tools = control_tools(ControlPlane(session))
            refusals = []
            for name, arguments in [
                ("spawn_agent", {"name": "ghostwriter", "prompt": "x"}),
                ("send_message", {"child_id": "nope", "text": "x"}),
                ("agent_abort", {}),
            ]:
                with pytest.raises(ToolError) as caught:
                    await tools[name].run(arguments)
                refusals.append(str(caught.value))
    assert refusals[0].startswith(UNKNOWN_AGENT)
    assert refusals[1:] == ["Unknown subagent: nope", "agent_abort: missing argument 'abort'"]


async def test_cancellation_still_ends_a_parent_blocked_in_a_tool(tmp_path: Path) -> None:
    """The tools contain every `Exception`; cancellation is not one, so an
    aborted parent stops inside `wait_agent` instead of reading its abort as
    a tool result and going on."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("spawn_agent", {"name": "coder", "prompt": "sleep long"}),
        ("wait_agent", {"child_id": "$child", "timeout_ms": 600_000}),
    ]
    with anyio.fail_after(30):
        async with session_for("local", tmp_path, behaviour) as session:
            parent = ParentAgent(session, scripted_parent(calls), role=parent_role())
            ended: list[Any] = []

            async def run() -> None:
                ended.append(await parent.run("wait for it"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                while len(parent.conversation.messages) < 5:  # waiting in wait_agent
                    await anyio.sleep(0.01)
                await anyio.sleep(0.1)
                parent.conversation.abort("aborted", "stopped by its owner")
            await parent.plane.stop_children()
            parent.close()
    (outcome,) = ended
    assert outcome.kind == "failed" and outcome.message == "stopped by its owner"
    assert not any("Cancelled" in result for result in tool_results(parent))


@asynccontextmanager
async def foreign_peer(workdir: Path) -> AsyncIterator[str]:
    """A role server whose card does not declare the control extension (any
    A2A agent someone else built): it runs tasks but takes no steering."""
    role = find_role("coder")
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = build_card(role, url)
    del card.capabilities.extensions[:]
    store = open_task_store(str(workdir / "foreign.db"))
    executor = RoleExecutor(role, ScriptedModel(behaviour), Workspace(workdir), task_store=store)
    async with anyio.create_task_group() as tg:
        await tg.start(serve, build_app(executor, card, store), sock)
        yield url
        tg.cancel_scope.cancel()


async def test_a_peer_without_the_control_extension_answers_the_tool(tmp_path: Path) -> None:
    calls: list[tuple[str, dict[str, Any]]] = [
        ("spawn_agent", {"name": "foreign", "prompt": "steer me"}),
        ("send_message", {"child_id": "$child", "text": "please hurry"}),
        ("supervisor", {"action": "pause", "pid": "$child"}),
        ("wait_agent", {"child_id": "$child"}),
    ]
    with anyio.fail_after(30):
        async with foreign_peer(tmp_path) as url:
            network = Network.of(AgentSpec(name="foreign", role="coder", url=url))
            async with Session(
                Store(tmp_path / ".a2a" / "o.db"), workdir=tmp_path, network=network
            ) as session:
                parent = ParentAgent(session, scripted_parent(calls), role=parent_role())
                outcome = await parent.run("orchestrate")
                rows = await session.store.events(session.id, kinds=["steer", "input"])
                parent.close()
    results = tool_results(parent)
    assert isinstance(outcome, Done)
    for result, action in ((results[1], "steer"), (results[2], "pause")):
        assert result == (
            f"agent at {url} does not support {action}: its card does not declare the "
            "control extension https://a2a-orchestrator.dev/extensions/control/v1"
        )
    # Not delivered, so not recorded as if it had been.
    assert [row.payload["text"] for row in rows if row.child_id] == ["steer me"]
    assert json.loads(results[3])["result"] == "saw: steer me"


# -- models a parent may choose ------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_parent_model_picks_only_offered_models(transport: str, tmp_path: Path) -> None:
    """A model name from a parent's model is as untrusted as one from the
    wire: never a script, only default, mini, the role's `models` and the
    operator's list. The operator's own `Session.spawn` is not narrowed."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("spawn_agent", {"name": "coder", "prompt": "a", "model": "scripted:/etc/passwd"}),
        ("spawn_agent", {"name": "coder", "prompt": "b", "model": "scripted"}),
        ("spawn_agent", {"name": "coder", "prompt": "c", "model": "gpt-unlisted"}),
        ("agent", {"agents": [{"role": "coder", "prompt": "d", "model": "scripted"}]}),
        ("spawn_agent", {"name": "coder", "prompt": "e", "model": "mini"}),
        ("spawn_agent", {"name": "coder", "prompt": "f", "model": "fast"}),
    ]
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, behaviour) as session:
            parent = ParentAgent(
                session, scripted_parent(calls), role=parent_role(), model_names=["fast"]
            )
            outcome = await parent.run("orchestrate")
            records = await session.store.list_children(session_id=session.id)
            spawned = sorted(record.config["prompt"] for record in records)
            if transport == "local":
                # The operator's own code may pick anything its settings
                # allow (a role server narrows a remote child on its side).
                operator = await session.spawn(
                    ChildConfig(role="coder", prompt="g", model="scripted")
                )
                assert isinstance(await operator.wait(), Done)
            parent.close()
    results = tool_results(parent)
    assert isinstance(outcome, Done)
    offered = "choose one of: default, fast, mini"
    assert results[0] == (
        f"child config field 'model': 'scripted:/etc/passwd' is not offered here; {offered}"
    )
    assert results[1] == f"child config field 'model': 'scripted' is not offered here; {offered}"
    assert results[2] == (
        f"child config field 'model': 'gpt-unlisted' is not offered here; {offered}"
    )
    (entry,) = json.loads(results[3])
    assert entry["status"] == "error" and "'scripted' is not offered here" in entry["error"]
    assert spawned == ["e", "f"]


# -- the parent's own sandbox ---------------------------------------------------------


async def test_a_parent_that_runs_commands_uses_the_sessions_sandbox(tmp_path: Path) -> None:
    """The parent's conversation was built without the session's sandbox: its
    commands ran under the environment's default, which does not hide the
    orchestrator's store (kept outside `.a2a/` here, which every sandbox
    hides) nor follow the session's --no-sandbox / --allow-network."""
    probe = "head -c 15 orchestrator.db; echo"
    calls: list[tuple[str, dict[str, Any]]] = [("run_command", {"command": probe})]
    network = Network.of(AgentSpec(name="coder", role="coder"))
    with anyio.fail_after(30):
        async with Session(
            Store(tmp_path / "orchestrator.db"), workdir=tmp_path, network=network
        ) as session:
            parent = ParentAgent(session, scripted_parent(calls), role=parent_role("run_command"))
            outcome = await parent.run("look around")
            parent.close()
    assert isinstance(outcome, Done)
    assert (tmp_path / "orchestrator.db").read_bytes().startswith(b"SQLite format 3")
    (result,) = tool_results(parent)
    assert "[exit code 0]" in result and "SQLite" not in result
