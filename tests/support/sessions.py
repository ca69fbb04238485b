"""Sessions through either transport, and the scripted children that the
delegation and control tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.delegation.base import ChildConfig, ChildHandle
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.models.base import ChatMessage
from a2a_orchestrator.runtime.events import ChildEvent, InputRequired
from a2a_orchestrator.storage.store import Store
from support.processes import running_with_args
from support.servers import role_server

TRANSPORTS = ["local", "remote"]


@asynccontextmanager
async def session_for(
    transport: str, workdir: Path, script: Any, **role_overrides: Any
) -> AsyncIterator[Session]:
    """A session whose `coder` agent is in-process or a real role server
    (`grpc`: one whose card prefers gRPC, tests/server/test_grpc.py)."""
    store = Store(workdir / ".a2a" / "orchestrator.db")
    model = ScriptedModel(script)
    if transport in ("remote", "grpc"):
        grpc_port = 0 if transport == "grpc" else None
        async with role_server(workdir, script, grpc_port=grpc_port, **role_overrides) as server:
            network = Network.of(AgentSpec(name="coder", role="coder", url=server.url))
            async with Session(
                store, workdir=workdir, network=network, models=lambda n: model
            ) as s:
                yield s
    else:
        network = Network.of(AgentSpec(name="coder", role="coder"))
        async with Session(store, workdir=workdir, network=network, models=lambda n: model) as s:
            yield s
    store.close()


def config(prompt: str, **kwargs: Any) -> ChildConfig:
    return ChildConfig(role="coder", prompt=prompt, **kwargs)


async def drain(handle: ChildHandle, start: int = 0) -> list[ChildEvent]:
    return [event async for event in handle.events(start)]


SCENARIOS: dict[str, Any] = {
    "success": [
        {
            "text": "Writing.",
            "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "A"}}],
        },
        {"text": "All done.\nTASK_DONE"},
    ],
    "failing_tool": [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "exit 3"}}]},
        {"text": "The command failed.\nTASK_FAILED"},
    ],
}


def ask_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    answers = [m["content"] for m in messages if m["role"] == "tool"]
    if not answers:
        return {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which name?"}}]}
    return {"text": f"Named it {answers[0]}.\nTASK_DONE"}


async def run_all_scenarios(transport: str, tmp_path: Path) -> dict[str, list[ChildEvent]]:
    """Every scenario through one transport; the events of each."""
    out: dict[str, list[ChildEvent]] = {}
    for name, script in SCENARIOS.items():
        work = tmp_path / name
        work.mkdir(parents=True)
        async with session_for(transport, work, script) as session:
            out[name] = await drain(await session.spawn(config(name)))

    work = tmp_path / "input_required"
    work.mkdir(parents=True)
    async with session_for(transport, work, ask_script) as session:
        handle = await session.spawn(config("name something"))
        first = await drain(handle)
        assert isinstance(first[-1], InputRequired) and handle.status == "input_required"
        await handle.send("Zed")
        out["input_required"] = await drain(handle)

    work = tmp_path / "cancel"
    work.mkdir(parents=True)
    script = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {"command": "echo ok > pid; exec sleep 60.291"},
                }
            ]
        }
    ]
    async with session_for(transport, work, script) as session:
        handle = await session.spawn(config("sleep"))
        while not (work / "pid").exists() or not (work / "pid").read_text().strip():
            await anyio.sleep(0.02)
        assert running_with_args("sleep", "60.291")
        assert await handle.cancel()
        out["cancel"] = await drain(handle)
        assert running_with_args("sleep", "60.291") == []
        assert (await session.store.get_child(handle.child_id)).reason == "aborted"  # type: ignore[union-attr]

    work = tmp_path / "max_turns"
    work.mkdir(parents=True)

    def forever(messages: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": "list_files", "arguments": {"pattern": "*.txt"}}]}

    async with session_for(transport, work, forever, max_turns=3) as session:
        out["max_turns"] = await drain(await session.spawn(config("loop", max_turns=3)))
    return out


def behaviour(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Every child's model: what it does depends on its task's first word."""
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    users = [m["content"] for m in messages if m["role"] == "user"]
    answers = [m["content"] for m in messages if m["role"] == "tool"]
    steps = sum(1 for m in messages if m["role"] == "assistant")
    kind = prompt.split()[0]
    if kind == "sleep" and steps == 0:
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 30"}}]}
    if kind == "slow":
        return {"text": f"finished {prompt}", "delay": 0.4}
    if kind == "ask":
        if not answers:
            return {
                "tool_calls": [{"name": "ask_parent", "arguments": {"question": "What color?"}}]
            }
        return {"text": f"color {answers[-1]}"}
    if kind == "fail":
        return {"error": "the model broke"}
    if kind == "empty":
        return {"text": ""}
    if kind == "long":
        return {"text": "word " * 3000 + "END"}
    if kind == "steer":
        if steps == 0:
            return {
                "delay": 0.6,
                "tool_calls": [{"name": "list_files", "arguments": {"pattern": "*.md"}}],
            }
        return {"text": "saw: " + " | ".join(users)}
    return {"text": f"finished {' / '.join(users)}"}


@asynccontextmanager
async def plane_for(transport: str, tmp_path: Path, **kwargs: Any) -> AsyncIterator[ControlPlane]:
    async with session_for(transport, tmp_path, behaviour) as session:
        plane = ControlPlane(session, **kwargs)
        try:
            yield plane
        finally:
            await plane.stop_children()
            plane.close()


class CountingScript:
    """The role server's model: a slow first step, then the answer; counts
    the conversations it started (one per run of the child's task)."""

    def __init__(self, delay: float = 1.5) -> None:
        self.delay = delay
        self.runs = 0

    def __call__(self, messages: Sequence[ChatMessage]) -> dict[str, Any]:
        if not any(m["role"] == "assistant" for m in messages):
            self.runs += 1
            return {
                "delay": self.delay,
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "r1.txt", "content": "r1"}}
                ],
            }
        return {"text": "remote done"}
