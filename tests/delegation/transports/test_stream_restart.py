"""A model stream cut mid-answer, whose retry answers in other words: the
message begins again, the run goes on.

The endpoint is a small Starlette app of this file's own, served by uvicorn on
127.0.0.1. It stands in for a real model endpoint (OpenAI, vLLM, Ollama) on
purpose: to an OpenAI-compatible client the model *is* an HTTP server, the
model is the one part a test may fake, and what is under test is a real
connection breaking off mid-stream and a sampling model's retry that never
repeats itself. Everything else is real: the CLI as a subprocess with the
endpoint configured as a user would (`A2A_MODEL_BASE_URL`, README "Models"),
a role server on loopback, SQLite stores, the web view over HTTP.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn
from a2a.types import GetTaskRequest, TaskState
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from support.messages import collect, user_message
from support.servers import a2a_client

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import RelayedEvent, Session
from a2a_orchestrator.models import OpenAIModel
from a2a_orchestrator.orchestrator.app import run_orchestrator_server
from a2a_orchestrator.protocol.decoding import transcript_from_history
from a2a_orchestrator.protocol.wire import EVENT_KEY
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    Done,
    MessageDelta,
    MessageRestarted,
    Started,
)
from a2a_orchestrator.runtime.render import RESTART_MARK
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]

WITHDRAWN = "Draft one: the plan is"
"""What every first attempt streams before its connection breaks off."""


class Cut(Exception):
    """Raised inside a streamed body: uvicorn then closes the connection,
    as a proxy or a crashed model server would."""


class CuttingEndpoint:
    """`POST /v1/chat/completions` that cuts every request's first answer
    mid-way and answers its resend whole, in other words.

    A request seen for the first time streams `WITHDRAWN` in two pieces a
    moment apart (so the runtime hands some of it on), then the connection
    breaks; the same request again (the client's retry) streams
    "<role> answer, second attempt." and TASK_DONE, finished and counted.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])]
        )

    async def complete(self, request: Request) -> StreamingResponse:
        body = await request.json()
        seen = body in self.requests
        self.requests.append(body)
        found = re.search(r"You are the (\w+)", body["messages"][0]["content"])
        role = found.group(1) if found else "agent"
        body_of = self._answer(role) if seen else self._cut()
        return StreamingResponse(body_of, media_type="text/event-stream")

    async def _cut(self) -> AsyncIterator[bytes]:
        first, rest = WITHDRAWN.split(": ")
        yield _data(_chunk({"role": "assistant", "content": first + ": "}))
        # Longer than the runtime's delta interval: the piece is handed on.
        await anyio.sleep(0.2)
        yield _data(_chunk({"content": rest}))
        await anyio.sleep(0.2)
        raise Cut("connection dropped mid-answer")

    async def _answer(self, role: str) -> AsyncIterator[bytes]:
        yield _data(_chunk({"role": "assistant", "content": f"{role} answer, "}))
        yield _data(_chunk({"content": "second attempt.\nTASK_DONE"}))
        yield _data(_chunk({}, "stop"))
        usage = {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}
        yield _data({**_chunk({}), "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"


def _chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }


def _data(chunk: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(chunk)}\n\n".encode()


def answer_of(role: str) -> str:
    return f"{role} answer, second attempt.\nTASK_DONE"


@asynccontextmanager
async def serving(endpoint: CuttingEndpoint) -> AsyncIterator[str]:
    """`endpoint` on a port bound up front; yields its `/v1` base URL."""
    # IPPROTO_TCP so asyncio sets TCP_NODELAY (see A2A-SDK-NOTES.md pitfall 10).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    # The cuts are deliberate; uvicorn would log each as an application error.
    server = uvicorn.Server(uvicorn.Config(endpoint.app, log_level="critical", lifespan="off"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            while not server.started:  # uvicorn exposes readiness only as a flag
                await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
            finally:
                server.should_exit = True
    finally:
        sock.close()


async def test_a_cut_stream_restarts_the_message_through_both_transports(tmp_path: Path) -> None:
    """The parent sees the same from a local and a remote child: some text,
    its withdrawal, then the retry's answer whole; the store and a stock
    A2A client's view of the role server keep only that answer."""
    endpoint = CuttingEndpoint()
    relayed: list[RelayedEvent] = []
    with anyio.fail_after(60):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=1) as model:
                async with run_role_server(
                    find_role("architect"), model, tmp_path, db=str(tmp_path / "role.db")
                ) as server:
                    network = Network.of(
                        AgentSpec(name="remote", role="architect", url=server.url),
                        AgentSpec(name="local", role="architect"),
                    )
                    store = Store(tmp_path / "o.db")
                    async with Session(
                        store, workdir=tmp_path, network=network, models=lambda name: model
                    ) as session:
                        outcomes = {}
                        async with session.relay() as relay:
                            for name in ("local", "remote"):
                                handle = await session.spawn(ChildConfig(role=name, prompt=name))
                                outcomes[name] = (handle, await handle.result())
                            while True:
                                try:
                                    relayed.append(relay.receive_nowait())
                                except anyio.WouldBlock:
                                    break
                        stored = await store.events(session.id)
                        remote_child = await store.get_child(outcomes["remote"][0].child_id)
                        assert remote_child is not None
                    async with a2a_client(server.url) as client:
                        # A stock client (it knows none of our kinds) still
                        # ends on the retry's answer, and can read why.
                        frames, _ = await collect(client, user_message("stock"))
                        remote_task = await client.get_task(
                            GetTaskRequest(id=remote_child.a2a_task_id)
                        )
    for name, (handle, outcome) in outcomes.items():
        assert isinstance(outcome, Done) and outcome.text == answer_of("architect"), name
        events = [r.event for r in relayed if r.child_id == handle.child_id]
        kinds = [type(e) for e in events if not isinstance(e, MessageDelta)]
        assert kinds == [Started, MessageRestarted, AssistantMessage, Done], name
        restart = next(n for n, e in enumerate(events) if isinstance(e, MessageRestarted))
        before = "".join(e.text for e in events[:restart] if isinstance(e, MessageDelta))
        after = "".join(e.text for e in events[restart:] if isinstance(e, MessageDelta))
        assert before and WITHDRAWN.startswith(before), (name, before)
        assert after == answer_of("architect"), name
        [withdrawal] = [e for e in events if isinstance(e, MessageRestarted)]
        assert url in withdrawal.reason and "mid-stream" in withdrawal.reason, name
        # Stored: the withdrawal and the finished answer, never the cut text.
        mine = [e for e in stored if e.child_id == handle.child_id]
        assert [e.payload["text"] for e in mine if e.kind == "message"] == [answer_of("architect")]
        assert [e.kind for e in mine].count("message_restarted") == 1
        assert not any(WITHDRAWN[:9] in json.dumps(e.payload) for e in mine), name
    # Two attempts for each of the three conversations, the retry the same request.
    assert len(endpoint.requests) == 6
    assert all(endpoint.requests[n] == endpoint.requests[n + 1] for n in (0, 2, 4))
    # The role server's transcript (what a follow-up turn is rebuilt from).
    rebuilt = transcript_from_history(remote_task, "")
    assert [m["content"] for m in rebuilt if m["role"] == "assistant"] == [answer_of("architect")]
    states = [f.status_update.status for f in frames if f.HasField("status_update")]
    assert states[-1].state == TaskState.TASK_STATE_COMPLETED
    [notice] = [s.message for s in states if s.message.metadata[EVENT_KEY] == "message_restarted"]
    assert "mid-stream" in notice.parts[0].text


async def test_run_ends_task_done_when_every_pass_is_cut_and_retried_differently(
    tmp_path: Path,
) -> None:
    """The finding: `run` failed ("the retry answered differently") on a
    normal network event. Here every pass's first answer is cut, the
    architect's on a role server over A2A: the run ends TASK_DONE, its events
    show each restart, and the store, the artifacts, every later prompt and
    the web view hold only the finished answers."""
    endpoint = CuttingEndpoint()
    db = tmp_path / "orchestrator.db"
    work = tmp_path / "work"
    work.mkdir()
    env = {
        **os.environ,
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
        "A2A_MODEL_SCRIPT": "",
        "A2A_MODEL_DEFAULT": "gpt-test",
        "A2A_MODEL_RETRIES": "2",
    }
    with anyio.fail_after(150):
        async with serving(endpoint) as url:
            env["A2A_MODEL_BASE_URL"] = url
            async with OpenAIModel("gpt-test", base_url=url, api_key=None) as model:
                async with run_role_server(
                    find_role("architect"), model, work, db=str(tmp_path / "role.db")
                ) as server:
                    env["A2A_AGENT_ARCHITECT_URL"] = server.url
                    result = await anyio.run_process(
                        [*CLI, "run", "Add a greeting", "--store", str(db)],
                        cwd=work,
                        env=env,
                        check=False,
                    )
        out = result.stdout.decode()
        assert result.returncode == 0, out + result.stderr.decode()
        store = Store(db)
        try:
            [session] = await store.list_sessions()
            children = {c.role: c for c in await store.list_children(session_id=session["id"])}
            stored = await store.events(session["id"])
        finally:
            store.close()
        async with (
            run_orchestrator_server(
                store_path=db,
                workdir=work,
                network=Network.of(),
                models=lambda name: model,
                db=str(tmp_path / "orchestrator-tasks.db"),
            ) as orchestrator,
            httpx.AsyncClient(base_url=orchestrator.url, timeout=10) as http,
        ):
            architect = children["architect"].child_id
            page = await http.get(f"/ui/sessions/{session['id']}/children/{architect}")
    assert "signal: TASK_DONE" in out
    assert children["architect"].transport == "remote"
    assert {children["coder"].transport, children["reviewer"].transport} == {"local"}
    for role, child in children.items():
        # A pipe shows one line per event: the withdrawal, then the marked answer.
        ident = f"[{role} {child.child_id[:6]} {child.transport}]"
        assert f"{ident} text withdrawn {RESTART_MARK}" in out, out
        mine = [e for e in stored if e.child_id == child.child_id]
        assert [e.kind for e in mine].count("message_restarted") == 1, role
        assert [e.payload["text"] for e in mine if e.kind == "message"] == [answer_of(role)]
        assert [e.payload["text"] for e in mine if e.kind == "done"] == [answer_of(role)]
        assert child.status == "completed" and child.result == answer_of(role)
    assert not any(WITHDRAWN[:9] in json.dumps(e.payload) for e in stored)
    [artifacts] = (work / ".a2a" / "tasks").iterdir()
    for role in children:
        assert (artifacts / f"{role}.txt").read_text().strip() == answer_of(role)
    # No later prompt carries withdrawn text: the coder got the architect's
    # answer, the reviewer both, each the retry's only.
    assert len(endpoint.requests) == 6
    prompts = json.dumps(endpoint.requests)
    assert WITHDRAWN[:9] not in prompts
    assert "architect answer, second attempt." in json.dumps(endpoint.requests[-1])
    assert page.status_code == 200
    assert RESTART_MARK in page.text and "mid-stream" in page.text
    assert WITHDRAWN[:9] not in page.text


async def test_a_caller_of_the_orchestrator_sees_each_withdrawal_as_a_child_event(
    tmp_path: Path,
) -> None:
    """`serve orchestrator` relays its children's events to its A2A caller
    (deltas aside): a restart is one of them, from a remote and a local pass."""
    endpoint = CuttingEndpoint()
    work = tmp_path / "work"
    work.mkdir()
    with anyio.fail_after(90):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None) as model:
                async with (
                    run_role_server(
                        find_role("architect"), model, work, db=str(tmp_path / "role.db")
                    ) as server,
                    run_orchestrator_server(
                        store_path=tmp_path / "orchestrator.db",
                        workdir=work,
                        network=Network.of(
                            AgentSpec(name="architect", role="architect", url=server.url),
                            AgentSpec(name="coder", role="coder"),
                            AgentSpec(name="reviewer", role="reviewer"),
                        ),
                        models=lambda name: model,
                        db=str(tmp_path / "orchestrator-tasks.db"),
                    ) as orchestrator,
                    a2a_client(orchestrator.url) as client,
                ):
                    responses, _ = await collect(client, user_message("Add a greeting"))
    statuses = [r.status_update.status for r in responses if r.HasField("status_update")]
    assert statuses[-1].state == TaskState.TASK_STATE_COMPLETED
    relayed = [
        s.message.parts[1].data.struct_value
        for s in statuses
        if EVENT_KEY in s.message.metadata and s.message.metadata[EVENT_KEY] == "child_event"
    ]
    withdrawals = {
        (event["transport"].string_value, event["role"].string_value)
        for event in (r.fields for r in relayed)
        if event["event"].struct_value.fields["kind"].string_value == "message_restarted"
    }
    assert withdrawals == {("remote", "architect"), ("local", "coder"), ("local", "reviewer")}
