"""A remote task that finishes while the child re-attaches ends the child from the task.

Re-attaching reads the task (GetTask), then follows it (SubscribeToTask).
When the task finishes between the two, a2a-sdk refuses the subscription
("is in terminal state"); the child must then read the task again and end
completed with its answer, once, not `lost`.

The window is made exact, not hoped for: a real role server on 127.0.0.1
(scripted model) runs a command that waits for a gate file, so its task is
WORKING when it is read; a real HTTP proxy in front of it (Starlette on
uvicorn, httpx upstream) holds the SubscribeToTask request until the test has
opened the gate and seen the task COMPLETED on the server, then passes it on.
The proxy is there only to hold that one request (the role server has no
hook between its answers); it changes no byte of any answer.

The other answers that mean "finished" (a2a-sdk 1.x's "already completed",
a 0.3 server's InvalidParams and its TaskNotFound for a task whose queue is
gone) and those that mean "gone" (TaskNotFound or HTTP 404 from GetTask, a
peer that deletes finished tasks) come from `RefusingPeer`, a real A2A peer
written here that answers as those servers do: the suite installs neither
a2a-sdk 0.3 nor such a peer. A child in push mode on a peer without push
notifications streams, and is followed the same way (the last test).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.types import GetTaskRequest, TaskState
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from support.crash.crash_parent import local_script, network
from support.processes import CRASH
from support.servers import CARD_PATH, a2a_client, role_server, serving
from support.waiting import wait_for

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports import RemoteDelegate
from a2a_orchestrator.delegation.transports.push_receiver import PushReceiver, PushRun
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.models.base import ChatMessage
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.server.app import agent_card
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

GATED = "while [ ! -e gate ]; do sleep 0.05; done; echo ran >> remote-runs.txt"
# Long enough that no silence probe reads the task while the proxy holds the
# subscription: the refusal, not a probe, must be what ends the turn here.
IDLE_PROBE = 120.0


def gated_script(messages: Sequence[ChatMessage]) -> dict[str, Any]:
    """The role server's model: a command that waits for the gate, then the answer."""
    if not any(m["role"] == "assistant" for m in messages):
        call = {"name": "run_command", "arguments": {"command": GATED}}
        return {"tool_calls": [call], "usage": {"input_tokens": 100, "output_tokens": 10}}
    return {"text": "remote done", "usage": {"input_tokens": 200, "output_tokens": 20}}


@dataclass
class HoldingProxy:
    """A real HTTP proxy in front of a role server (see the module docstring):
    holds each SubscribeToTask until `release` is set (`held` is set when one
    waits), and with `cut`, drops the first SendStreamingMessage stream after
    its first frame, the way a broken connection would."""

    upstream: str
    cut: bool = False
    url: str = ""
    calls: dict[str, int] = field(default_factory=dict)
    subscribe_answers: list[str] = field(default_factory=list)
    held: anyio.Event = field(default_factory=anyio.Event)
    release: anyio.Event = field(default_factory=anyio.Event)

    def app(self, http: httpx.AsyncClient) -> Starlette:
        async def card(request: Request) -> Response:
            answer = await http.get(self.upstream + CARD_PATH)
            return Response(
                answer.text.replace(self.upstream, self.url), media_type="application/json"
            )

        async def rpc(request: Request) -> Response:
            body = await request.body()
            method = json.loads(body)["method"]
            self.calls[method] = self.calls.get(method, 0) + 1
            if method == "SubscribeToTask":
                self.held.set()
                await self.release.wait()
            upstream = http.build_request(
                "POST", self.upstream + "/", content=body, headers=dict(request.headers)
            )
            answer = await http.send(upstream, stream=True)
            cut = self.cut and method == "SendStreamingMessage"
            self.cut = self.cut and not cut

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for line in answer.aiter_lines():
                        if method == "SubscribeToTask":
                            self.subscribe_answers.append(line)
                        yield (line + "\n").encode()
                        if cut and line.startswith("data:"):
                            yield b"\n"
                            # An error mid-body: uvicorn drops the connection.
                            raise ConnectionAbortedError("cut by the proxy")
                finally:
                    await answer.aclose()

            headers = {"content-type": answer.headers.get("content-type", "")}
            return StreamingResponse(relay(), status_code=answer.status_code, headers=headers)

        return Starlette(
            routes=[Route(CARD_PATH, card, methods=["GET"]), Route("/", rpc, methods=["POST"])]
        )

    async def finish_while_held(self, workdir: Path, server_url: str, task_id: str) -> None:
        """Once a subscription is held: let the task finish on the server,
        wait until it reads COMPLETED there, then let the subscription go."""
        await self.held.wait()
        (workdir / "gate").touch()
        async with a2a_client(server_url) as client:
            while True:
                task = await client.get_task(GetTaskRequest(id=task_id))
                if task.status.state == TaskState.TASK_STATE_COMPLETED:
                    break
                await anyio.sleep(0.05)
        self.release.set()


def assert_delivered_once(events: Sequence[Any], workdir: Path) -> None:
    """The task's answer was recorded once, and its command ran once."""
    kinds = [e.kind for e in events]
    uuids = [e.uuid for e in events]
    assert len(uuids) == len(set(uuids)), kinds
    assert kinds.count("started") == 1 and kinds.count("done") == 1, kinds
    assert kinds[-1] == "done", kinds
    assert (workdir / "remote-runs.txt").read_text() == "ran\n"


def assert_refused_as_finished(proxy: HoldingProxy) -> None:
    """The held subscription reached the server after the task completed and
    was refused so: the window the test is about was hit."""
    answer = "".join(proxy.subscribe_answers)
    assert "is in terminal state: TASK_STATE_COMPLETED" in answer, answer
    # Read before the subscription (WORKING), and again after its refusal.
    assert proxy.calls["SubscribeToTask"] == 1 and proxy.calls["GetTask"] >= 2, proxy.calls


async def test_a_task_that_finishes_during_a_reattach_after_a_cut_stream_completes(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "o.db")
    with anyio.fail_after(60):
        async with (
            role_server(tmp_path, gated_script, db=tmp_path / "role.db") as server,
            httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as http,
        ):
            proxy = HoldingProxy(server.url, cut=True)
            async with serving(proxy.app(http)) as url:
                proxy.url = url
                network = Network.of(AgentSpec(name="peer", role="coder", url=url))
                async with (
                    RemoteDelegate(idle_probe=IDLE_PROBE) as remote,
                    Session(store, workdir=tmp_path, network=network, remote=remote) as session,
                ):
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work"), child_id="c1"
                    )
                    await proxy.held.wait()
                    await proxy.finish_while_held(tmp_path, server.url, handle.run.task_id)
                    result = await handle.result()
    record = await store.get_child("c1")
    events = await store.events(session.id, child_id="c1")
    store.close()
    assert isinstance(result, Done) and result.text == "remote done", result
    assert not proxy.cut  # the first stream was cut mid-turn
    assert_refused_as_finished(proxy)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (300, 30)
    assert record is not None and record.status == "completed"
    assert record.result == "remote done"
    assert_delivered_once(events, tmp_path)


async def test_a_task_that_finishes_during_recovery_completes(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    store_path = tmp_path / "orchestrator.db"
    with anyio.fail_after(90):
        async with (
            role_server(workdir, gated_script, db=tmp_path / "role.db") as server,
            httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as http,
        ):
            proxy = HoldingProxy(server.url)
            async with serving(proxy.app(http)) as url:
                proxy.url = url
                # A real orchestrator process (tests/support/crash/crash_parent.py), killed
                # with SIGKILL while its remote child's task waits at the gate.
                args = [str(CRASH / "crash_parent.py"), str(store_path), "s1", str(workdir), url]
                parent = subprocess.Popen(
                    [sys.executable, *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                store = Store(store_path)
                try:
                    assert parent.stdout is not None
                    line = await anyio.to_thread.run_sync(parent.stdout.readline)
                    assert line.strip() == "READY", line + (
                        parent.stderr.read() if parent.stderr else ""
                    )

                    async def remote_underway() -> bool:
                        record = await store.get_child("remote-slow")
                        return record is not None and bool(record.a2a_task_id)

                    await wait_for(remote_underway)
                finally:
                    parent.send_signal(signal.SIGKILL)
                    await anyio.to_thread.run_sync(parent.wait)
                record = await store.get_child("remote-slow")
                assert record is not None and record.status == "running"
                model = ScriptedModel(local_script)
                async with (
                    RemoteDelegate(idle_probe=IDLE_PROBE) as remote,
                    Session(
                        store,
                        workdir=workdir,
                        network=network(url),
                        models=lambda n: model,
                        session_id="s1",
                        remote=remote,
                    ) as session,
                ):
                    recovered = {h.child_id: h for h in await session.recover()}
                    await proxy.finish_while_held(workdir, server.url, record.a2a_task_id)
                    result = await recovered["remote-slow"].result()
                    for handle in recovered.values():
                        await handle.result()
            after = await store.get_child("remote-slow")
            events = await store.events("s1", child_id="remote-slow")
            store.close()
    assert isinstance(result, Done) and result.text == "remote done", result
    assert_refused_as_finished(proxy)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (300, 30)
    assert after is not None and after.status == "completed" and after.result == "remote done"
    assert_delivered_once(events, workdir)


# -- what other peers answer: "finished" or "gone" ------------------------------

CARD_0_3 = {
    "capabilities": {"streaming": True},
    "defaultInputModes": ["text/plain"],
    "defaultOutputModes": ["text/plain"],
    "description": "Refuses to be followed.",
    "name": "refusing",
    "preferredTransport": "JSONRPC",
    "protocolVersion": "0.3.0",
    "skills": [{"description": "Works", "id": "work", "name": "work", "tags": ["work"]}],
    "version": "1.0.0",
}
METHODS = {
    "1.0": ("SendStreamingMessage", "GetTask", "SubscribeToTask"),
    "0.3": ("message/stream", "tasks/get", "tasks/resubscribe"),
}
ANSWER = "finished while refused"


@dataclass
class RefusingPeer:
    """A real A2A peer (Starlette on uvicorn) standing for a server we do not
    install (a2a-sdk 0.3, a peer that deletes finished tasks; see the module
    docstring). Its stream gives the task WORKING and ends without a
    terminal frame (a broken stream: the child re-attaches). GetTask reads
    it WORKING; the subscription is refused with `refusal` (a JSON-RPC error
    object, or an HTTP status), the task finishing meanwhile; from then on
    GetTask answers `after`: "completed" (the task, with its answer as an
    artifact), "working" (still), "not-found" (TaskNotFound), or "http-404"."""

    refusal: dict[str, Any] | int
    after: str
    dialect: str = "1.0"
    url: str = ""
    refused: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    message: dict[str, Any] = field(default_factory=dict)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(CARD_PATH, self.card, methods=["GET"]),
                Route("/", self.rpc, methods=["POST"]),
            ]
        )

    async def card(self, request: Request) -> Response:
        if self.dialect == "0.3":
            return JSONResponse({**CARD_0_3, "url": self.url})
        card = agent_card(name="refusing", description="refuses", url=self.url, skills=[])
        return JSONResponse(MessageToDict(card))

    async def rpc(self, request: Request) -> Response:
        body = await request.json()
        method, rpc_id = body["method"], body["id"]
        self.calls[method] = self.calls.get(method, 0) + 1
        send, get, subscribe = METHODS[self.dialect]
        if method == send:
            self.message = body["params"]["message"]
            frame = self._task("working")
            if self.dialect == "1.0":
                frame = {"task": frame}
            return StreamingResponse(iter([_sse(frame, rpc_id)]), media_type="text/event-stream")
        if method == subscribe:
            self.refused = True
            if isinstance(self.refusal, int):
                return JSONResponse({"error": "no such task"}, status_code=self.refusal)
            error = {"jsonrpc": "2.0", "id": rpc_id, "error": self.refusal}
            if self.dialect == "0.3":
                # A 0.3 server raises inside its event stream: an SSE event.
                data = f"data: {json.dumps(error)}\n\n"
                return StreamingResponse(iter([data]), media_type="text/event-stream")
            return JSONResponse(error)
        if method == get:
            state = self.after if self.refused else "working"
            if state == "http-404":
                return JSONResponse({"error": "no such task"}, status_code=404)
            if state == "not-found":
                error = {"code": -32001, "message": "Task not found"}
                return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error})
            return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": self._task(state)})
        error = {"code": -32601, "message": f"no method {method}"}
        return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error})

    def _task(self, state: str) -> dict[str, Any]:
        context = self.message.get("contextId", "ctx")
        if self.dialect == "0.3":
            task: dict[str, Any] = {
                "kind": "task",
                "id": "t1",
                "contextId": context,
                "status": {"state": state},
                "history": [self.message],
            }
            if state == "completed":
                task["artifacts"] = [
                    {"artifactId": "a1", "parts": [{"kind": "text", "text": ANSWER}]}
                ]
            return task
        task = {
            "id": "t1",
            "contextId": context,
            "status": {"state": f"TASK_STATE_{state.upper()}"},
            "history": [self.message],
        }
        if state == "completed":
            task["artifacts"] = [{"artifactId": "a1", "parts": [{"text": ANSWER}]}]
        return task


def _sse(result: Any, rpc_id: Any) -> str:
    return f"data: {json.dumps({'jsonrpc': '2.0', 'id': rpc_id, 'result': result})}\n\n"


FINISHED = {
    "1.x: is in terminal state": (
        "1.0",
        {"code": -32004, "message": "Task t1 is in terminal state: TASK_STATE_COMPLETED"},
    ),
    "1.x: is already completed": (
        "1.0",
        {"code": -32004, "message": "Task t1 is already completed."},
    ),
    "0.3: is in terminal state": (
        "0.3",
        {"code": -32602, "message": "Task t1 is in terminal state: completed"},
    ),
    # A 0.3 server whose task's queue is gone (it finished since the read).
    "0.3: task not found": ("0.3", {"code": -32001, "message": "Task not found"}),
}


async def _delegate_to(
    peer: RefusingPeer, tmp_path: Path, *, push: bool = False
) -> tuple[Any, Any, list[Any]]:
    """One child on `peer`, to its end; `push`: the agent is in push mode
    (a webhook endpoint serves nowhere: a peer without push never posts)."""
    store = Store(tmp_path / "o.db")
    receiver = PushReceiver(store, "http://127.0.0.1:9") if push else None
    with anyio.fail_after(30):
        async with serving(peer.app()) as url:
            peer.url = url
            network = Network.of(AgentSpec(name="peer", role="coder", url=url, push=push))
            async with (
                RemoteDelegate(idle_probe=IDLE_PROBE, lost_after=5.0, push=receiver) as remote,
                Session(store, workdir=tmp_path, network=network, remote=remote) as session,
            ):
                handle = await session.spawn(ChildConfig(role="peer", prompt="work"), child_id="c1")
                assert isinstance(handle.run, PushRun) == push
                result = await handle.result()
    record = await store.get_child("c1")
    events = await store.events(session.id, child_id="c1")
    store.close()
    return result, record, events


@pytest.mark.parametrize("answer", list(FINISHED))
async def test_a_follow_refused_as_finished_ends_the_child_from_the_task(
    answer: str, tmp_path: Path
) -> None:
    dialect, refusal = FINISHED[answer]
    peer = RefusingPeer(refusal, after="completed", dialect=dialect)
    result, record, events = await _delegate_to(peer, tmp_path)
    assert isinstance(result, Done) and result.text == ANSWER, result
    assert record is not None and record.status == "completed" and record.result == ANSWER
    assert [e.kind for e in events].count("done") == 1
    _, get, subscribe = METHODS[dialect]
    assert peer.calls[subscribe] == 1 and peer.calls[get] == 2, peer.calls


GONE = {
    # A peer that deletes finished tasks: its answer cannot be read back.
    "TaskNotFound": ({"code": -32001, "message": "Task not found"}, "not-found", "Task not found"),
    "HTTP 404": (404, "http-404", "HTTP 404"),
    # Refused (the queue of a task nobody runs any more, after a restart) and
    # read as running: nothing will finish it.
    "refused, still working": (
        {"code": -32001, "message": "Task not found"},
        "working",
        "(GetTask reads it TASK_STATE_WORKING)",
    ),
    # Refused as finished, yet read as running: the agent contradicts itself.
    "finished, yet working": (
        {"code": -32004, "message": "Task t1 is in terminal state: TASK_STATE_COMPLETED"},
        "working",
        "refused to follow the task as finished",
    ),
}


@pytest.mark.parametrize("answer", list(GONE))
async def test_a_task_gone_after_a_refused_follow_is_lost(answer: str, tmp_path: Path) -> None:
    refusal, after, words = GONE[answer]
    peer = RefusingPeer(refusal, after=after)
    result, record, events = await _delegate_to(peer, tmp_path)
    assert isinstance(result, Failed) and result.reason == "lost", result
    assert words in result.message, result.message
    assert record is not None and record.status == "failed" and record.reason == "lost"
    assert [e.kind for e in events].count("failed") == 1
    assert peer.calls["SubscribeToTask"] == 1 and peer.calls["GetTask"] == 2, peer.calls


async def test_push_modes_fallback_to_a_stream_ends_from_the_finished_task(
    tmp_path: Path,
) -> None:
    # A 0.3 peer whose card offers no push notifications: the child in push
    # mode streams, and re-attaches by subscribing, as any streaming child.
    dialect, refusal = FINISHED["0.3: is in terminal state"]
    peer = RefusingPeer(refusal, after="completed", dialect=dialect)
    result, record, events = await _delegate_to(peer, tmp_path, push=True)
    assert isinstance(result, Done) and result.text == ANSWER, result
    assert record is not None and record.status == "completed" and record.result == ANSWER
    assert [e.kind for e in events].count("done") == 1
    assert peer.calls["tasks/resubscribe"] == 1 and peer.calls["tasks/get"] == 2, peer.calls
