"""A slow agent is not a dead one: a remote child whose role server keeps
stalling (SIGSTOP, SIGCONT) completes, once, as does one whose agent's
reads hang while its stream still speaks; one whose server stays stopped
past `lost_after`, or dies, ends `lost`, and promptly.

The role server is a real `serve coder` process on 127.0.0.1 whose scripted
model answers after a silent delay (a long step sends no frames), so the
orchestrator learns that the agent lives only from its probes' answers.
The peer whose reads hang is a real HTTP server on 127.0.0.1 written below.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from a2a.types import ListTasksRequest
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from support.servers import CARD_PATH, a2a_client, serving, start_role_server

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports import RemoteDelegate
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.server.app import agent_card
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

IDLE_PROBE = 1.0
LOST_AFTER = 2.0
# Each stall is longer than IDLE_PROBE (a probe goes out during it) and
# shorter than LOST_AFTER; together they last three times LOST_AFTER. A
# stall starts GAP after the server last answered, so the silence since
# that answer outlasts LOST_AFTER (the defaults' ratio, 15 s and 30 s, has
# the same shape) while no question waits more than STALL for its answer.
STALL = 1.5
GAP = 0.85
STALLS = 4
# The model's silent step outlasts the stalls: its answer comes at the end
# of the last one.
STEP = 9.0


@contextmanager
def slow_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    script = tmp_path / "slow.json"
    script.write_text(f'[{{"text": "slow but done", "delay": {STEP}}}]')
    process, url = start_role_server(tmp_path, 0, tmp_path / "role.db", script)
    try:
        yield process, url
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait()


def _session(store: Store, tmp_path: Path, url: str, remote: RemoteDelegate) -> Session:
    network = Network.of(AgentSpec(name="peer", role="coder", url=url))
    return Session(store, workdir=tmp_path, network=network, remote=remote)


async def test_a_server_that_keeps_stalling_completes_its_child_once(tmp_path: Path) -> None:
    store = Store(tmp_path / "o.db")
    stalled = 0.0
    with slow_server(tmp_path) as (process, url):
        async with RemoteDelegate(idle_probe=IDLE_PROBE, lost_after=LOST_AFTER) as remote:
            with anyio.fail_after(40):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=60), child_id="c1"
                    )
                    while not (handle.run.task_id and handle.log):
                        await anyio.sleep(0.05)
                    for _ in range(STALLS):
                        await anyio.sleep(GAP)
                        process.send_signal(signal.SIGSTOP)
                        await anyio.sleep(STALL)
                        process.send_signal(signal.SIGCONT)
                        stalled += STALL
                    result = await handle.result()
                    context_id = handle.run.context_id
            async with a2a_client(url) as client:
                listing = await client.list_tasks(ListTasksRequest(context_id=context_id))
    record = await store.get_child("c1")
    events = await store.events(session.id, child_id="c1")
    store.close()
    assert stalled > LOST_AFTER
    assert isinstance(result, Done) and result.text == "slow but done", result
    assert record is not None and record.status == "completed"
    kinds = [e.kind for e in events]
    assert kinds.count("done") == 1 and "failed" not in kinds, kinds
    uuids = [e.uuid for e in events]
    assert len(uuids) == len(set(uuids))
    # Once on the agent too: the opening message was not sent again.
    assert len(listing.tasks) == 1


async def test_a_server_stopped_past_lost_after_loses_its_child(tmp_path: Path) -> None:
    store = Store(tmp_path / "o.db")
    with slow_server(tmp_path) as (process, url):
        async with RemoteDelegate(idle_probe=IDLE_PROBE, lost_after=LOST_AFTER) as remote:
            with anyio.fail_after(30):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=60), child_id="c1"
                    )
                    while not (handle.run.task_id and handle.log):
                        await anyio.sleep(0.05)
                    # Total silence: connections stay open, nothing answers.
                    process.send_signal(signal.SIGSTOP)
                    started = anyio.current_time()
                    result = await handle.result()
                    elapsed = anyio.current_time() - started
    record = await store.get_child("c1")
    store.close()
    assert isinstance(result, Failed) and result.reason == "lost", result
    assert url in result.message and "did not answer" in result.message
    assert record is not None and record.status == "failed" and record.reason == "lost"
    # A probe after IDLE_PROBE of silence, unanswered for LOST_AFTER: lost
    # then, long before the turn's 60 s timeout.
    assert LOST_AFTER <= elapsed < IDLE_PROBE + LOST_AFTER + 1.5


async def test_a_server_that_dies_loses_its_child_promptly(tmp_path: Path) -> None:
    store = Store(tmp_path / "o.db")
    with slow_server(tmp_path) as (process, url):
        async with RemoteDelegate(idle_probe=IDLE_PROBE, lost_after=LOST_AFTER) as remote:
            with anyio.fail_after(30):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=60), child_id="c1"
                    )
                    while not (handle.run.task_id and handle.log):
                        await anyio.sleep(0.05)
                    # The stream is reset and every later call refused.
                    process.kill()
                    process.wait()
                    started = anyio.current_time()
                    result = await handle.result()
                    elapsed = anyio.current_time() - started
    record = await store.get_child("c1")
    store.close()
    assert isinstance(result, Failed) and result.reason == "lost", result
    assert url in result.message and "unreachable" in result.message
    assert record is not None and record.status == "failed" and record.reason == "lost"
    # LOST_AFTER from the last frame, refused all along: no question waits.
    assert elapsed < LOST_AFTER + 1.0


@dataclass
class HangingReads:
    """A real A2A peer (Starlette on uvicorn) whose reads hang (GetTask never
    answers, as behind a locked database) while its stream still speaks:
    the task once, then nothing for `quiet` seconds (a probe goes out), then
    a WORKING frame every `beat` seconds, `beats` times, then the task done."""

    quiet: float = 1.3
    beat: float = 0.3
    beats: int = 10
    url: str = ""
    calls: dict[str, int] = field(default_factory=dict)
    spoke: float = 0.0
    """When the stream spoke after its quiet spell."""
    given_up: list[float] = field(default_factory=list)
    """When each read was given up by its caller."""

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route(CARD_PATH, self.card, methods=["GET"]),
                Route("/", self.rpc, methods=["POST"]),
            ]
        )

    async def card(self, request: Request) -> Response:
        card = agent_card(name="hanging", description="reads hang", url=self.url, skills=[])
        return JSONResponse(MessageToDict(card))

    async def rpc(self, request: Request) -> Response:
        body = await request.json()
        method, rpc_id = body["method"], body["id"]
        self.calls[method] = self.calls.get(method, 0) + 1
        if method == "SendStreamingMessage":
            message = body["params"]["message"]
            return StreamingResponse(self._stream(rpc_id, message), media_type="text/event-stream")
        # Any read hangs until its caller gives it up.
        while not await request.is_disconnected():
            await anyio.sleep(0.05)
        self.given_up.append(anyio.current_time())
        return Response(status_code=503)

    async def _stream(self, rpc_id: Any, message: dict[str, Any]) -> AsyncIterator[bytes]:
        task: dict[str, Any] = {
            "id": "hanging-task",
            "contextId": message.get("contextId", "ctx"),
            "status": {"state": "TASK_STATE_WORKING"},
            "history": [message],
        }
        yield _sse({"task": task}, rpc_id)
        await anyio.sleep(self.quiet)
        self.spoke = anyio.current_time()
        for _ in range(self.beats):
            yield _sse({"task": task}, rpc_id)
            await anyio.sleep(self.beat)
        task["status"] = {"state": "TASK_STATE_COMPLETED"}
        task["artifacts"] = [{"artifactId": "a1", "parts": [{"text": "done as reads hung"}]}]
        yield _sse({"task": task}, rpc_id)


def _sse(result: Any, rpc_id: Any) -> bytes:
    payload = {"jsonrpc": "2.0", "id": rpc_id, "result": result}
    return f"data: {json.dumps(payload)}\n\n".encode()


async def test_a_stream_that_speaks_while_a_probe_hangs_keeps_its_child(tmp_path: Path) -> None:
    peer = HangingReads()
    store = Store(tmp_path / "o.db")
    async with serving(peer.app()) as url:
        peer.url = url
        async with RemoteDelegate(idle_probe=IDLE_PROBE, lost_after=LOST_AFTER) as remote:
            with anyio.fail_after(20):
                async with _session(store, tmp_path, url, remote) as session:
                    handle = await session.spawn(
                        ChildConfig(role="peer", prompt="work", timeout=60), child_id="c1"
                    )
                    started = anyio.current_time()
                    result = await handle.result()
                    elapsed = anyio.current_time() - started
    record = await store.get_child("c1")
    store.close()
    # The frames after the quiet spell kept the child past LOST_AFTER from
    # the last frame before it, and answered the hanging probe: it was given
    # up as they came, not left to wait for its own answer.
    assert peer.calls.get("GetTask", 0) == len(peer.given_up) >= 1
    assert all(0 <= t - peer.spoke < 0.5 for t in peer.given_up), (peer.spoke, peer.given_up)
    assert peer.quiet + peer.beat * peer.beats > LOST_AFTER
    assert isinstance(result, Done) and result.text == "done as reads hung", result
    assert record is not None and record.status == "completed"
    assert elapsed < peer.quiet + peer.beat * peer.beats + 2.0  # ended by the stream
