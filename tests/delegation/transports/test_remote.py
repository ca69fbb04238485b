"""The remote transport's edges: discovery errors, auth, v0.3 peers, error translation."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import httpx
import pytest
from a2a.client import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.types import AgentInterface
from support.ports import free_port
from support.servers import role_server

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports import RemoteDelegate, translate_error
from a2a_orchestrator.delegation.transports.remote import POOLS_PER_AGENT
from a2a_orchestrator.errors import (
    AgentUnavailableError,
    ConfigError,
    DelegationError,
    DelegationTimeoutError,
    ProtocolError,
)
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import build_app, build_card, open_task_store
from a2a_orchestrator.server.executor import RoleExecutor
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools import Workspace

pytestmark = pytest.mark.anyio


async def test_unknown_agent_and_unreachable_url_are_clear_errors(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    network = Network.of(AgentSpec(name="gone", role="coder", url=dead))
    with anyio.fail_after(20):
        async with Session(Store(tmp_path / "o.db"), workdir=tmp_path, network=network) as session:
            with pytest.raises(ConfigError, match="Unknown agent or role 'nobody'") as unknown:
                await session.spawn(ChildConfig(role="nobody", prompt="x"))
            with pytest.raises(AgentUnavailableError) as unreachable:
                await session.spawn(ChildConfig(role="gone", prompt="x"))
            children = await session.store.list_children(session_id=session.id)
    assert "gone" in str(unknown.value) and "coder" in str(unknown.value)
    assert dead in str(unreachable.value)
    assert unreachable.value.__cause__ is not None
    assert children == []  # a child that could not start is not recorded as running


async def test_per_agent_bearer_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CODER_TOKEN", "t0ken")
    monkeypatch.setenv("WRONG_TOKEN", "nope")
    with anyio.fail_after(20):
        async with role_server(tmp_path, lambda m: {"text": "authorised"}, token="t0ken") as server:
            network = Network.of(
                AgentSpec(name="good", role="coder", url=server.url, token_env="CODER_TOKEN"),
                AgentSpec(name="bad", role="coder", url=server.url, token_env="WRONG_TOKEN"),
            )
            async with Session(
                Store(tmp_path / "o.db"), workdir=tmp_path, network=network
            ) as session:
                good = await (await session.spawn(ChildConfig(role="good", prompt="x"))).result()
                bad = await (await session.spawn(ChildConfig(role="bad", prompt="x"))).result()
    assert isinstance(good, Done) and good.text == "authorised"
    assert isinstance(bad, Failed) and bad.reason == "error"
    assert "401" in bad.message and "token" in bad.message


async def test_a_peer_on_a2a_v0_3_is_reached_through_the_compat_transport(tmp_path: Path) -> None:
    """A card that offers only protocol 0.3 (Strands Agents, older ADK): same events come back."""
    role = find_role("coder")
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "write_file", "arguments": {"path": "v03.txt", "content": "ok"}}
                ]
            },
            {"text": "done over 0.3"},
        ]
    )
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = build_card(role, url)
    del card.supported_interfaces[:]
    card.supported_interfaces.append(
        AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3")
    )
    del card.capabilities.extensions[:]  # a foreign peer: no control extension
    store = open_task_store(str(tmp_path / "role.db"))
    app = build_app(RoleExecutor(role, model, Workspace(tmp_path), task_store=store), card, store)
    network = Network.of(AgentSpec(name="legacy", role="coder", url=url))
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(serve, app, sock)
            async with Session(
                Store(tmp_path / "o.db"), workdir=tmp_path, network=network
            ) as session:
                handle = await session.spawn(ChildConfig(role="legacy", prompt="write it"))
                with pytest.raises(DelegationError, match="does not support pause"):
                    await handle.pause()
                events = [e async for e in handle.events()]
            tg.cancel_scope.cancel()
    kinds = [e.kind for e in events if e.kind != "message_delta"]
    assert kinds == ["started", "tool_called", "tool_result", "message", "done"]
    assert isinstance(events[-1], Done) and events[-1].text == "done over 0.3"
    assert (tmp_path / "v03.txt").read_text() == "ok"


def test_errors_are_translated_at_one_boundary() -> None:
    url = "http://agent.example:9"
    request = httpx.Request("POST", url)
    connect = A2AClientError("Network communication error")
    connect.__cause__ = httpx.ConnectError("refused", request=request)
    assert isinstance(translate_error(connect, url), AgentUnavailableError)
    assert isinstance(translate_error(A2AClientTimeoutError("slow"), url), DelegationTimeoutError)
    status = A2AClientError("HTTP Error 401")
    status.__cause__ = httpx.HTTPStatusError(
        "401", request=request, response=httpx.Response(401, request=request)
    )
    unauthorised = translate_error(status, url)
    assert isinstance(unauthorised, ProtocolError) and "token" in str(unauthorised)
    assert isinstance(
        translate_error(AgentCardResolutionError("bad card", status_code=404), url), ProtocolError
    )
    for error in (connect, status):
        assert url in str(translate_error(error, url))


async def test_session_event_log_exports_as_jsonl(tmp_path: Path) -> None:
    model = ScriptedModel([{"text": "logged"}])
    network = Network.of(AgentSpec(name="coder", role="coder"))
    store = Store(tmp_path / "o.db")
    with anyio.fail_after(20):
        async with Session(
            store, workdir=tmp_path, network=network, models=lambda n: model
        ) as session:
            handle = await session.spawn(ChildConfig(role="coder", prompt="log me"))
            await handle.wait()
        out = io.StringIO()
        count = await store.export_jsonl(session.id, out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert count == len(lines) == 4
    assert [line["kind"] for line in lines] == ["input", "started", "message", "done"]
    assert lines[0]["payload"] == {"text": "log me"}
    assert lines[3]["payload"]["text"] == "logged" and lines[3]["child_id"] == handle.child_id
    assert len({line["uuid"] for line in lines}) == 4


async def test_a_delegate_spreads_an_agents_streams_over_its_pools() -> None:
    # Unit plumbing, no server: which client a request goes through is all
    # there is to see (httpcore's cost per request grows with the
    # connections of its pool; remote.POOLS_PER_AGENT).
    with anyio.fail_after(10):
        async with RemoteDelegate() as remote:
            first = [remote.http_for("http://127.0.0.1:9/a") for _ in range(POOLS_PER_AGENT)]
            again = [remote.http_for("http://127.0.0.1:9/b") for _ in range(POOLS_PER_AGENT)]
            other = remote.http_for("https://127.0.0.1:9/")
            assert len({id(client) for client in first}) == POOLS_PER_AGENT
            # Taken in turn, each pool kept for the same server (any path on it).
            assert again == first
            # Another origin (the scheme differs) has pools of its own.
            assert all(other is not client for client in first)
        given = httpx.AsyncClient()
        async with RemoteDelegate(http=given) as remote:
            assert {id(remote.http_for("http://127.0.0.1:9/")) for _ in range(3)} == {id(given)}
        await given.aclose()
