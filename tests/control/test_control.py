"""The children control plane, through both transports where it applies.

Remote children run on a real role server on 127.0.0.1; local ones in
process. One scripted model (the only fake) plays every child, choosing its
behaviour by the child's task.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from support.sessions import TRANSPORTS, behaviour, plane_for, session_for

from a2a_orchestrator.control.parent import ParentAgent
from a2a_orchestrator.control.plane import GATE_MESSAGE, ControlPlane, clamp_timeout
from a2a_orchestrator.delegation.hooks import Deny, Hooks, load_hook_file
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import SpawnRefusedError, UnknownChildError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.api import api_routes
from a2a_orchestrator.runtime.events import Done, Failed, InputRequired
from a2a_orchestrator.runtime.render import DID_NOT_FINISH, TRUNCATED, count_tokens
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio


def coder(prompt: str) -> dict[str, str]:
    return {"role": "coder", "prompt": prompt}


# 1. agent ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_agent_spawns_many_and_returns_at_once(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with plane_for(transport, tmp_path) as plane:
            spawned = await plane.agent([coder("slow one"), coder("slow two")])
            logs_at_return = [list(h.log) for h in plane.children()]
            results = [await plane.wait_agent(entry["child_id"]) for entry in spawned]
    assert [(e["role"], e["status"]) for e in spawned] == [("coder", "running")] * 2
    assert len({e["child_id"] for e in spawned}) == 2
    assert not any(e.kind == "done" for log in logs_at_return for e in log)
    assert [r["result"] for r in results] == ["finished slow one", "finished slow two"]


# 6. the gate, 5. cascading stop ---------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_gate_then_cascading_stop(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path) as plane:
            spawned = await plane.agent([coder(f"sleep {i}") for i in range(6)])
            with pytest.raises(SpawnRefusedError, match=GATE_MESSAGE):
                await plane.spawn_agent("coder", "sleep more")
            first = await plane.stop_children()
            second = await plane.stop_children()
            records = await plane.session.store.list_children(session_id=plane.session.id)
    assert [e["status"] for e in spawned] == ["running"] * 4 + ["error"] * 2
    assert [e["error"] for e in spawned[4:]] == [GATE_MESSAGE] * 2
    assert (first, second) == (4, 0)
    assert {(r.status, r.reason) for r in records} == {("failed", "aborted")}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_stop_is_two_then_zero_and_abort_by_role_or_id(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path) as plane:
            await plane.agent([coder("sleep a"), coder("sleep b")])
            assert (await plane.stop_children(), await plane.stop_children()) == (2, 0)
            one, two = await plane.agent([coder("sleep c"), coder("sleep d")])
            by_id = await plane.agent_abort([one["child_id"], "nobody"])
            by_role = await plane.agent_abort(["coder"])
            report = await plane.agent_manage()
    assert by_id == {"aborted": [one["child_id"]], "unknown": ["nobody"]}
    assert by_role == {"aborted": [two["child_id"]], "unknown": []}
    statuses = {e["child_id"]: e["status"] for e in report}
    assert statuses[one["child_id"]] == "done" and statuses[two["child_id"]] == "done"


# 2. agent_manage -------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_agent_manage_fsm(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path) as plane:
            ask, slow = await plane.agent([coder("ask something"), coder("slow work")])
            # BLOCK until a child finishes a turn; COLLECT gives the question.
            first = {e["child_id"]: e for e in await plane.agent_manage()}
            assert first[ask["child_id"]]["status"] == "idle"
            assert first[ask["child_id"]]["message"] == "What color?"
            # CHECK: nothing unreported and the slow child still running -> BLOCK again.
            second = {e["child_id"]: e for e in await plane.agent_manage()}
            assert second[slow["child_id"]] == {
                "child_id": slow["child_id"],
                "role": "coder",
                "status": "idle",
                "message": "finished slow work",
            }
            # MESSAGES to a child by id, then BLOCK until it answers.
            third = {e["child_id"]: e for e in await plane.agent_manage({ask["child_id"]: "blue"})}
            unknown = await plane.agent_manage({"ghost": "hello"})
    assert third[ask["child_id"]]["message"] == "color blue"
    assert unknown[0] == {"target": "ghost", "status": "error", "error": "Unknown subagent: ghost"}


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_agent_manage_resumes_children_whose_runner_died(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, behaviour) as session:
            # The runner dies with its session while the child works.
            async with Session(
                session.store,
                workdir=tmp_path,
                network=session.network,
                models=session.models,
                session_id="crashed",
            ) as first:
                (entry,) = await ControlPlane(first).agent([coder("slow resumable")])
                while not first.children[entry["child_id"]].log:
                    await anyio.sleep(0.01)
            record = await session.store.get_child(entry["child_id"])
            assert record is not None and record.status == "running"
            async with Session(
                session.store,
                workdir=tmp_path,
                network=session.network,
                models=session.models,
                session_id="crashed",
            ) as second:
                report = await ControlPlane(second).agent_manage()
    assert report == [
        {
            "child_id": entry["child_id"],
            "role": "coder",
            "status": "idle",
            "message": "finished slow resumable",
        }
    ]


# 3. wait_agent ---------------------------------------------------------------------


def test_wait_timeout_is_clamped() -> None:
    assert clamp_timeout(None) == 30.0
    assert clamp_timeout(1) == 10.0
    assert clamp_timeout(20_000) == 20.0
    assert clamp_timeout(10**9) == 3600.0


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_wait_agent(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path, wait_bounds_ms=(200, 3_600_000)) as plane:
            good = await plane.spawn_agent("coder", "plain job")
            bad = await plane.spawn_agent("coder", "fail now")
            sleeper = await plane.spawn_agent("coder", "sleep long")
            done = await plane.wait_agent(good.child_id)
            delivered = await plane.session.store.events(
                plane.session.id, kinds=["subagent_result"]
            )
            again = await plane.wait_agent(good.child_id)
            failed = await plane.wait_agent(bad.child_id)
            timed_out = await plane.wait_agent(sleeper.child_id, timeout_ms=300)
            still_running = sleeper.running
            with pytest.raises(UnknownChildError, match="Unknown subagent: nope"):
                await plane.wait_agent("nope")
    assert done == {
        "child_id": good.child_id,
        "status": "completed",
        "result": "finished plain job",
    }
    # Returned only once delivered: the parent's transcript already holds it.
    assert any(e.payload["child_id"] == good.child_id for e in delivered)
    assert again == done
    assert failed["status"] == "failed" and failed["result"].endswith(DID_NOT_FINISH)
    assert "the model broke" in failed["result"]
    assert timed_out == {
        "child_id": sleeper.child_id,
        "status": "timeout",
        "child_status": "running",
    }
    assert still_running


# 4. send_message -------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_send_message_steers_a_running_child_and_restarts_an_idle_one(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path) as plane:
            child = await plane.spawn_agent("coder", "steer me")
            while not child.log:
                await anyio.sleep(0.01)
            sent = await plane.send_message(child.child_id, "please hurry")
            steered = await plane.wait_agent(child.child_id)
            stored = await plane.session.store.events(plane.session.id, child_id=child.child_id)
            later = await plane.send_message(child.child_id, "one more thing")
            follow_up = await plane.wait_agent(child.child_id)
            with pytest.raises(UnknownChildError):
                await plane.send_message("ghost", "hello")
    assert sent["mode"] == "steer" and later["mode"] == "turn"
    # Absorbed at the next step boundary, after the task itself.
    assert steered["result"] == "saw: steer me | please hurry"
    kinds = [e.kind for e in stored]
    assert kinds.index("steer") < kinds.index("done")
    assert follow_up["status"] == "completed"


# 7. hooks --------------------------------------------------------------------------


async def test_hooks_from_python_and_from_configuration(tmp_path: Path) -> None:
    hooks = Hooks()
    seen: list[tuple[str, str]] = []
    hooks.on(
        "spawn.before",
        lambda info: Deny("reviewers are off today") if info.role == "reviewer" else None,
    )
    hooks.on("spawn.after", lambda info: seen.append(("after", info.child_id)))

    async def complete(info: Any) -> None:
        seen.append(("complete", f"{info.child_id}:{info.status}:{info.result}"))

    hooks.on("complete", complete)
    # A command hook, run in the hook file's directory with the payload on stdin.
    (tmp_path / "deny.py").write_text(
        "import json, sys\n"
        "info = json.load(sys.stdin)\n"
        "if info['role'] == 'architect':\n"
        "    print('no architects', file=sys.stderr)\n"
        "    sys.exit(3)\n"
    )
    hook_file = tmp_path / "hooks.toml"
    hook_file.write_text(f'[[hook]]\non = "spawn.before"\ncommand = "{sys.executable} deny.py"\n')
    load_hook_file(hook_file, hooks)
    with anyio.fail_after(20):
        async with plane_for("local", tmp_path, hooks=hooks) as plane:
            entries = await plane.agent(
                [
                    coder("plain"),
                    {"role": "reviewer", "prompt": "x"},
                    {"role": "architect", "prompt": "y"},
                ]
            )
            await plane.wait_agent(entries[0]["child_id"])
    assert entries[1] == {
        "role": "reviewer",
        "status": "error",
        "error": "Subagent spawn denied: reviewers are off today",
    }
    assert entries[2] == {
        "role": "architect",
        "status": "error",
        "error": "Subagent spawn denied: no architects",
    }
    child = entries[0]["child_id"]
    assert seen == [("after", child), ("complete", f"{child}:completed:finished plain")]


# 8. rendering ----------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_results_rendered_for_the_parent(transport: str, tmp_path: Path) -> None:
    inbox_texts: list[str] = []
    with anyio.fail_after(30):
        async with plane_for(transport, tmp_path, max_concurrent=8) as plane:

            class Inbox:
                def deliver(self, uuid: str, text: str) -> bool:
                    inbox_texts.append(text)
                    return True

            plane.inbox = Inbox()  # type: ignore[assignment]
            empty = await plane.spawn_agent("coder", "empty")
            long = await plane.spawn_agent("coder", "long")
            aborted = await plane.spawn_agent("coder", "sleep forever")
            for handle in (empty, long):
                await plane.wait_agent(handle.child_id)
            await plane.agent_abort([aborted.child_id])
            await plane.wait_agent(aborted.child_id)
            full = await plane.result(long.child_id)
    by_sender = {text.split("Sender: ")[1].split("\n")[0]: text for text in inbox_texts}
    header = (
        f"Message Type: FINAL_ANSWER\nTask name: {plane.session.id}\nSender: {empty.child_id}\n"
    )
    # Between the sender and the payload, what the child's subtree spent.
    usage, rest = by_sender[empty.child_id].removeprefix(header).split("\n", 1)
    assert re.fullmatch(
        r"Usage: \d+ tokens \(\d+ in, \d+ out\), 1 model calls, [\d.]+ s "
        r"\(this child and its children\)",
        usage,
    ), usage
    assert by_sender[empty.child_id].startswith(header)
    assert rest == "Payload:\n(subagent completed without output)"
    rendered_long = by_sender[long.child_id].split("Payload:\n", 1)[1]
    assert rendered_long.endswith(TRUNCATED) and count_tokens(rendered_long) <= 900
    assert full.endswith("END") and len(full) > len(rendered_long)
    assert by_sender[aborted.child_id].endswith("subagent was aborted\n\n" + DID_NOT_FINISH)


# 9. relay --------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_relay_tags_every_child_event(transport: str, tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with plane_for(transport, tmp_path) as plane, plane.session.relay() as relay:
            child = await plane.spawn_agent("coder", "ask please")
            relayed = []
            async for item in relay:
                relayed.append(item)
                if isinstance(item.event, InputRequired):
                    break
    assert {(r.child_id, r.role, r.transport) for r in relayed} == {
        (child.child_id, "coder", transport)
    }
    assert [r.event.kind for r in relayed] == ["started", "tool_called", "input_required"]


# 10. the parent agent, and the depth limit --------------------------------------


def parent_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        return {
            "tool_calls": [{"name": "agent", "arguments": {"agents": [coder("plain from parent")]}}]
        }
    if steps == 1:
        return {"tool_calls": [{"name": "agent_manage", "arguments": {}}]}
    finals = [
        m["content"] for m in messages if m["role"] == "user" and "FINAL_ANSWER" in m["content"]
    ]
    return {
        "text": f"children reported {len(finals)}: "
        + finals[-1].split("Payload:\n")[1]
        + "\nTASK_DONE"
    }


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_parent_agent_orchestrates_through_its_tools(
    transport: str, tmp_path: Path
) -> None:
    with anyio.fail_after(20):
        async with session_for(transport, tmp_path, behaviour) as session:
            parent = ParentAgent(session, ScriptedModel(parent_script))
            outcome = await parent.run("do the job")
            stored = [e.kind for e in await session.store.events(session.id) if e.child_id is None]
    assert isinstance(outcome, Done)
    assert outcome.text == "children reported 1: finished plain from parent\nTASK_DONE"
    assert stored[:2] == ["input", "started"] and stored[-1] == "done"
    assert "subagent_result" in stored


def nesting_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    prompt = next(m["content"] for m in messages if m["role"] == "user")
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if prompt.startswith("delegate") and steps == 0:
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": [coder("leaf")]}}]}
    if prompt.startswith("delegate") and steps == 1:
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if "Unknown tool" in results[-1]:
            return {"text": "no control tools here"}
        child_id = results[-1].split('"child_id": "')[1].split('"')[0]
        return {"tool_calls": [{"name": "wait_agent", "arguments": {"child_id": child_id}}]}
    if prompt.startswith("delegate"):
        # The wait's answer; the FINAL_ANSWER may have been absorbed after it.
        waited = [m["content"] for m in messages if m["role"] == "tool"][-1]
        return {"text": "grandchild said: " + waited.split('"result": "')[1].split('"')[0]}
    return {"text": f"leaf done at {prompt}"}


@pytest.mark.parametrize("max_depth", [1, 2])
async def test_children_get_control_tools_only_within_the_depth_limit(
    max_depth: int, tmp_path: Path
) -> None:
    model = ScriptedModel(nesting_script)
    network = Network.of(
        AgentSpec(name="coder", role="coder"), AgentSpec(name="orchestrator", role="orchestrator")
    )
    with anyio.fail_after(20):
        async with Session(
            Store(tmp_path / "o.db"), workdir=tmp_path, network=network, models=lambda n: model
        ) as session:
            plane = ControlPlane(session, max_depth=max_depth)
            child = await plane.spawn_agent("orchestrator", "delegate work")
            answer = await plane.wait_agent(child.child_id)
            depths = sorted(h.depth for h in session.children.values())
    if max_depth == 1:
        assert answer["result"] == "no control tools here" and depths == [1]
    else:
        assert answer["result"] == "grandchild said: leaf done at leaf" and depths == [1, 2]


# 11. the HTTP API ------------------------------------------------------------------


async def test_http_control_api(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with plane_for("local", tmp_path) as plane:
            planes = {plane.session.id: plane}
            app = Starlette(routes=api_routes(plane.session.store, lambda: planes))
            sock = bind_socket("127.0.0.1", 0)
            base = f"http://127.0.0.1:{sock.getsockname()[1]}"
            async with anyio.create_task_group() as tg:
                await tg.start(serve, app, sock)
                await plane.agent([coder("sleep x"), coder("sleep y")])
                sid = plane.session.id
                async with httpx.AsyncClient(base_url=base) as http:
                    stop1 = await http.post(f"/api/sessions/{sid}/subagents/stop")
                    stop2 = await http.post(f"/api/sessions/{sid}/subagents/stop")
                    children = (await http.get(f"/api/sessions/{sid}/children")).json()
                    page1 = (
                        await http.get(f"/api/sessions/{sid}/events", params={"limit": 3})
                    ).json()
                    page2 = (
                        await http.get(
                            f"/api/sessions/{sid}/events",
                            params={"after": page1["next"], "limit": 1000},
                        )
                    ).json()
                    missing = await http.post("/api/sessions/nope/subagents/stop")
                    missing_events = await http.get("/api/sessions/nope/events")
                    bad = await http.get(f"/api/sessions/{sid}/events", params={"limit": "lots"})
                tg.cancel_scope.cancel()
    assert stop1.json() == {"stopped": 2} and stop2.json() == {"stopped": 0}
    assert [c["status"] for c in children["children"]] == ["failed", "failed"]
    assert len(page1["events"]) == 3
    seqs = [e["seq"] for e in page1["events"] + page2["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]
    assert missing_events.status_code == 404
    assert bad.status_code == 400


async def test_unknown_role_in_agent_is_an_error_entry(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with plane_for("local", tmp_path) as plane:
            entries = await plane.agent([{"role": "ghostwriter", "prompt": "x"}, {"role": "coder"}])
    assert (
        entries[0]["status"] == "error"
        and "Unknown agent or role 'ghostwriter'" in entries[0]["error"]
    )
    assert entries[1]["error"] == "each agent needs a role and a non-empty prompt"
    assert isinstance(Failed(reason="error", message="x"), Failed)
