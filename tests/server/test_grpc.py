"""A2A over gRPC: role servers and the orchestrator serve it beside JSON-RPC, the
orchestrator's client uses it when a card prefers it.

Real servers on 127.0.0.1, a2a-sdk's own gRPC client; only the model is scripted.
"""

from __future__ import annotations

import json
import re
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from a2a.client import A2ACardResolver, A2AClientError, Client, ClientConfig, ClientFactory
from a2a.client.client import ClientCallContext
from a2a.helpers import get_message_text
from a2a.types import (
    AgentCard,
    GetTaskRequest,
    SendMessageRequest,
    StreamResponse,
    TaskState,
    a2a_pb2_grpc,
)
from support.messages import user_message
from support.ports import free_port
from support.servers import a2a_client, role_server, serve_process
from support.sessions import run_all_scenarios, session_for

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.server.serving import HEAD_TIMEOUT
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-grpc"


async def card_of(url: str) -> AgentCard:
    async with httpx.AsyncClient(timeout=10) as http:
        return await A2ACardResolver(http, url).get_agent_card()


@asynccontextmanager
async def grpc_client(card: AgentCard, *, streaming: bool = True) -> AsyncIterator[Client]:
    """a2a-sdk's client speaking gRPC only, built from the card like any peer's."""
    config = ClientConfig(
        streaming=streaming,
        supported_protocol_bindings=["GRPC"],
        grpc_channel_factory=grpc.aio.insecure_channel,
    )
    client = ClientFactory(config).create(card)
    try:
        yield client
    finally:
        await client.close()


def bearer(token: str) -> ClientCallContext:
    return ClientCallContext(service_parameters={"Authorization": f"Bearer {token}"})


async def responses_of(
    client: Client, request: SendMessageRequest, context: ClientCallContext | None = None
) -> list[StreamResponse]:
    return [response async for response in client.send_message(request, context=context)]


async def test_the_card_lists_grpc_first_and_the_sdk_client_sends_and_streams(
    tmp_path: Path,
) -> None:
    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        return {"text": f"answer to {messages[-1]['content']}"}

    with anyio.fail_after(30):
        async with role_server(tmp_path, script, grpc_port=0) as server:
            async with httpx.AsyncClient(timeout=10) as http:
                served = (await http.get(server.url + "/.well-known/agent-card.json")).json()
            card = await card_of(server.url)
            async with grpc_client(card, streaming=False) as client:
                sent = await responses_of(client, user_message("one"))
            async with grpc_client(card) as client:
                streamed = await responses_of(client, user_message("two"))
    address = server.grpc_address
    assert address is not None and re.fullmatch(r"127\.0\.0\.1:\d+", address)
    # v1.0: gRPC first (preferred), the HTTP bindings after it.
    interfaces = served["supportedInterfaces"]
    assert interfaces[0] == {"url": address, "protocolBinding": "GRPC", "protocolVersion": "1.0"}
    assert {i["protocolBinding"] for i in interfaces[1:]} >= {"JSONRPC", "HTTP+JSON"}
    if "url" in served:
        # The v0.3 fields keep JSON-RPC as `url`, gRPC among the others.
        assert served["preferredTransport"] == "JSONRPC" and served["url"] == server.url
        assert {"url": address, "transport": "GRPC"} in served["additionalInterfaces"]

    assert [r.WhichOneof("payload") for r in sent] == ["task"]
    task = sent[0].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "answer to one" in [get_message_text(m) for m in [*task.history, task.status.message]]

    kinds = [r.WhichOneof("payload") for r in streamed]
    assert kinds[0] == "task" and "artifact_update" in kinds
    last = streamed[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_COMPLETED
    artifact = next(r.artifact_update.artifact for r in streamed if r.HasField("artifact_update"))
    assert artifact.parts[0].text == "answer to two"


async def test_a_task_started_over_json_rpc_is_read_over_grpc(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with role_server(tmp_path, [{"text": "over json-rpc"}], grpc_port=0) as server:
            async with a2a_client(server.url, streaming=False) as client:
                [answer] = await responses_of(client, user_message("hello"))
            async with grpc_client(await card_of(server.url)) as client:
                read = await client.get_task(GetTaskRequest(id=answer.task.id))
    assert read.id == answer.task.id and read.context_id == answer.task.context_id
    assert read.status.state == TaskState.TASK_STATE_COMPLETED
    assert [m.message_id for m in read.history] == [m.message_id for m in answer.task.history]
    assert read.artifacts[0].parts[0].text == "over json-rpc"


async def test_a_v0_3_grpc_client_is_served_too(tmp_path: Path) -> None:
    """The card's 0.3 gRPC interface: a2a-sdk's compat transport gets the answer."""
    with anyio.fail_after(30):
        async with role_server(tmp_path, [{"text": "over 0.3"}], grpc_port=0) as server:
            card = await card_of(server.url)
            legacy = [
                i
                for i in card.supported_interfaces
                if i.protocol_binding == "GRPC" and i.protocol_version == "0.3"
            ]
            del card.supported_interfaces[:]
            card.supported_interfaces.extend(legacy)
            async with grpc_client(card) as client:
                # Which transport the SDK picked for the 0.3 interface.
                transport = type(client._transport).__name__
                streamed = await responses_of(client, user_message("hi"))
    assert [i.url for i in legacy] == [server.grpc_address]
    assert transport == "CompatGrpcTransport"
    assert streamed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_grpc_needs_the_same_token_as_http(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with role_server(
            tmp_path, [{"text": "for the token holder"}], token=TOKEN, grpc_port=0
        ) as server:
            card = await card_of(server.url)
            assert server.grpc_address is not None
            async with grpc.aio.insecure_channel(server.grpc_address) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                refusals = {}
                for name, metadata in {
                    "none": (),
                    "wrong": (("authorization", "Bearer nope"),),
                    "not bearer": (("authorization", f"Basic {TOKEN}"),),
                }.items():
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.SendMessage(user_message("hi"), metadata=metadata)
                    refusals[name] = refused.value.code()
                # A stream is refused before it starts, like a unary call.
                stream = stub.SendStreamingMessage(user_message("hi"))
                with pytest.raises(grpc.aio.AioRpcError) as refused_stream:
                    await stream.read()
            async with grpc_client(card, streaming=False) as client:
                with pytest.raises(A2AClientError, match="UNAUTHENTICATED"):
                    await responses_of(client, user_message("hi"))
                [answer] = await responses_of(client, user_message("hi"), bearer(TOKEN))
                # The caller is the same owner over both bindings.
            async with a2a_client(server.url, token=TOKEN) as http_client:
                read = await http_client.get_task(GetTaskRequest(id=answer.task.id))
    assert set(refusals.values()) == {grpc.StatusCode.UNAUTHENTICATED}
    assert refused_stream.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert answer.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert read.id == answer.task.id and read.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_grpc_connection_without_a_call_is_closed_one_with_a_stream_is_kept(
    tmp_path: Path,
) -> None:
    # Credentials travel with each call: a client with none connected and
    # held the connection, call-less, for ever (the HTTP side's finding 5).
    # Each channel gets a connection of its own (no shared subchannel).
    own = [("grpc.use_local_subchannel_pool", 1)]
    with anyio.fail_after(60):
        async with role_server(
            tmp_path, [{"delay": 30, "text": "late"}], token=TOKEN, grpc_port=0
        ) as server:
            assert server.grpc_address is not None
            async with (
                grpc.aio.insecure_channel(server.grpc_address, options=own) as idle,
                grpc.aio.insecure_channel(server.grpc_address, options=own) as busy,
            ):
                await idle.channel_ready()
                stub = a2a_pb2_grpc.A2AServiceStub(busy)
                metadata = (("authorization", f"Bearer {TOKEN}"),)
                stream = stub.SendStreamingMessage(user_message("go"), metadata=metadata)
                first = await stream.read()
                opened = anyio.current_time()
                await idle.wait_for_state_change(grpc.ChannelConnectivity.READY)
                closed_after = anyio.current_time() - opened
                await anyio.sleep(1)
                busy_state = busy.get_state()
                stream_done = stream.done()
                stream.cancel()
    assert isinstance(first, StreamResponse) and first.task.id
    assert HEAD_TIMEOUT - 1 <= closed_after <= HEAD_TIMEOUT + 3
    assert busy_state is grpc.ChannelConnectivity.READY and not stream_done


async def test_delegation_over_grpc_gives_the_json_rpc_event_sequences(tmp_path: Path) -> None:
    with anyio.fail_after(40):
        over_json_rpc = await run_all_scenarios("remote", tmp_path / "json-rpc")
        over_grpc = await run_all_scenarios("grpc", tmp_path / "grpc")
    assert set(over_grpc) == {"success", "failing_tool", "input_required", "cancel", "max_turns"}
    for name in over_json_rpc:
        # Events compare by value (their uuids are identity, not value).
        assert over_grpc[name] == over_json_rpc[name], name


async def test_the_orchestrator_client_takes_grpc_when_the_card_prefers_it(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with session_for("grpc", tmp_path, [{"text": "via grpc"}]) as session:
            handle = await session.spawn(ChildConfig(role="coder", prompt="hi"))
            result = await handle.result()
            card = await session.remote.card(session.network.agents["coder"])
            targets = session.remote.grpc.targets
    assert isinstance(result, Done) and result.text == "via grpc"
    assert card.supported_interfaces[0].protocol_binding == "GRPC"
    assert targets == [card.supported_interfaces[0].url]


async def test_a_bad_token_over_grpc_fails_the_child_naming_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WRONG_TOKEN", "nope")
    with anyio.fail_after(30):
        async with role_server(tmp_path, [{"text": "x"}], token=TOKEN, grpc_port=0) as server:
            network = Network.of(
                AgentSpec(name="bad", role="coder", url=server.url, token_env="WRONG_TOKEN")
            )
            async with Session(
                Store(tmp_path / "o.db"), workdir=tmp_path, network=network
            ) as session:
                bad = await (await session.spawn(ChildConfig(role="bad", prompt="x"))).result()
    assert isinstance(bad, Failed) and bad.reason == "error"
    assert "UNAUTHENTICATED" in bad.message and "token" in bad.message


async def test_the_orchestrator_serves_grpc_with_its_token(tmp_path: Path) -> None:
    parent = ScriptedModel([{"text": "the parent answers"}])
    request = user_message("say something")
    request.message.metadata.update({MODE_KEY: "delegate"})
    with anyio.fail_after(40):
        async with AsyncExitStack() as stack:
            server = await stack.enter_async_context(
                run_orchestrator_server(
                    store_path=tmp_path / "orchestrator.db",
                    workdir=tmp_path,
                    network=Network.of(AgentSpec(name="coder", role="coder")),
                    models=lambda name: parent,
                    db=str(tmp_path / "tasks.db"),
                    token=TOKEN,
                    grpc_port=0,
                )
            )
            card = await card_of(server.url)
            async with grpc_client(card) as client:
                with pytest.raises(A2AClientError, match="UNAUTHENTICATED"):
                    await responses_of(client, request)
                streamed = await responses_of(client, request, bearer(TOKEN))
    assert card.supported_interfaces[0].protocol_binding == "GRPC"
    assert card.supported_interfaces[0].url == server.grpc_address
    assert streamed[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    texts = [
        get_message_text(r.status_update.status.message)
        for r in streamed
        if r.HasField("status_update")
    ]
    assert any("the parent answers" in text for text in texts)


async def test_serve_grpc_from_the_variable_stops_cleanly_ending_open_streams(
    tmp_path: Path,
) -> None:
    """`serve` with $A2A_GRPC_PORT: SIGTERM ends a task streaming over gRPC with
    its failure (as over SSE), then the process exits 0."""
    script = tmp_path / "slow.json"
    script.write_text(json.dumps([{"text": "never", "delay": 60}]))
    env = {
        "A2A_GRPC_PORT": "0",
        "A2A_AUTH_TOKEN": TOKEN,
        "A2A_MODEL_SCRIPT": str(script),
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
    }
    frames: list[StreamResponse] = []
    with anyio.fail_after(40):
        with serve_process(tmp_path, "coder", env=env) as (process, url, banner):
            card = await card_of(url)
            async with grpc_client(card) as client:
                stream = client.send_message(user_message("take your time"), context=bearer(TOKEN))
                async for frame in stream:
                    frames.append(frame)
                    if frame.HasField("status_update") and len(frames) == 2:
                        process.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: process.wait(20))
            out = process.stdout.read() if process.stdout else ""
    address = re.search(r"gRPC: (\S+)", banner)
    assert address is not None and address.group(1) == card.supported_interfaces[0].url
    last = frames[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_FAILED
    assert process.returncode == 0 and "coder: stopped" in out


async def test_a_taken_grpc_port_is_a_clear_error_and_frees_the_http_port(tmp_path: Path) -> None:
    http_port = free_port()

    def coder(grpc_port: int) -> Any:
        return run_role_server(
            find_role("coder"),
            ScriptedModel([]),
            tmp_path,
            db=str(tmp_path / "tasks.db"),
            port=http_port,
            grpc_port=grpc_port,
        )

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match=r"cannot listen for gRPC on 127\.0\.0\.1:\d+"):
            async with coder(taken.getsockname()[1]):
                pass
    with pytest.raises(ConfigError, match="is the HTTP port"):
        async with coder(http_port):
            pass
    # Nothing was left bound: a server starts on the same HTTP port afterwards.
    with anyio.fail_after(20):
        async with coder(0) as server:
            assert server.port == http_port and server.grpc_address is not None
