"""The tolerant reader against stock peers' recorded answers.

Each peer here is a real HTTP server on 127.0.0.1 (Starlette under uvicorn)
that replays what a stock agent answered our client, recorded through a
proxy (`tests/protocol/peers/*.json`, see each file's `recorded`): fasta2a 2.1.1
(naive timestamps in a stream that opens with SUBMITTED) and fasta2a 0.6.1
(A2A v0.3 card without supportedInterfaces, HTTP 500 without
`acceptedOutputModes`, SUBMITTED answers to a blocking send, naive
timestamps), Google ADK's `to_a2a` on a2a-sdk 1.3 and on 0.3, and a minimal
a2a-sdk 0.3 server, streaming and not (two turns each: a later turn opens a
new task in the same context). The replay is the fake here: it stands for
those frameworks, which the test suite does not install. A child is
delegated to each through a `Session`, and its result is the peer's answer.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.protocol.tolerant import MAX_LINE, tolerate_naive_timestamps
from a2a_orchestrator.protocol.wire import BATCH_KIND, EVENT_ID_KEY, EVENT_KEY
from a2a_orchestrator.runtime.events import TERMINAL_KINDS, AssistantMessage, Done
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

PEERS = Path(__file__).parent / "peers"


class Replay:
    """Answers each JSON-RPC method with its next recorded answer (the last repeats)."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self.card = recording["card"]
        self.queues: dict[str, list[dict[str, Any]]] = {}
        for exchange in recording["exchanges"]:
            self.queues.setdefault(exchange["method"], []).append(exchange)
        self.requests: list[dict[str, Any]] = []
        self.ids: dict[str, str] = {}
        self.url = ""

    def card_json(self) -> dict[str, Any]:
        card = copy.deepcopy(self.card)
        if "url" in card:
            card["url"] = self.url
        for interface in card.get("supportedInterfaces", []):
            interface["url"] = self.url
        return card

    async def rpc(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        queue = self.queues.get(body["method"])
        if not queue:
            return JSONResponse(
                {"jsonrpc": "2.0", "id": body["id"], "error": {"code": -32601, "message": "nope"}}
            )
        exchange = queue.pop(0) if len(queue) > 1 else queue[0]
        text = exchange["response"].replace(exchange["request"]["id"], body["id"])
        # Our client picks the context and message ids; the answers name them.
        sent = exchange["request"]["params"].get("message")
        if sent is not None:
            mine = body["params"]["message"]
            self.ids = {sent["contextId"]: mine["contextId"], sent["messageId"]: mine["messageId"]}
        for recorded, ours in self.ids.items():
            text = text.replace(recorded, ours)
        return Response(text, media_type=exchange["contentType"])


@asynccontextmanager
async def replaying(recording: dict[str, Any]) -> AsyncIterator[Replay]:
    replay = Replay(recording)

    async def card(request: Request) -> Response:
        return JSONResponse(replay.card_json())

    app = Starlette(
        routes=[
            Route("/.well-known/agent-card.json", card),
            Route("/", replay.rpc, methods=["POST"]),
        ]
    )
    sock = bind_socket("127.0.0.1", 0)
    replay.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve, app, sock)
        yield replay
        tg.cancel_scope.cancel()


def recording(name: str) -> dict[str, Any]:
    return json.loads((PEERS / f"{name}.json").read_text())


async def delegate(url: str, tmp_path: Path) -> Any:
    network = Network.of(AgentSpec(name="peer", role="peer", url=url))
    async with Session(Store(tmp_path / "o.db"), workdir=tmp_path, network=network) as session:
        child = await session.spawn(ChildConfig(role="peer", prompt="hello there"))
        return await child.result()


async def converse(url: str, tmp_path: Path) -> list[Any]:
    """The results of two turns: the opening prompt, then a follow-up."""
    network = Network.of(AgentSpec(name="peer", role="peer", url=url))
    async with Session(Store(tmp_path / "o.db"), workdir=tmp_path, network=network) as session:
        child = await session.spawn(ChildConfig(role="peer", prompt="hello there"))
        first = await child.result()
        seen = len(child.log)
        await child.send("second")
        async for event in child.events(seen):
            if event.kind in TERMINAL_KINDS:
                return [first, event]
    raise AssertionError("the child closed before its second turn ended")


def noted(caplog: pytest.LogCaptureFixture, url: str, what: str) -> int:
    return sum(1 for r in caplog.records if url in r.getMessage() and what in r.getMessage())


async def test_fasta2a_2_naive_timestamps_read_as_utc(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="a2a_orchestrator")
    with anyio.fail_after(30):
        async with replaying(recording("fasta2a_2_1_1")) as peer:
            result = await delegate(peer.url, tmp_path)
            again = await delegate(peer.url, tmp_path / "again")
    assert isinstance(result, Done) and result.text == "echo: hello there"
    assert isinstance(again, Done) and again.text == "echo: hello there"
    # The card's output modes are the ones the send accepts.
    sent = peer.requests[0]["params"]["configuration"]["acceptedOutputModes"]
    assert sent == ["application/json"]
    assert noted(caplog, peer.url, "timestamp without a UTC offset") == 1  # once per peer


async def test_fasta2a_0_6_submitted_answer_is_polled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="a2a_orchestrator")
    with anyio.fail_after(30):
        async with replaying(recording("fasta2a_0_6_1")) as peer:
            result = await delegate(peer.url, tmp_path)
    assert isinstance(result, Done) and result.text == "echo: hello there"
    methods = [r["method"] for r in peer.requests]
    assert methods == ["message/send", "tasks/get", "tasks/get"]
    assert peer.requests[0]["params"]["configuration"]["acceptedOutputModes"] == [
        "application/json"
    ]
    assert noted(caplog, peer.url, "answered the send with SUBMITTED") == 1
    assert noted(caplog, peer.url, "polled with GetTask") == 1


async def test_accepted_output_modes_default_when_the_card_names_none(tmp_path: Path) -> None:
    data = recording("fasta2a_0_6_1")
    data["card"]["defaultOutputModes"] = []
    with anyio.fail_after(30):
        async with replaying(data) as peer:
            result = await delegate(peer.url, tmp_path)
    assert isinstance(result, Done)
    modes = peer.requests[0]["params"]["configuration"]["acceptedOutputModes"]
    assert modes == ["text/plain", "application/json"]


async def test_an_append_chunk_for_an_unknown_artifact_starts_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The fasta2a 2.1.1 stream with its artifact sent in two chunks, both
    # marked `append` (how a peer streaming text in chunks may start one).
    data = recording("fasta2a_2_1_1")
    exchange = data["exchanges"][0]
    frames = exchange["response"].split("\n\n")
    whole = next(f for f in frames if "artifactUpdate" in f)
    chunks = []
    for text, last in (("echo: ", False), ("hello there", True)):
        frame = json.loads(whole.removeprefix("data: "))
        update = frame["result"]["artifactUpdate"]
        update["artifact"]["parts"] = [{"text": text}]
        update["append"], update["lastChunk"] = True, last
        chunks.append("data: " + json.dumps(frame))
    at = frames.index(whole)
    exchange["response"] = "\n\n".join([*frames[:at], *chunks, *frames[at + 1 :]])
    caplog.set_level(logging.DEBUG, logger="a2a_orchestrator")
    with anyio.fail_after(30):
        async with replaying(data) as peer:
            result = await delegate(peer.url, tmp_path)
    assert isinstance(result, Done) and result.text == "echo: hello there"
    assert noted(caplog, peer.url, "append chunk for an unknown artifact") == 1


@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("adk_to_a2a", "SendStreamingMessage"),
        ("adk_to_a2a_sdk_0_3", "message/stream"),
        ("a2a_sdk_0_3", "message/stream"),
        # Not streaming: each turn's blocking send answers with the completed
        # task, whose final state the second turn must not take for a replay
        # of the first task's.
        ("a2a_sdk_0_3_blocking", "message/send"),
    ],
)
async def test_stock_peer_answers_two_turns(
    name: str, method: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="a2a_orchestrator")
    with anyio.fail_after(30):
        async with replaying(recording(name)) as peer:
            first, second = await converse(peer.url, tmp_path)
    assert isinstance(first, Done) and first.text == "echo: hello there"
    assert isinstance(second, Done) and second.text == "echo: second"
    assert [r["method"] for r in peer.requests] == [method, method]
    # Both turns are in the child's one context, the second a new task.
    contexts = {r["params"]["message"]["contextId"] for r in peer.requests}
    assert len(contexts) == 1 and "taskId" not in peer.requests[1]["params"]["message"]
    assert all(
        r["params"]["configuration"]["acceptedOutputModes"] == ["text/plain"] for r in peer.requests
    )
    # These peers need no tolerance of the reader.
    assert noted(caplog, peer.url, "peer ") == 0


@asynccontextmanager
async def long_line_peer(body: bytes, chunk: int) -> AsyncIterator[str]:
    """A peer answering `body` as JSON, `chunk` bytes at a time (no newline
    but where `body` has one): a long line arrives in many pieces."""

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), chunk):
            yield body[start : start + chunk]

    async def answer(request: Request) -> Response:
        return StreamingResponse(pieces(), media_type="application/json")

    sock = bind_socket("127.0.0.1", 0)
    async with anyio.create_task_group() as tg:
        await tg.start(serve, Starlette(routes=[Route("/", answer)]), sock)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
        tg.cancel_scope.cancel()


async def test_a_long_line_in_many_pieces_is_rewritten_whole_up_to_a_bound() -> None:
    stamp = b'"timestamp": "2026-01-05T10:00:00.123456"'
    padding = b" " * (4 * 1024 * 1024)
    fine = b'{"a": "' + padding + b'", ' + stamp + b"}"
    too_long = b"[" + b"0," * (MAX_LINE // 2) + b"0]"
    with anyio.fail_after(60):
        async with httpx.AsyncClient() as http:
            tolerate_naive_timestamps(http)
            # Pieces of 7 bytes split the timestamp itself.
            async with long_line_peer(fine, 7 * 1024 + 7) as url:
                read = (await http.get(url)).content
            async with long_line_peer(too_long, 64 * 1024) as url:
                with pytest.raises(httpx.DecodingError, match="longer than"):
                    await http.get(url)
    assert read == fine.replace(b'123456"', b'123456Z"')


async def test_a_batch_on_a_terminal_frame_still_ends_the_turn_with_its_result(
    tmp_path: Path,
) -> None:
    # The ADK stream whose COMPLETED frame carries a message marked as a
    # batch (which holds WORKING events only): an untrusted peer's mistake.
    # Its events are read, and its state still ends the turn with the
    # artifact's text as the result, as a plain COMPLETED frame does.
    data = recording("adk_to_a2a")
    exchange = data["exchanges"][0]
    frames = exchange["response"].split("\r\n\r\n")
    at = next(i for i, f in enumerate(frames) if "TASK_STATE_COMPLETED" in f)
    frame = json.loads(frames[at].removeprefix("data: "))
    part = {"text": "checked twice", "metadata": {EVENT_KEY: "message", EVENT_ID_KEY: "p1"}}
    frame["result"]["statusUpdate"]["status"]["message"] = {
        "messageId": "batch-1",
        "role": "ROLE_AGENT",
        "parts": [part],
        "metadata": {EVENT_KEY: BATCH_KIND},
    }
    frames[at] = "data: " + json.dumps(frame)
    exchange["response"] = "\r\n\r\n".join(frames)
    with anyio.fail_after(30):
        async with replaying(data) as peer:
            network = Network.of(AgentSpec(name="peer", role="peer", url=peer.url))
            store = Store(tmp_path / "o.db")
            try:
                async with Session(store, workdir=tmp_path, network=network) as session:
                    child = await session.spawn(ChildConfig(role="peer", prompt="hello there"))
                    result = await child.result()
                    log = list(child.log)
            finally:
                store.close()
    assert isinstance(result, Done) and result.text == "echo: hello there"
    assert [e.uuid for e in log if isinstance(e, AssistantMessage)][-1] == "p1"
