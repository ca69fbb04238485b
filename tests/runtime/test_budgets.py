"""Budgets down the tree, through both transports, and usage rolled up.

A child is stopped at the step where it would pass its budget, whichever
kind (tokens, model calls, wall time, cost), in-process and on a real role
server on 127.0.0.1 alike (the same runtime code); a grandchild gets at most
what its parent has left; a role server refuses a budget wider than its
role's and still caps one by its caller's own limits; and the store's totals
stay exact after a SIGKILL and a resume. Only the model is scripted, with a
fixed usage per call so the expected spend is known exactly.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from support.crash.crash_budget import STEP_USAGE, tree_script
from support.crash.crash_budget import network as crash_network
from support.processes import CRASH

from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.budgets import Budget, Price, PriceTable, Spend
from a2a_orchestrator.runtime.events import Done, Failed, ToolResult
from a2a_orchestrator.runtime.roles import Role, find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.server.auth.access import Access
from a2a_orchestrator.server.auth.callers import CallerFile, hash_token, new_token
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

CALL = Spend(input_tokens=100, output_tokens=20, model_calls=1)
"""What every scripted model call here spends (before cost)."""
PRICES = PriceTable({"scripted": Price(input=1.0, output=2.0)})
"""Per million tokens: a call costs (100 * 1 + 20 * 2) / 1e6 = 0.00014."""


SLOW = "(every model call takes 0.3 s)"


def endless(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A child that never stops by itself: one tool call per step."""
    return {
        "tool_calls": [{"name": "list_files", "arguments": {}}],
        "usage": STEP_USAGE,
        "delay": 0.3 if any(m.get("content") == SLOW for m in messages) else 0,
    }


@asynccontextmanager
async def serving(
    workdir: Path, script: Any, *, role: Role | None = None, access: Access | None = None
) -> AsyncIterator[str]:
    """A real role server on 127.0.0.1 (the operator's price table); its URL."""
    async with run_role_server(
        role or find_role("coder"),
        ScriptedModel(script),
        workdir,
        db=str(workdir / ".a2a" / "tasks.db"),
        access=access,
        prices=PRICES,
    ) as server:
        yield server.url


@asynccontextmanager
async def session_for(
    transport: str, workdir: Path, script: Any, **session: Any
) -> AsyncIterator[Session]:
    """A session whose `coder` is in-process or on a real role server."""
    store = Store(workdir / ".a2a" / "orchestrator.db")
    model = ScriptedModel(script)
    try:
        if transport == "remote":
            async with serving(workdir, script) as url:
                network = Network.of(AgentSpec(name="coder", role="coder", url=url))
                async with Session(
                    store, workdir=workdir, network=network, models=lambda n: model, **session
                ) as opened:
                    yield opened
        else:
            network = Network.of(AgentSpec(name="coder", role="coder"))
            async with Session(
                store, workdir=workdir, network=network, models=lambda n: model, **session
            ) as opened:
                yield opened
    finally:
        store.close()


# kind -> (the budget, the prompt, model calls made, tool calls run); wall
# time cuts a call short wherever the deadline falls, so its counts vary.
KINDS: dict[str, tuple[Budget, str, int | None, int | None]] = {
    # 2 calls spend 240 tokens; the 3rd passes 250: it is stopped right
    # after it, before its tool call runs.
    "tokens": (Budget(tokens=250), "go", 3, 2),
    # The 3rd call would pass 2: stopped before it.
    "model_calls": (Budget(model_calls=2), "go", 2, 2),
    # 0.00014 a call: the 3rd passes 0.0003.
    "cost": (Budget(cost=0.0003), "go", 3, 2),
    # 0.3 s a call: the deadline cuts the call it falls in.
    "seconds": (Budget(seconds=1.0), SLOW, None, None),
}


@pytest.mark.parametrize("transport", ["local", "remote"])
@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_child_is_stopped_by_each_budget_kind(
    transport: str, kind: str, tmp_path: Path
) -> None:
    budget, prompt, calls, tools = KINDS[kind]
    with anyio.fail_after(30):
        async with session_for(transport, tmp_path, endless, prices=PRICES) as session:
            handle = await session.spawn(
                ChildConfig(role="coder", prompt=prompt, max_turns=20, budget=budget)
            )
            result = await handle.result()
            events = list(handle.log)
            own = await session.store.child_usage(session.id)
            record = await session.store.get_child(handle.child_id)
    assert isinstance(result, Failed) and result.reason == "budget", result
    assert result.message.startswith(f"budget exhausted: {kind} "), result.message
    spent = result.spent
    if kind == "seconds":
        # Stopped at the deadline: every call that finished ran its tool.
        assert 1.0 <= spent.seconds < 3.0
        calls = tools = spent.model_calls
        assert calls >= 1
    assert sum(isinstance(e, ToolResult) for e in events) == tools
    assert (spent.model_calls, spent.tokens) == (calls, calls * CALL.tokens)
    assert spent.cost == pytest.approx(calls * 0.00014)
    # What was spent is in the message and in the store's per-turn row.
    assert f"{calls * CALL.tokens} tokens" in result.message
    assert own[handle.child_id].tokens == calls * CALL.tokens
    assert record is not None and (record.status, record.reason) == ("failed", "budget")
    assert record.config["budget"] == budget.as_dict()


async def test_a_budget_covers_every_turn_of_a_child(tmp_path: Path) -> None:
    # One call per turn; the budget is for the child's life, so the third
    # turn finds it used up and makes no model call at all.
    script = [
        {"text": "one", "usage": STEP_USAGE},
        {"text": "two", "usage": STEP_USAGE},
        {"text": "three", "usage": STEP_USAGE},
    ]
    with anyio.fail_after(20):
        async with session_for("remote", tmp_path, script) as session:
            handle = await session.spawn(
                ChildConfig(role="coder", prompt="a", budget=Budget(model_calls=2))
            )
            first = await handle.result()
            await handle.send("b")
            second = await handle.result()
            await handle.send("c")
            third = await handle.result()
    assert isinstance(first, Done) and isinstance(second, Done)
    assert isinstance(third, Failed) and third.reason == "budget"
    assert third.spent.model_calls == 0
    assert "model_calls 2 of 2" in third.message


def orchestrating(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The parent (orchestrator role) spawns a coder and waits for it; the
    coder never stops by itself."""
    if not str(messages[0].get("content", "")).startswith("You are the orchestrator"):
        return endless(messages)
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        item = {"role": "coder", "prompt": "build it"}
        return {
            "tool_calls": [{"name": "agent", "arguments": {"agents": [item]}}],
            "usage": STEP_USAGE,
        }
    child_id = json.loads(results[0])[0]["child_id"]
    return {
        "tool_calls": [{"name": "wait_agent", "arguments": {"child_id": child_id}}],
        "usage": STEP_USAGE,
    }


async def test_a_grandchild_gets_at_most_what_its_parent_has_left(tmp_path: Path) -> None:
    store = Store(tmp_path / "o.db")
    model = ScriptedModel(orchestrating)
    network = Network.of(
        AgentSpec(name="lead", role="orchestrator"), AgentSpec(name="coder", role="coder")
    )
    with anyio.fail_after(30):
        async with Session(
            store, workdir=tmp_path, network=network, models=lambda n: model
        ) as session:
            plane = ControlPlane(session, max_depth=2)
            lead = await session.spawn(
                ChildConfig(role="lead", prompt="lead it", budget=Budget(tokens=500))
            )
            outcome = await lead.result()
            children = await store.list_children(session_id=session.id, parent_id=lead.child_id)
            grandchild = session.children[children[0].child_id]
            below = await grandchild.result()
            subtree = await store.subtree_usage(session.id)
            plane.close()
    store.close()
    # The lead had spent one call (120 tokens) when it spawned: 380 left.
    assert children[0].config["budget"] == {"tokens": 380}
    assert isinstance(below, Failed) and below.reason == "budget"
    # 3 calls (360) fit in 380; the 4th passes it.
    assert below.spent.model_calls == 4 and below.spent.tokens == 480
    # The lead's budget covers its subtree: after the coder's 480 and its own
    # 240 it is over 500 and is stopped before its next call.
    assert isinstance(outcome, Failed) and outcome.reason == "budget", outcome
    assert "this child and its children spent 720 tokens" in outcome.message
    assert subtree[lead.child_id].tokens == 240 + 480
    assert subtree[grandchild.child_id].tokens == 480


async def test_a_role_server_refuses_a_budget_or_network_wider_than_its_role(
    tmp_path: Path,
) -> None:
    role = dataclasses.replace(find_role("coder"), budget=Budget(tokens=1000, model_calls=5))

    async def send(config: dict[str, Any]) -> dict[str, Any]:
        message = {
            "role": "ROLE_USER",
            "messageId": uuid.uuid4().hex,
            "parts": [{"text": "go"}],
            "metadata": {"a2a_orchestrator.config": config},
        }
        body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
        response = await http.post("/", json=body, headers={"A2A-Version": "1.0"})
        return dict(response.json())

    with anyio.fail_after(20):
        async with (
            serving(tmp_path, [{"text": "ok", "usage": STEP_USAGE}], role=role) as url,
            httpx.AsyncClient(base_url=url, timeout=10) as http,
        ):
            wider = await send({"budget": {"tokens": 5000}})
            network = await send({"network": True})
            bad = await send({"budget": {"tokens": -1}})
            narrower = await send({"budget": {"tokens": 500}, "network": False})
    assert wider["error"]["code"] == -32602
    assert "'budget.tokens'" in wider["error"]["message"]
    assert "maximum of 1000" in wider["error"]["message"]
    assert network["error"]["code"] == -32602 and "'network'" in network["error"]["message"]
    assert bad["error"]["code"] == -32602 and "'budget.tokens'" in bad["error"]["message"]
    assert narrower["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_callers_own_limit_on_the_server_still_caps_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The caller asks for a million tokens; its tokens_per_day on this server
    # is 300: the child is stopped where it passes 300, by the same runtime.
    token = new_token()
    callers = tmp_path / "callers.toml"
    callers.write_text(
        f'[callers.team]\ntoken_hash = "{hash_token(token)}"\ntokens_per_day = 300\n'
    )
    monkeypatch.setenv("TEAM_TOKEN", token)
    store = Store(tmp_path / "o.db")
    model = ScriptedModel(endless)
    with anyio.fail_after(30):
        async with serving(tmp_path, endless, access=Access(callers=CallerFile(callers))) as url:
            network = Network.of(
                AgentSpec(name="coder", role="coder", url=url, token_env="TEAM_TOKEN")
            )
            async with Session(
                store, workdir=tmp_path, network=network, models=lambda n: model
            ) as session:
                handle = await session.spawn(
                    ChildConfig(
                        role="coder", prompt="go", max_turns=20, budget=Budget(tokens=10**6)
                    )
                )
                result = await handle.result()
    store.close()
    assert isinstance(result, Failed) and result.reason == "budget", result
    assert "this caller may still use on this server today" in result.message
    assert result.spent.tokens == 360 and result.spent.model_calls == 3


async def test_usage_totals_are_exact_after_a_crash_and_a_resume(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    store_path = tmp_path / "o.db"
    process = subprocess.Popen(
        [sys.executable, str(CRASH / "crash_budget.py"), str(store_path), "s1", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with anyio.fail_after(30):
            assert process.stdout is not None
            line = await anyio.to_thread.run_sync(process.stdout.readline)
        assert line.strip() == "READY", line + (process.stderr.read() if process.stderr else "")
        process.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(process.wait)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    store = Store(store_path)
    # Before the resume: c1's finished turn is counted; c2's cut turn is not
    # a finished turn yet (its first call's spend is stored with its events).
    before = await store.session_usage("s1")
    model = ScriptedModel(tree_script)
    with anyio.fail_after(30):
        async with Session(
            store, workdir=workdir, network=crash_network(), models=lambda n: model, session_id="s1"
        ) as session:
            [handle] = await session.recover()
            result = await handle.result()
        # A second resume finds nothing to do and counts nothing again.
        async with Session(
            store, workdir=workdir, network=crash_network(), models=lambda n: model, session_id="s1"
        ) as session:
            assert await session.recover() == []
    events = await store.events("s1", kinds=["done"])
    # Storing a turn's end again (a replay after a re-attach) adds nothing.
    replay = await store.append_event(
        "s1", "done", events[-1].payload, child_id="c2", uuid=events[-1].uuid
    )
    total = await store.session_usage("s1")
    own = await store.child_usage("s1")
    subtree = await store.subtree_usage("s1")
    store.close()
    assert before == Spend(
        input_tokens=200, output_tokens=40, model_calls=2, seconds=before.seconds
    )
    assert isinstance(result, Done) and result.text == "second done"
    # c2's turn counts its call from before the crash and its call after it.
    assert (result.spent.model_calls, result.spent.tokens) == (2, 240)
    assert replay is None
    assert (total.model_calls, total.input_tokens, total.output_tokens) == (4, 400, 80)
    assert own["c2"].tokens == 240 and subtree["c1"].tokens == 480


def test_the_live_tree_shows_a_parents_subtree_tokens() -> None:
    from io import StringIO

    from a2a_orchestrator.delegation.session import RelayedEvent
    from a2a_orchestrator.models.base import Usage
    from a2a_orchestrator.orchestrator.view import LiveTree

    tree = LiveTree("t", out=StringIO())

    def done(child_id: str, parent_id: str, tokens: int) -> RelayedEvent:
        event = Done(text="ok", usage=Usage(input_tokens=tokens))
        return RelayedEvent(
            child_id=child_id,
            parent_id=parent_id,
            agent="coder",
            role="coder",
            transport="local",
            event=event,
        )

    for relayed in (
        done("lead01", "", 100),
        done("kid001", "lead01", 50),
        done("kid002", "kid001", 7),
    ):
        tree.update(relayed)
    lead, kid, grandkid = tree.lines()[1:]
    assert lead.endswith("100 tok (Σ 157 tok)")
    assert kid.endswith("50 tok (Σ 57 tok)")
    assert grandkid.endswith("7 tok")


async def test_the_http_api_reports_usage_per_session_child_and_subtree(tmp_path: Path) -> None:
    from starlette.applications import Starlette

    from a2a_orchestrator.orchestrator.api import api_routes
    from a2a_orchestrator.runtime.events import event_to_dict
    from a2a_orchestrator.storage.store import ChildRecord

    store = Store(tmp_path / "o.db")
    await store.create_session("s1")
    for child_id, parent_id in (("a", ""), ("b", "a")):
        await store.add_child(
            ChildRecord(
                child_id=child_id,
                session_id="s1",
                parent_id=parent_id,
                role="coder",
                status="completed",
                transport="local",
                trace_id="t",
                created_at=0.0,
            )
        )
        turn = Done(text="ok", spent=dataclasses.replace(CALL, seconds=0.5))
        await store.append_event(
            "s1", "done", event_to_dict(turn), child_id=child_id, uuid=turn.uuid
        )
    app = Starlette(routes=api_routes(store, dict))
    transport = httpx.ASGITransport(app=app)
    with anyio.fail_after(10):
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            usage = (await http.get("/api/sessions/s1/usage")).json()
            children = (await http.get("/api/sessions/s1/children")).json()["children"]
            sessions = (await http.get("/api/sessions")).json()["sessions"]
    store.close()
    assert usage["usage"]["input_tokens"] == 200 and usage["usage"]["model_calls"] == 2
    assert usage["children"]["a"]["output_tokens"] == 40
    by_id = {c["child_id"]: c for c in children}
    assert by_id["a"]["usage"]["input_tokens"] == 100
    assert by_id["a"]["subtree_usage"]["input_tokens"] == 200
    assert by_id["b"]["subtree_usage"] == by_id["b"]["usage"]
    assert sessions[0]["usage"]["seconds"] == 1.0
