"""A session's usage is one sum, the same in every view, and counts the
parent agent's own model calls with its children's (issue 25, item 3).

A real orchestrator server on 127.0.0.1 runs a parent agent (delegate mode)
with an in-process coder child; the `status` and `children` commands are real
subprocesses on its store. Only the model is scripted: each call reports
1,000 input and 100 output tokens.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from support.messages import collect, user_message
from support.postgres import Postgres
from support.servers import a2a_client, network_up

from a2a_orchestrator.cli.defaults import NO_SIGNAL_EXIT
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.orchestrator.demo import prepare_workdir
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.runtime.records import RecordKind
from a2a_orchestrator.storage.store import ROOT_ID, Store
from a2a_orchestrator.storage.store_pg import PgStore

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]
CALL = {"input_tokens": 1000, "output_tokens": 100}


def network_script(messages: Sequence[Any]) -> dict[str, Any]:
    """The parent (its prompt names the agents it may delegate to) spawns a
    coder, waits for it, then answers: 3 calls. The coder answers at once: 1."""
    parent = "Agents you can delegate to" in str(messages[0].get("content", ""))
    if not parent:
        return {"text": "Implemented.\nTASK_DONE", "usage": CALL}
    if not any(m["role"] == "assistant" for m in messages):
        agents = [{"role": "coder", "prompt": "implement slugify"}]
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": agents}}], "usage": CALL}
    if any(m["role"] == "user" and "FINAL_ANSWER" in str(m["content"]) for m in messages):
        return {"text": "The coder implemented it.\nTASK_DONE", "usage": CALL}
    return {"tool_calls": [{"name": "agent_manage", "arguments": {}}], "usage": CALL}


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def tokens_of(cell: str) -> int:
    """`4400tok` (a `status`/`children` cell) as a number."""
    found = re.search(r"(\d+)tok", cell)
    assert found is not None, cell
    return int(found.group(1))


def metric_tokens(text: str) -> int:
    """The sum of `a2a_tokens_total` over its labels in a /metrics page."""
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("a2a_tokens_total{")
        )
    )


@pytest.mark.timeout(120)
async def test_a_parent_runs_usage_is_one_sum_in_every_view(tmp_path: Path) -> None:
    model = ScriptedModel(network_script)
    store_path = tmp_path / "orchestrator.db"
    with anyio.fail_after(90):
        async with (
            run_orchestrator_server(
                store_path=store_path,
                workdir=tmp_path,
                network=Network.of(AgentSpec(name="coder", role="coder")),
                models=lambda name: model,
                db=str(tmp_path / "orchestrator-tasks.db"),
            ) as server,
            a2a_client(server.url) as client,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            request = user_message("Implement slugify with a coder")
            request.message.metadata.update({MODE_KEY: "delegate"})
            _, events = await collect(client, request)
            assert isinstance(events[-1], Done), events[-1]
            store = Store(store_path)
            try:
                (session,) = await store.list_sessions()
                session_id = session["id"]
                own = await store.child_usage(session_id)
                total = await store.session_usage(session_id)
                (child,) = await store.list_children(session_id=session_id)
                delivered = await store.events(session_id, kinds=[RecordKind.SUBAGENT_RESULT])
            finally:
                store.close()
            api_sessions = (await http.get("/api/sessions")).json()["sessions"]
            api_usage = (await http.get(f"/api/sessions/{session_id}/usage")).json()
            api_children = (await http.get(f"/api/sessions/{session_id}/children")).json()
            page = (await http.get(f"/ui/sessions/{session_id}")).text
            listing = (await http.get("/ui")).text
            metrics = (await http.get("/metrics")).text
    # The run itself: the parent's 3 calls and the child's 1, 1,100 tokens each.
    assert own[ROOT_ID].model_calls == 3 and own[child.child_id].model_calls == 1
    assert (total.tokens, total.model_calls) == (4 * 1100, 4)
    # The A2A caller's answer: what the whole session spent in its turn.
    assert (events[-1].spent.tokens, events[-1].usage.input_tokens) == (4 * 1100, 4000)
    child_tokens = own[child.child_id].tokens

    status = cli("status", "--store", str(store_path), cwd=tmp_path)
    children = cli("children", session_id[:8], "--store", str(store_path), cwd=tmp_path)
    assert status.returncode == 0 and children.returncode == 0, status.stderr + children.stderr
    (status_row,) = [line for line in status.stdout.splitlines() if line.startswith(session_id)]
    lines = children.stdout.splitlines()
    (child_line,) = [line for line in lines if line.startswith(child.child_id)]
    (parent_line,) = [line for line in lines if line.startswith("parent agent")]
    (total_line,) = [line for line in lines if line.startswith("session total")]

    # The session's total: the same sum everywhere.
    totals = {
        "status": tokens_of(status_row),
        "children": tokens_of(total_line),
        "api list": sum(api_sessions[0]["usage"][k] for k in CALL),
        "api usage": sum(api_usage["usage"][k] for k in CALL),
        "web page": sum(map(int, re.findall(r'id="total">(\d+) / (\d+)<', page)[0])),
        "web list": int(re.findall(r'<td class="num">(\d+)</td>\s*</tr>', listing)[0]),
        "metrics": metric_tokens(metrics),
    }
    assert totals == dict.fromkeys(totals, total.tokens)
    # The parent's own calls: in `children` and at the root of the web tree.
    assert tokens_of(parent_line) == own[ROOT_ID].tokens == 3 * 1100
    assert sum(api_usage["parent"][k] for k in CALL) == 3 * 1100
    root_row = re.search(r'<tr data-child-id="" data-state="completed">(.*?)</tr>', page, re.S)
    assert root_row is not None and "parent agent" in root_row.group(1)
    assert "3000 / 300" in root_row.group(1)
    # The child's: `children`, the API, its web row and the FINAL_ANSWER its parent got.
    (api_child,) = api_children["children"]
    child_row = re.search(rf'<tr data-child-id="{child.child_id}".*?</tr>', page, re.S)
    assert child_row is not None
    (answer,) = delivered
    usage_line = re.search(r"Usage: (\d+) tokens", answer.payload["text"])
    assert usage_line is not None
    child_views = {
        "children": tokens_of(child_line),
        "api": sum(api_child["usage"][k] for k in CALL),
        "web row": sum(map(int, re.findall(r"(\d+) / (\d+)", child_row.group(0))[0])),
        "FINAL_ANSWER": int(usage_line.group(1)),
    }
    assert child_views == dict.fromkeys(child_views, child_tokens) and child_tokens == 1100


def cli_script(tmp_path: Path, turns: list[dict[str, Any]]) -> dict[str, str]:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(turns))
    return {"A2A_MODEL_SCRIPT": str(script)}


def test_run_parent_in_a_pipe_prints_signal_usage_and_tree(tmp_path: Path) -> None:
    # One script for every conversation: turn 0 spawns (the coder child
    # plays the same turn 0: `agent` is not its tool, its result says so),
    # turn 1 waits, turn 2 answers.
    agents = [{"role": "coder", "prompt": "implement slugify"}]
    env = cli_script(
        tmp_path,
        [
            {"tool_calls": [{"name": "agent", "arguments": {"agents": agents}}], "usage": CALL},
            {"tool_calls": [{"name": "agent_manage", "arguments": {}}], "usage": CALL},
            {"text": "All done.\nTASK_DONE", "usage": CALL},
        ],
    )
    result = cli("run", "Implement slugify", "--parent", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "\nsignal: TASK_DONE" in out
    usage = re.search(r"^usage: (\d+) tokens", out, re.M)
    assert usage is not None
    store = Store(tmp_path / ".a2a" / "orchestrator.db")
    try:
        (session,) = anyio.run(store.list_sessions)
        total = anyio.run(store.session_usage, session["id"])
        own = anyio.run(store.child_usage, session["id"])
    finally:
        store.close()
    # The printed usage is the session's, the parent's own calls among them.
    assert int(usage.group(1)) == total.tokens and own[ROOT_ID].model_calls == 3
    assert total.tokens > own[ROOT_ID].tokens
    # The final tree, drawn after the event lines: the coder child under the run.
    tree = out[out.rindex("orchestrator  session") :]
    assert "coder" in tree and "completed" in tree


def test_a_parent_answer_without_a_signal_is_no_signal(tmp_path: Path) -> None:
    env = cli_script(tmp_path, [{"text": "I looked at it; here is what I think.", "usage": CALL}])
    result = cli("run", "Look at slugify", "--parent", cwd=tmp_path, env=env)
    status = cli("status", cwd=tmp_path)
    assert result.returncode == NO_SIGNAL_EXIT == 4, result.stdout + result.stderr
    assert "\nsignal: no signal" in result.stdout and "usage: 1100 tokens" in result.stdout
    assert "no signal" in status.stdout and "TASK_DONE" not in status.stdout


async def test_a_store_from_before_counts_its_parent_agents_turns(tmp_path: Path) -> None:
    """A store written before the parent agent's turns were counted: opening
    it counts them (migration m009), once."""
    with anyio.fail_after(20):
        path = tmp_path / "orchestrator.db"
        store = Store(path)
        try:
            await store.create_session("s")
            spent = {"input_tokens": 1000, "output_tokens": 100, "model_calls": 1}
            await store.append_event("s", "done", {"text": "ok", "spent": spent}, uuid="root-done")
        finally:
            store.close()
        # As an earlier version left it: no row for the root's turn, m009 not applied.
        with sqlite3.connect(path) as db:
            db.execute("DELETE FROM turn_usage")
            db.execute("DELETE FROM _sqlite_migrations WHERE name = 'm009_root_usage'")
        before = sqlite3.connect(path).execute("SELECT count(*) FROM turn_usage").fetchone()
        totals = []
        for _ in range(2):
            store = Store(path)
            try:
                totals.append(await store.session_usage("s"))
            finally:
                store.close()
        assert before == (0,)
        assert [(t.tokens, t.model_calls) for t in totals] == [(1100, 1), (1100, 1)]


@pytest.mark.timeout(120)
async def test_a_pipeline_tasks_answer_reports_the_sessions_spend(tmp_path: Path) -> None:
    """A pipeline run over A2A (the default mode): its ending, sent when the
    run ends (not through the request's own events), reports the session's
    spend in that task as a parent's does: the passes' calls."""
    workdir = prepare_workdir(tmp_path / "project")
    with anyio.fail_after(90):
        async with AsyncExitStack() as stack:
            url = await network_up(stack, workdir)
            async with a2a_client(url) as client:
                _, events = await collect(client, user_message("Add slugify to textkit"))
    store = Store(tmp_path / "orchestrator.db")
    try:
        (session,) = await store.list_sessions()
        total = await store.session_usage(session["id"])
    finally:
        store.close()
    done = events[-1]
    assert isinstance(done, Done), done
    assert total.model_calls >= 3 and total.tokens > 0
    assert (done.spent.tokens, done.spent.model_calls) == (total.tokens, total.model_calls)
    assert done.usage.input_tokens == total.input_tokens


@pytest.mark.timeout(120)
async def test_a_postgresql_store_from_before_counts_its_parent_agents_turns_once(
    postgres: Postgres,
) -> None:
    """The same on PostgreSQL (migration m004), agreeing with SQLite: the
    root's turns counted once, a child's row (the live code's) left alone."""
    url = postgres.url(postgres.database())
    spent = {"input_tokens": 1000, "output_tokens": 100, "model_calls": 1, "seconds": 1.5}
    with anyio.fail_after(60):
        store = PgStore(url)
        try:
            await store.create_session("s")
            await store.append_event("s", "done", {"text": "ok", "spent": spent}, uuid="root")
            await store.append_event("s", "done", {"spent": spent}, child_id="c", uuid="child")
            # As an earlier version left it: no row for the root's turn, m004 not applied.
            await store._execute("DELETE FROM turn_usage WHERE child_id = ''")
            await store._execute("DELETE FROM a2a_migrations WHERE name = 'm004_root_usage'")
        finally:
            store.close()
        totals = []
        for _ in range(2):
            store = PgStore(url)
            try:
                totals.append(await store.child_usage("s"))
                last = await store.last_root_turn_end("s")  # what `outcome_of` reads
                assert last is not None and (last.uuid, last.payload["text"]) == ("root", "ok")
            finally:
                store.close()
    for own in totals:
        assert {k: (v.tokens, v.model_calls, v.seconds) for k, v in own.items()} == {
            ROOT_ID: (1100, 1, 1.5),
            "c": (1100, 1, 1.5),
        }


@pytest.mark.timeout(120)
async def test_two_tasks_at_once_in_one_session_report_each_call_once(tmp_path: Path) -> None:
    """Two A2A tasks in one context at the same time: their endings report
    the session's spend between them, each model call once (a caller adding
    them up counts what the session spent, not more)."""
    # Each parent turn is one call, slow enough that both tasks have started
    # before the first one ends.
    model = ScriptedModel(lambda messages: {"text": "Done.\nTASK_DONE", "usage": CALL, "delay": 1})
    context_id = "c0ffee" * 5 + "00"
    ends: list[Any] = []
    with anyio.fail_after(90):
        async with (
            run_orchestrator_server(
                store_path=tmp_path / "orchestrator.db",
                workdir=tmp_path,
                network=Network.of(AgentSpec(name="coder", role="coder")),
                models=lambda name: model,
                db=str(tmp_path / "orchestrator-tasks.db"),
            ) as server,
            a2a_client(server.url) as client,
        ):

            async def task(text: str) -> None:
                request = user_message(text, context_id=context_id)
                request.message.metadata.update({MODE_KEY: "delegate"})
                ends.append((await collect(client, request))[1][-1])

            async with anyio.create_task_group() as tg:
                tg.start_soon(task, "first")
                tg.start_soon(task, "second")
    store = Store(tmp_path / "orchestrator.db")
    try:
        total = await store.session_usage(context_id)
    finally:
        store.close()
    assert all(isinstance(end, Done) for end in ends), ends
    assert total.model_calls == 2
    assert sum(end.spent.tokens for end in ends) == total.tokens == 2 * 1100
