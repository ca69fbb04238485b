"""No silent hangs: a remote child ends by its deadline, or `lost`, or completes
after a cut stream; it is never left `running` by a quiet peer.

Every peer here is a real HTTP server on 127.0.0.1: a silent A2A peer written
below, a role server process stopped with SIGSTOP, and a real role server
behind a real proxy that cuts its stream.
"""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.types import Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from support.servers import CARD_PATH, role_server, serving, start_role_server
from support.sessions import CountingScript

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports import RemoteDelegate
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.server.app import agent_card
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio


def _sse(result: Any, rpc_id: Any) -> bytes:
    payload = {"jsonrpc": "2.0", "id": rpc_id, "result": result}
    return f"data: {json.dumps(payload)}\n\n".encode()


@dataclass
class SilentPeer:
    """A real A2A peer (Starlette on uvicorn) that takes a task and then goes
    quiet: its stream sends the task once, WORKING, and nothing after; GetTask
    and ListTasks say WORKING forever. CancelTask cancels it (and counts).

    `end_stream`: the stream ends after that first frame, without a terminal
    one, and GetTask then reports the task COMPLETED with its result artifact.
    """

    end_stream: bool = False
    url: str = ""
    calls: dict[str, int] = field(default_factory=dict)
    task: Task | None = None

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(CARD_PATH, self.card, methods=["GET"]),
                Route("/", self.rpc, methods=["POST"]),
            ]
        )

    async def card(self, request: Request) -> Response:
        card = agent_card(name="silent", description="says nothing", url=self.url, skills=[])
        return JSONResponse(MessageToDict(card))

    async def rpc(self, request: Request) -> Response:
        body = await request.json()
        method, rpc_id, params = body["method"], body["id"], body.get("params", {})
        self.calls[method] = self.calls.get(method, 0) + 1
        if method == "SendStreamingMessage":
            message = params["message"]
            self.task = ParseDict(
                {
                    "id": "silent-task",
                    "contextId": message.get("contextId", "ctx"),
                    "status": {"state": "TASK_STATE_WORKING"},
                    "history": [message],
                },
                Task(),
            )
            return StreamingResponse(self._stream(rpc_id), media_type="text/event-stream")
        assert self.task is not None
        if method == "GetTask":
            return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": self._snapshot()})
        if method == "ListTasks":
            tasks = [MessageToDict(self.task)]
            result = {"tasks": tasks, "totalSize": 1, "pageSize": 100, "nextPageToken": ""}
            return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": result})
        if method == "CancelTask":
            self.task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_CANCELED))
            return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": self._snapshot()})
        error = {"code": -32601, "message": f"no method {method}"}
        return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error})

    def _snapshot(self) -> dict[str, Any]:
        assert self.task is not None
        if self.end_stream:
            done = Task()
            done.CopyFrom(self.task)
            done.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
            artifact = {"artifactId": "a1", "parts": [{"text": "finished quietly"}]}
            ParseDict(artifact, done.artifacts.add())
            return MessageToDict(done)
        return MessageToDict(self.task)

    async def _stream(self, rpc_id: Any) -> AsyncIterator[bytes]:
        assert self.task is not None
        yield _sse({"task": MessageToDict(self.task)}, rpc_id)
        if not self.end_stream:
            await anyio.sleep_forever()


def _session(store: Store, tmp_path: Path, url: str, remote: RemoteDelegate) -> Session:
    network = Network.of(AgentSpec(name="peer", role="coder", url=url))
    return Session(store, workdir=tmp_path, network=network, remote=remote)


async def test_a_silent_peer_fails_timeout_within_its_deadline(tmp_path: Path) -> None:
    peer = SilentPeer()
    store = Store(tmp_path / "o.db")
    async with serving(peer.app()) as url:
        peer.url = url
        async with RemoteDelegate(idle_probe=0.5, deadline_grace=1.0, lost_after=30) as remote:
            with anyio.fail_after(20):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=2), child_id="c1"
                    )
                    started = anyio.current_time()
                    result = await handle.result()
                    elapsed = anyio.current_time() - started
    record = await store.get_child("c1")
    store.close()
    assert isinstance(result, Failed) and result.reason == "timeout", result
    assert record is not None and record.status == "failed" and record.reason == "timeout"
    # Held to its deadline (timeout 2 s + grace 1 s), not to a stream timeout,
    # and not ended earlier by the probes, which saw the task still working.
    assert 2.0 <= elapsed < 3.0 + 2.0
    assert peer.calls.get("GetTask", 0) >= 2
    assert peer.calls.get("CancelTask") == 1
    assert peer.task is not None and peer.task.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_stream_that_ends_without_a_terminal_frame_is_reattached(
    tmp_path: Path,
) -> None:
    peer = SilentPeer(end_stream=True)
    store = Store(tmp_path / "o.db")
    async with serving(peer.app()) as url:
        peer.url = url
        async with RemoteDelegate(idle_probe=0.5, deadline_grace=1.0) as remote:
            with anyio.fail_after(20):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=5), child_id="c1"
                    )
                    result = await handle.result()
    record = await store.get_child("c1")
    store.close()
    assert isinstance(result, Done) and result.text == "finished quietly", result
    assert record is not None and record.status == "completed"
    assert peer.calls.get("GetTask", 0) >= 1 and "CancelTask" not in peer.calls


async def test_a_peer_that_stops_answering_is_lost_after_lost_after(tmp_path: Path) -> None:
    process, url = start_role_server(tmp_path, 0, tmp_path / "role.db")
    try:
        store = Store(tmp_path / "o.db")
        async with RemoteDelegate(idle_probe=0.5, lost_after=2.0) as remote:
            with anyio.fail_after(30):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=120), child_id="c1"
                    )
                    while not (handle.run.task_id and handle.log):
                        await anyio.sleep(0.05)
                    # Hung, not gone: its connections stay open, nothing answers.
                    process.send_signal(signal.SIGSTOP)
                    started = anyio.current_time()
                    result = await handle.result()
                    elapsed = anyio.current_time() - started
        record = await store.get_child("c1")
        store.close()
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()
    assert isinstance(result, Failed) and result.reason == "lost", result
    assert url in result.message
    assert record is not None and record.status == "failed" and record.reason == "lost"
    # lost_after (2 s) from the last frame, plus at most a probe's own wait.
    assert elapsed < 2.0 + 3 * 0.5 + 1.0


@dataclass
class CuttingProxy:
    """A real HTTP proxy (Starlette on uvicorn, httpx upstream) in front of a
    role server: it rewrites the card to point at itself, and cuts the
    connection of the first SendStreamingMessage stream after `frames`
    frames, the way a dropped connection would (no terminal frame)."""

    upstream: str
    frames: int = 2
    url: str = ""
    calls: dict[str, int] = field(default_factory=dict)
    cut: bool = False

    def app(self, http: httpx.AsyncClient) -> Starlette:
        async def card(request: Request) -> Response:
            answer = await http.get(self.upstream + CARD_PATH)
            text = answer.text.replace(self.upstream, self.url)
            return Response(text, media_type="application/json")

        async def rpc(request: Request) -> Response:
            body = await request.body()
            method = json.loads(body)["method"]
            self.calls[method] = self.calls.get(method, 0) + 1
            upstream = http.build_request(
                "POST", self.upstream + "/", content=body, headers=dict(request.headers)
            )
            answer = await http.send(upstream, stream=True)
            cut = method == "SendStreamingMessage" and not self.cut
            self.cut = self.cut or cut

            async def relay() -> AsyncIterator[bytes]:
                try:
                    sent = 0
                    async for line in answer.aiter_lines():
                        yield (line + "\n").encode()
                        sent += line.startswith("data:")
                        if cut and sent >= self.frames and not line:
                            # An error mid-body: uvicorn drops the connection.
                            raise ConnectionAbortedError("cut by the proxy")
                finally:
                    await answer.aclose()

            headers = {"content-type": answer.headers.get("content-type", "")}
            return StreamingResponse(relay(), status_code=answer.status_code, headers=headers)

        return Starlette(
            routes=[Route(CARD_PATH, card, methods=["GET"]), Route("/", rpc, methods=["POST"])]
        )


async def test_a_cut_stream_is_reattached_and_completes(tmp_path: Path) -> None:
    script = CountingScript(delay=1.0)
    store = Store(tmp_path / "o.db")
    with anyio.fail_after(30):
        async with (
            role_server(tmp_path, script) as server,
            httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as http,
        ):
            proxy = CuttingProxy(server.url)
            async with serving(proxy.app(http)) as url:
                proxy.url = url
                async with (
                    RemoteDelegate(idle_probe=5.0) as remote,
                    _session(store, tmp_path, url, remote) as session,
                ):
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work"), child_id="c1"
                    )
                    result = await handle.result()
    record = await store.get_child("c1")
    events = await store.events(session.id, child_id="c1")
    store.close()
    assert proxy.cut
    assert isinstance(result, Done) and result.text == "remote done", result
    assert record is not None and record.status == "completed"
    assert proxy.calls.get("GetTask", 0) >= 1  # re-attached through the proxy
    assert proxy.calls["SendStreamingMessage"] == 1 and script.runs == 1
    uuids = [e.uuid for e in events]
    assert len(uuids) == len(set(uuids)) and [e.kind for e in events].count("done") == 1
