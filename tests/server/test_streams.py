"""Stream caps (`streams.py`): open event streams per caller and per server.

Real role and orchestrator servers on 127.0.0.1; the model is scripted and
slow (the only fake), so the streams it answers stay open while the test
opens more.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from a2a.types import SendMessageRequest, SubscribeToTaskRequest, a2a_pb2_grpc
from google.protobuf.json_format import ParseDict
from support.ui import TOKEN, logged_in

from a2a_orchestrator.delegation.network import Network
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import run_orchestrator_server
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.server.auth.access import Access
from a2a_orchestrator.server.streams import VIEW_PER_CALLER, StreamLimits

pytestmark = pytest.mark.anyio

V1 = {"A2A-Version": "1.0"}


def slow(messages: Sequence[Any]) -> dict[str, Any]:
    """A turn that stays running while the test holds its stream."""
    return {"delay": 20, "text": "late"}


@asynccontextmanager
async def served(tmp_path: Path, limits: StreamLimits) -> AsyncIterator[RunningServer]:
    async with run_role_server(
        find_role("architect"),
        ScriptedModel(slow),
        tmp_path,
        db=str(tmp_path / "tasks.db"),
        grpc_port=0,
        stream_limits=limits,
    ) as server:
        yield server


def message() -> dict[str, Any]:
    return {
        "message": {"role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": [{"text": "go"}]}
    }


async def open_stream(stack: AsyncExitStack, http: httpx.AsyncClient, url: str) -> str:
    """Open a JSON-RPC SendStreamingMessage stream and keep it open on
    `stack`; its first SSE data line (the task)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": message()}
    response = await stack.enter_async_context(http.stream("POST", url, json=body, headers=V1))
    assert response.status_code == 200
    # The iterator is kept (closed with the stack): dropping it mid-stream
    # would close the response, and the stream with it.
    lines = response.aiter_lines()
    stack.push_async_callback(lines.aclose)  # type: ignore[attr-defined]
    async for line in lines:
        if line.startswith("data:"):
            return line
    raise AssertionError("the stream ended before its first event")


async def refusals(server: RunningServer, http: httpx.AsyncClient) -> dict[str, str]:
    """What one more stream gets on each binding."""
    found: dict[str, str] = {}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendStreamingMessage", "params": message()}
    async with http.stream("POST", server.url, json=body, headers=V1) as response:
        found["json-rpc"] = (await response.aread()).decode()
    async with http.stream(
        "POST", f"{server.url}/rest/message:stream", json=message(), headers=V1
    ) as response:
        found["http+json"] = (
            f"{response.status_code} {response.headers.get('retry-after')} "
            + (await response.aread()).decode()
        )
    assert server.grpc_address is not None
    async with grpc.aio.insecure_channel(server.grpc_address) as channel:
        stub = a2a_pb2_grpc.A2AServiceStub(channel)
        call = stub.SendStreamingMessage(ParseDict(message(), SendMessageRequest()))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        found["grpc"] = f"{refused.value.code().name} {refused.value.details()}"
    return found


async def test_a_callers_streams_past_its_cap_are_refused_on_every_binding(tmp_path: Path) -> None:
    # Issue 26 finding 6: a role server accepted 2,000 streams of one caller.
    with anyio.fail_after(60):
        async with (
            served(tmp_path, StreamLimits(per_caller=3, per_server=100)) as server,
            httpx.AsyncClient(timeout=10) as http,
        ):
            async with AsyncExitStack() as held:
                firsts = [await open_stream(held, http, server.url) for _ in range(3)]
                refused = await refusals(server, http)
            # The three closed (their clients went): a stream fits again.
            with anyio.fail_after(10):
                while True:
                    async with AsyncExitStack() as again:
                        try:
                            reopened = await open_stream(again, http, server.url)
                            break
                        except AssertionError:
                            await anyio.sleep(0.1)
    assert all('"task"' in first for first in firsts)
    assert '"code":-32600' in refused["json-rpc"].replace(" ", "")
    assert "limit is 3 per caller" in refused["json-rpc"]
    assert refused["http+json"].startswith("429 5 ")
    assert "limit is 3 per caller" in refused["http+json"]
    assert refused["grpc"].startswith("INVALID_ARGUMENT") and "3 per caller" in refused["grpc"]
    assert '"task"' in reopened


async def test_streams_past_the_servers_cap_are_refused(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with (
            served(tmp_path, StreamLimits(per_caller=100, per_server=2)) as server,
            httpx.AsyncClient(timeout=10) as http,
            AsyncExitStack() as held,
        ):
            for _ in range(2):
                await open_stream(held, http, server.url)
            refused = await refusals(server, http)
    assert all("the limit is 2 (operator setting --max-streams)" in r for r in refused.values())


async def test_the_web_views_streams_past_their_cap_get_429(tmp_path: Path) -> None:
    # Issue 26 finding 6: one caller's 600 web-view streams slowed the server for everyone.
    async with run_orchestrator_server(
        store_path=tmp_path / "orchestrator.db",
        workdir=tmp_path,
        network=Network.of(),
        models=lambda name: ScriptedModel([]),
        db=str(tmp_path / "orchestrator-tasks.db"),
        access=Access(token=TOKEN),
    ) as server:
        with anyio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
                await logged_in(http)
                async with AsyncExitStack() as held:
                    for _ in range(VIEW_PER_CALLER):
                        response = await held.enter_async_context(http.stream("GET", "/ui/stream"))
                        assert response.status_code == 200
                    refused = await http.get("/ui/stream")
                    api = await http.get("/api/sessions")  # not a stream: not capped
                with anyio.fail_after(5):
                    while (again := await _first_bytes(http, "/ui/stream")) is None:
                        await anyio.sleep(0.1)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
    assert f"limit is {VIEW_PER_CALLER} per caller" in refused.json()["detail"]
    assert api.status_code == 200
    assert again.startswith(b"retry:")


async def _first_bytes(http: httpx.AsyncClient, path: str) -> bytes | None:
    """The first bytes of a stream at `path`, None if it is refused."""
    async with http.stream("GET", path) as response:
        if response.status_code != 200:
            return None
        async for chunk in response.aiter_bytes():
            return chunk
    return b""


def test_stream_limits_come_from_the_flags_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("A2A_MAX_STREAMS", raising=False)
    monkeypatch.setenv("A2A_MAX_STREAMS_PER_CALLER", "7")
    assert StreamLimits.from_settings() == StreamLimits(per_caller=7, per_server=2048)
    assert StreamLimits.from_settings(3, 9) == StreamLimits(per_caller=3, per_server=9)
    assert StreamLimits(per_caller=7).for_view().per_caller == 7
    assert StreamLimits().for_view().per_caller == VIEW_PER_CALLER
    monkeypatch.setenv("A2A_MAX_STREAMS", "many")
    with pytest.raises(ConfigError, match="A2A_MAX_STREAMS: 'many' is not a whole number"):
        StreamLimits.from_settings()
    with pytest.raises(ConfigError, match="at least 1"):
        StreamLimits.from_settings(0, 1)


async def test_a_stream_gives_its_slot_back_however_it_ends(tmp_path: Path) -> None:
    # One slot per caller: a slot kept by any way a stream can end would
    # refuse every later stream of this caller, for good.
    async with (
        served(tmp_path, StreamLimits(per_caller=1, per_server=100)) as server,
        httpx.AsyncClient(timeout=10) as http,
    ):
        assert server.grpc_address is not None
        with anyio.fail_after(90):
            endings: list[str] = []

            async def fits_again(after: str) -> None:
                """One more stream opens (a slot freed late is waited for a little)."""
                with anyio.fail_after(5):
                    while True:
                        async with AsyncExitStack() as again:
                            try:
                                await open_stream(again, http, server.url)
                                break
                            except AssertionError:
                                await anyio.sleep(0.1)
                endings.append(after)

            async with AsyncExitStack() as held:
                first = await open_stream(held, http, server.url)
            task = first.split('"id": "', 1)[1].split('"', 1)[0]
            await fits_again("client closed a JSON-RPC send stream")
            subscribe = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask"}
            async with http.stream(
                "POST", server.url, json={**subscribe, "params": {"id": task}}, headers=V1
            ) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        break
            await fits_again("client closed a JSON-RPC subscription")
            async with http.stream(
                "GET", f"{server.url}/rest/tasks/{task}:subscribe", headers=V1
            ) as response:
                assert response.status_code == 200
            await fits_again("client closed an HTTP+JSON subscription")
            unknown = await http.post(
                server.url, json={**subscribe, "params": {"id": "no-such-task"}}, headers=V1
            )
            assert "Task not found" in unknown.text
            await fits_again("subscription to an unknown task refused")
            async with grpc.aio.insecure_channel(server.grpc_address) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                call = stub.SendStreamingMessage(ParseDict(message(), SendMessageRequest()))
                await call.read()
                call.cancel()
                await fits_again("gRPC send stream cancelled")
                watch = stub.SubscribeToTask(SubscribeToTaskRequest(id=task))
                await watch.read()
                watch.cancel()
                await fits_again("gRPC subscription cancelled")
            cancel = {"jsonrpc": "2.0", "id": 2, "method": "CancelTask", "params": {"id": task}}
            async with AsyncExitStack() as held:
                body = {**subscribe, "params": {"id": task}}
                response = await held.enter_async_context(
                    http.stream("POST", server.url, json=body, headers=V1)
                )
                assert (await http.post(server.url, json=cancel, headers=V1)).status_code == 200
                ended = [line async for line in response.aiter_lines() if line.startswith("data:")]
            await fits_again("task canceled under its subscription")
    assert any("TASK_STATE_CANCELED" in line for line in ended)
    assert len(endings) == 7
