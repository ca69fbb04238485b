"""Supervision: subscriptions, injections, pause/resume/stop, the observer, reactions.

Both transports where it applies: remote children on real role servers on
127.0.0.1 (pause, resume, interrupt and steering travel as the control
extension), local ones in-process. Only the models are scripted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import TRANSPORTS, session_for

from a2a_orchestrator.control.parent import ParentAgent
from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.control.reactions import Reactions, load_reactions
from a2a_orchestrator.control.supervisor import Supervisor
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError, ControlError, UnknownChildError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done, Failed

pytestmark = pytest.mark.anyio

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TESTS = (
    "import unittest\n\nfrom calc import add\n\n\n"
    "class AddTest(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
RUN_TESTS = "python3 -m unittest test_calc"


def project(workdir: Path) -> Path:
    (workdir / "calc.py").write_text(BUGGY)
    (workdir / "test_calc.py").write_text(TESTS)
    return workdir


def coder_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A coder that runs the tests, and fixes calc.py only once told how."""
    users = [m["content"] for m in messages if m["role"] == "user"]
    calls = [
        c["function"]
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    ]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    first = users[0]
    if first.startswith("sleep"):
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": "sleep 30"}}]}
    if first.startswith("remember"):
        return {"text": "you said: " + " | ".join(users)}
    if first.startswith("slow"):
        steps = sum(1 for m in messages if m["role"] == "assistant")
        if steps < 3:
            return {
                "delay": 0.3,
                "tool_calls": [{"name": "list_files", "arguments": {"pattern": "*.md"}}],
            }
        return {"text": "slow done"}
    if not calls:
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": RUN_TESTS}}]}
    guided = any("a + b" in u for u in users[1:])
    wrote = any(c["name"] == "write_file" for c in calls)
    if results and "[exit code 0]" in results[-1]:
        return {"text": "Fixed calc.add; the tests pass.\nTASK_DONE"}
    if guided and not wrote:
        return {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "calc.py", "content": FIXED}}
            ]
        }
    if wrote:
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": RUN_TESTS}}]}
    # Waiting for guidance: look around, a step at a time.
    return {"delay": 0.2, "tool_calls": [{"name": "read_file", "arguments": {"path": "calc.py"}}]}


def observer_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    last = messages[-1]
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    pid = next((json.loads(r)["pid"] for r in tool_results if '"pid"' in r), None)

    def supervise(**arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": "supervisor", "arguments": arguments}]}

    if last["role"] == "user" and last["content"].startswith("Coder tool failure"):
        return supervise(
            action="send",
            pid=pid,
            content="calc.add subtracts: return a + b, then rerun the tests.",
        )
    if last["role"] == "tool" and '"delivered"' in last["content"]:
        return {"text": "Told the coder what was wrong.\nTASK_DONE"}
    if pid is None:
        return supervise(action="spawn", template="coder", task="Make the tests pass.")
    if '"id"' not in last["content"]:
        return supervise(
            action="subscribe",
            child=pid,
            event={"kind": "tool_result", "success": False},
            inject="Coder tool failure in {{ event.tool }}: {{ event.content }}",
            pause_child=True,
            resume_after=True,
            run_turn=True,
            once=True,
        )
    return {"text": "Watching the coder."}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_observer_helps_a_failing_coder(transport: str, tmp_path: Path) -> None:
    workdir = project(tmp_path)
    with anyio.fail_after(40):
        async with session_for(transport, workdir, coder_script) as session:
            observer = ParentAgent(session, ScriptedModel(observer_script), role="observer")
            first = await observer.run("Fix the failing tests in calc.py.")
            (pid,) = [h.child_id for h in session.children.values()]
            coder = session.children[pid]
            outcome = await coder.result()
            while observer.conversation.running or not any(
                "Coder tool failure" in str(m.get("content"))
                for m in observer.conversation.messages
            ):
                await anyio.sleep(0.02)
            while observer.conversation.running:
                await anyio.sleep(0.02)
            stored = await session.store.events(session.id)
            observer.close()
    assert isinstance(first, Done) and first.text == "Watching the coder."
    assert isinstance(outcome, Done) and outcome.text.endswith("TASK_DONE")
    assert (workdir / "calc.py").read_text() == FIXED
    # The injection reached the observer, rendered, and started its turn.
    injected = [e for e in stored if e.kind == "inject"]
    assert len(injected) == 1 and injected[0].payload["text"].startswith(
        "Coder tool failure in run_command:"
    )
    assert "exit code 1" in injected[0].payload["text"]
    assert (
        observer.conversation.messages[-1]["content"] == "Told the coder what was wrong.\nTASK_DONE"
    )
    # The coder was paused for the injection and resumed right after.
    controls = [e.payload["action"] for e in stored if e.kind == "control" and e.child_id == pid]
    assert controls == ["pause", "resume"]
    # The guidance reached the coder as a steering message.
    assert any(e.kind == "steer" and "a + b" in e.payload["text"] for e in stored)


@asynccontextmanager
async def supervisor_for(
    transport: str, tmp_path: Path
) -> AsyncIterator[tuple[Session, Supervisor]]:
    async with session_for(transport, tmp_path, coder_script) as session:
        plane = ControlPlane(session)
        supervisor = Supervisor(plane)
        try:
            yield session, supervisor
        finally:
            await plane.stop_children()
            supervisor.close()
            plane.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_pause_resume_status_and_session(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with supervisor_for(transport, tmp_path) as (session, supervisor):
            pid = (await supervisor.act("spawn", {"template": "coder", "task": "slow steps"}))[
                "pid"
            ]
            handle = session.children[pid]
            while not any(e.kind == "tool_called" for e in handle.log):
                await anyio.sleep(0.01)
            await supervisor.act("pause", {"pid": pid})
            await anyio.sleep(0.8)  # longer than a step: a paused child takes none
            frozen = len(handle.log)
            paused = await supervisor.act("status", {"pid": pid})
            await anyio.sleep(0.5)
            assert len(handle.log) == frozen
            await supervisor.act("resume", {"pid": pid})
            result = await handle.result()
            status = await supervisor.act("status", {"pid": pid})
            history = await supervisor.act("session", {"pid": pid, "limit": 3})
    assert (
        paused["paused"] is True and paused["running"] is True and paused["transport"] == transport
    )
    assert isinstance(result, Done) and result.text == "slow done"
    assert status["status"] == "completed" and status["paused"] is False
    roles = [m["role"] for m in history["messages"]]
    assert (
        len(roles) == 3
        and roles[-1] == "assistant"
        and history["messages"][-1]["content"] == "slow done"
    )
    assert any(m.get("tool_call_id") for m in history["messages"])


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stop_signals(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with supervisor_for(transport, tmp_path) as (session, supervisor):
            kept = (
                await supervisor.act("spawn", {"template": "coder", "task": "sleep then remember"})
            )["pid"]
            gone = (await supervisor.act("spawn", {"template": "coder", "task": "sleep forever"}))[
                "pid"
            ]
            for pid in (kept, gone):
                while not any(e.kind == "tool_called" for e in session.children[pid].log):
                    await anyio.sleep(0.01)
            interrupted = await supervisor.act("stop", {"pid": kept})
            terminated = await supervisor.act("stop", {"pid": gone, "signal": "terminate"})
            kept_end = session.children[kept].last_terminal
            history = await supervisor.act("session", {"pid": kept})
            with pytest.raises(ControlError, match="signal must be one of"):
                await supervisor.act("stop", {"pid": kept, "signal": "kill"})
            gone_record = await session.store.get_child(gone)
    assert interrupted == {"pid": kept, "signal": "interrupt", "stopped": True}
    assert terminated == {"pid": gone, "signal": "terminate", "stopped": True}
    assert isinstance(kept_end, Failed) and kept_end.reason == "aborted"
    # Interrupt ends the turn but keeps the conversation.
    users = [m["content"] for m in history["messages"] if m["role"] == "user"]
    assert users == ["sleep then remember"]
    assert gone_record is not None and gone_record.reason == "aborted"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_subscriptions_select_inject_and_survive_a_restart(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, coder_script) as session:
            inbox: list[str] = []

            class Inbox:
                def steer(self, text: str) -> None:
                    inbox.append(text)

                def deliver(self, uuid: str, text: str) -> bool:
                    return True

            plane = ControlPlane(session, inbox=Inbox())  # type: ignore[arg-type]
            supervisor = Supervisor(plane)
            failing = await supervisor.subscribe(
                inject="{{ event.role }} {{ event.kind }} {{ event.tool }} ok={{ event.success }}",
                event={"kind": "tool_result", "success": False},
                once=True,
            )
            done = await supervisor.subscribe(
                inject="done: {{ event.content }}", event={"kind": "done"}, role="coder"
            )
            never = await supervisor.subscribe(
                inject="x", event={"kind": "message", "contains": "zebra"}
            )
            await supervisor.unsubscribe(never["id"])
            listed = await supervisor.subscriptions()
            pid = (await supervisor.spawn("coder", "remember this"))["pid"]
            await session.children[pid].result()
            pid2 = (await supervisor.spawn("coder", "run tests and wait"))["pid"]
            while not inbox or not inbox[-1].startswith("coder tool_result"):
                await anyio.sleep(0.02)
            await supervisor.act("stop", {"pid": pid2, "signal": "terminate"})
            after = await supervisor.subscriptions()
            supervisor.close()
            # A new supervisor of the same parent (a restart) finds what is stored.
            reloaded = Supervisor(plane)
            await reloaded.load()
            survivors = await reloaded.subscriptions()
            reloaded.close()
            plane.close()
            with pytest.raises(ControlError, match="no subscription"):
                await reloaded.unsubscribe("nope")
    assert [s["id"] for s in listed] == [failing["id"], done["id"]]
    assert inbox[0] == "done: you said: remember this"
    assert inbox[1] == "coder tool_result run_command ok=False"
    assert [s["id"] for s in after] == [done["id"]]  # `once` removed the first
    assert [s["id"] for s in survivors] == [done["id"]]
    assert survivors[0]["event"] == {"kind": "done"} and survivors[0]["role"] == "coder"


async def test_only_the_direct_parent_acts_on_a_child(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with supervisor_for("local", tmp_path) as (session, supervisor):
            other_plane = ControlPlane(session, parent_id="someone-else", depth=1)
            other = Supervisor(other_plane)
            pid = (await supervisor.spawn("coder", "remember me"))["pid"]
            await session.children[pid].result()
            with pytest.raises(ControlError, match="not a direct child"):
                await other.act("status", {"pid": pid})
            with pytest.raises(ControlError, match="not a direct child"):
                await other.act("send", {"pid": pid, "content": "hi"})
            with pytest.raises(UnknownChildError, match="Unknown subagent: ghost"):
                await supervisor.act("pause", {"pid": "ghost"})
            with pytest.raises(ControlError, match="unknown action"):
                await supervisor.act("explode", {})
            other.close()
            other_plane.close()


async def test_inject_templates_run_in_a_sandbox(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with supervisor_for("local", tmp_path) as (session, supervisor):
            with pytest.raises(ControlError, match="inject template"):
                await supervisor.subscribe(inject="{{ broken")
            with pytest.raises(ControlError, match="inject template"):
                await supervisor.subscribe(inject="{{ event.__class__.__mro__ }}")
            # Fine on an empty event at subscribe time; refused when it fires.
            await supervisor.subscribe(
                inject="{% if event.kind %}{{ event.content.__class__.__mro__ }}{% endif %}",
                event={"kind": "done"},
            )
            pid = (await supervisor.spawn("coder", "remember"))["pid"]
            result = await session.children[pid].result()
            await session.drain()  # the supervisor reacts beside the child
            stored = await session.store.events(session.id)
    injected = [e for e in stored if e.kind == "inject"]
    refused = [e.payload["error"] for e in stored if e.kind == "inject_failed"]
    # The sandbox refuses the attribute walk; the child's own work is unharmed.
    assert isinstance(result, Done)
    assert injected == [] and len(refused) == 1 and "unsafe" in refused[0]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reactions_inject_and_signal_without_a_parent_agent(
    transport: str, tmp_path: Path
) -> None:
    rules = tmp_path / "reactions.toml"
    rules.write_text(
        "[[reaction]]\n"
        'event = { kind = "tool_result", success = false }\n'
        'inject = "{{ event.role }} failed: {{ event.tool }}"\n'
        "\n"
        "[[reaction]]\n"
        'event = { kind = "tool_result", success = false }\n'
        'signal = "terminate"\n'
        "once = true\n"
    )
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, coder_script) as session:
            project(tmp_path)
            plane = ControlPlane(session)
            reactions = Reactions(plane, load_reactions(rules))
            handle = await plane.spawn_agent("coder", "run the tests")
            outcome = await handle.result()
            stored = await session.store.events(session.id)
            reactions.close()
            plane.close()
    assert isinstance(outcome, Failed) and outcome.reason == "aborted"
    injected = [e.payload["text"] for e in stored if e.kind == "inject"]
    assert injected == ["coder failed: run_command"]
    assert [e.payload["action"] for e in stored if e.kind == "control"] == ["terminate"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[reaction]]\nsignal = 'explode'\n", "field 'signal': must be one of"),
        ("[[reaction]]\ninject = 'x'\nsignal = 'pause'\n", "exactly one of 'inject' and 'signal'"),
        ("[[reaction]]\ninject = 'x'\nevent = { kind = 'sneeze' }\n", "kind must be one of"),
        ("[[reaction]]\ninject = '{{ oops'\n", "inject template"),
        ("[[reaction]]\ninject = 'x'\nwhen = 1\n", "field 'when': unknown field"),
    ],
)
def test_malformed_reactions(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "reactions.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_reactions(path)
    assert message in str(error.value) and "reaction 1" in str(error.value)
