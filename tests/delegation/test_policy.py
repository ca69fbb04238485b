"""The spawn policy: narrowing only, the same config on both transports.

A policy narrows tools (and a remote child on a real role server then cannot
use the removed tool), denies with a reason, turns the network off, confines
an in-process child to a subdirectory, and never widens: a tool the role
lacks is dropped, a bigger budget is ignored, the network cannot be turned
on, a model the role does not offer is refused. Only the model is scripted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.servers import role_server

from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.hooks import Deny
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.policy import Narrow, SpawnPolicy, SpawnRequest, load_policy_file
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError, SpawnRefusedError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.budgets import Budget
from a2a_orchestrator.runtime.events import Done, ToolResult
from a2a_orchestrator.runtime.factory import apply_child_config
from a2a_orchestrator.runtime.overrides import check_wire_overrides
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

WRITE = [
    {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "x"}}]},
    {"text": "tried to write"},
]


@asynccontextmanager
async def session_for(
    transport: str, workdir: Path, script: Any, policy: Any
) -> AsyncIterator[Session]:
    """A session with `policy` whose `coder` is in-process or on a real role server."""
    store = Store(workdir / ".a2a" / "orchestrator.db")
    model = ScriptedModel(script)
    try:
        if transport == "remote":
            async with role_server(workdir, script) as server:
                network = Network.of(AgentSpec(name="coder", role="coder", url=server.url))
                async with Session(
                    store, workdir=workdir, network=network, models=lambda n: model, policy=policy
                ) as opened:
                    yield opened
        else:
            network = Network.of(AgentSpec(name="coder", role="coder"))
            async with Session(
                store, workdir=workdir, network=network, models=lambda n: model, policy=policy
            ) as opened:
                yield opened
    finally:
        store.close()


@pytest.mark.parametrize("transport", ["local", "remote"])
async def test_a_policy_that_removes_a_tool_keeps_the_child_from_using_it(
    transport: str, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text(
        '[[rule]]\nagent = "coder"\ntools = ["read_file", "list_files", "grep"]\nnetwork = false\n'
    )
    policy = load_policy_file(policy_file)
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, WRITE, policy) as session:
            handle = await session.spawn(ChildConfig(role="coder", prompt="write out.txt"))
            result = await handle.result()
            record = await session.store.get_child(handle.child_id)
    [tool] = [e for e in handle.log if isinstance(e, ToolResult)]
    assert isinstance(result, Done)
    # The child (its role server, for a remote one) does not have the tool.
    assert not tool.success and "Unknown tool 'write_file'" in tool.output
    assert not (tmp_path / "out.txt").exists()
    # The narrowed config is the one stored (and the one sent over A2A).
    assert record is not None
    assert record.config["tools"] == ["read_file", "list_files", "grep"]
    assert record.config["network"] is False


async def test_a_policy_that_denies_refuses_the_spawn_with_its_reason(tmp_path: Path) -> None:
    def no_coders(request: SpawnRequest) -> Deny | None:
        return Deny("no coders today") if request.agent.role == "coder" else None

    with anyio.fail_after(20):
        async with session_for("local", tmp_path, WRITE, no_coders) as session:
            with pytest.raises(SpawnRefusedError, match="denied by policy: no coders today"):
                await session.spawn(ChildConfig(role="coder", prompt="go"))
            # Through the control plane, the refusal is the tool's answer.
            plane = ControlPlane(session)
            [answer] = await plane.agent([{"role": "coder", "prompt": "go"}])
            plane.close()
            stored = await session.store.list_children(session_id=session.id)
    assert answer["status"] == "error"
    assert answer["error"] == "Subagent spawn denied by policy: no coders today"
    assert stored == []


async def test_a_policy_file_can_deny(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[[rule]]\nagent = "coder"\ntransport = "local"\ndeny = "local coders off"\n')
    with anyio.fail_after(20):
        async with session_for("local", tmp_path, WRITE, load_policy_file(path)) as session:
            with pytest.raises(SpawnRefusedError, match="local coders off"):
                await session.spawn(ChildConfig(role="coder", prompt="go"))


async def test_a_policy_never_widens(tmp_path: Path) -> None:
    coder = find_role("coder")
    asked = ChildConfig(
        role="coder", prompt="go", tools=("read_file", "grep"), budget=Budget(tokens=100)
    )
    request = SpawnRequest(
        session_id="s",
        parent_id="",
        parent_role="",
        agent=AgentSpec(name="coder", role="coder"),
        config=asked,
    )
    widening = SpawnPolicy(
        [
            # Tools not asked for, one the role does not even have, and a
            # budget bigger than the child's own: all ignored.
            lambda r: Narrow(
                tools=("read_file", "run_command", "deploy"), budget=Budget(tokens=10**6)
            ),
        ]
    )
    narrowed = await widening.apply(request)
    assert narrowed.tools == ("read_file",)
    assert narrowed.budget == Budget(tokens=100)
    # The network cannot be turned on, in Python or in a file.
    with pytest.raises(ConfigError, match="only turn a child's network off"):
        Narrow(network=True)
    path = tmp_path / "policy.toml"
    path.write_text("[[rule]]\nnetwork = true\n")
    with pytest.raises(ConfigError, match=r"policy.toml: rule 1: .*network off"):
        load_policy_file(path)
    # A model the role does not offer is refused, never picked.
    with pytest.raises(ConfigError, match="model 'gpt-huge' is not one role 'coder' offers"):
        await SpawnPolicy([lambda r: Narrow(model="gpt-huge")]).apply(request)
    # And what a child's config can ask of a role server is narrowing too.
    with pytest.raises(ConfigError, match="'network': can only be false"):
        check_wire_overrides({"network": True}, coder, ())
    off = apply_child_config(
        coder.with_overrides(), check_wire_overrides({"network": False}, coder, ())
    )
    assert off.no_network and not off.sandbox_network


async def test_a_policy_confines_a_local_child_to_a_subdirectory(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    policy = SpawnPolicy([lambda r: Narrow(workdir="pkg")])
    script = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "x"}}]},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "../README.md"}}]},
        {"text": "done"},
    ]
    (tmp_path / "README.md").write_text("outside")
    with anyio.fail_after(20):
        async with session_for("local", tmp_path, script, policy) as session:
            handle = await session.spawn(ChildConfig(role="coder", prompt="write"))
            await handle.result()
    written, outside = [e for e in handle.log if isinstance(e, ToolResult)]
    assert written.success and (tmp_path / "pkg" / "out.txt").read_text() == "x"
    assert not (tmp_path / "out.txt").exists()
    assert not outside.success and "outside the work directory" in outside.output


async def test_a_remote_child_cannot_be_given_a_subdirectory(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    policy = SpawnPolicy([lambda r: Narrow(workdir="pkg")])
    with anyio.fail_after(20):
        async with session_for("remote", tmp_path, WRITE, policy) as session:
            with pytest.raises(ConfigError, match="is remote and works in its role server's own"):
                await session.spawn(ChildConfig(role="coder", prompt="go"))
            stored = await session.store.list_children(session_id=session.id)
    assert stored == []
