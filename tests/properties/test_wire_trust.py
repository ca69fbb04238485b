"""What a caller over A2A may decide, and what a role server spends on it.

Real role servers on 127.0.0.1 with real SQLite task stores; the model is
scripted (the only fake). Raw JSON-RPC posts and raw sockets check the exact
codes and when the server answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.helpers import new_text_message
from a2a.types import Role as A2ARole
from a2a.types import SendMessageRequest, TaskState
from support.servers import a2a_client

from a2a_orchestrator.cli.commands.serve import _server_limits
from a2a_orchestrator.cli.parser import build_parser
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec
from a2a_orchestrator.delegation.transports.local import LocalDelegate
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ModelSettings, ScriptedModel, resolve_model
from a2a_orchestrator.models.base import ChatMessage, Model
from a2a_orchestrator.protocol.wire import CONFIG_KEY
from a2a_orchestrator.runtime.factory import apply_child_config
from a2a_orchestrator.runtime.overrides import offered_models
from a2a_orchestrator.runtime.roles import find_role, load_role_file
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.server.serving import MAX_REQUEST_HEAD
from a2a_orchestrator.tools import Workspace

pytestmark = pytest.mark.anyio

TOKEN = "s3cret-token"
SECRET = "SECRET-LINE-do-not-echo-4242"
INVALID_PARAMS = -32602


@asynccontextmanager
async def served(
    tmp_path: Path,
    model: Model,
    *,
    settings: ModelSettings | None = None,
    **options: Any,
) -> AsyncIterator[RunningServer]:
    """The architect role served on loopback; callers may choose models through
    the real resolver (`resolve_model`), so a script path, were it accepted,
    would really be loaded."""
    resolver_settings = settings or ModelSettings()
    async with run_role_server(
        find_role("architect"),
        model,
        tmp_path,
        db=str(tmp_path / ".a2a" / "tasks.db"),
        models=lambda name: resolve_model(name, resolver_settings),
        **options,
    ) as server:
        yield server


def _send(config: Any, *, method: str = "SendMessage", text: str = "hi") -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": method,
        "params": {
            "message": {
                "role": "ROLE_USER",
                "messageId": uuid.uuid4().hex,
                "parts": [{"text": text}],
                "metadata": {CONFIG_KEY: config},
            }
        },
    }


def _v0_3(config: Any) -> dict[str, Any]:
    """The same message as a v0.3 peer sends it (no A2A-Version header)."""
    message = {
        "role": "user",
        "messageId": uuid.uuid4().hex,
        "parts": [{"kind": "text", "text": "hi"}],
        "metadata": {CONFIG_KEY: config},
    }
    return {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}


async def _rpc(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(url + "/", json=body, headers={"A2A-Version": "1.0"})
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        # A streaming call refused up front still answers with one frame.
        frames = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(frames[0]))
    return dict(response.json())


async def _task_count(http: httpx.AsyncClient, url: str) -> int:
    body = {"jsonrpc": "2.0", "id": 9, "method": "ListTasks", "params": {}}
    reply = await _rpc(http, url, body)
    return len(reply["result"].get("tasks", []))


# -- point 1: the wire decides nothing the operator did not allow ------------------


async def test_a_model_script_path_from_the_wire_is_refused_unread(tmp_path: Path) -> None:
    # A file that does not parse: loading it would echo a piece of it back.
    leaky = tmp_path / "leaky.yaml"
    leaky.write_text(f"- text: [unclosed\n{SECRET}: {SECRET}\n")
    # A FIFO blocks whoever opens it for reading until a writer comes: were
    # the server to open it, the request would hang instead of being refused.
    fifo = tmp_path / "trap.json"
    os.mkfifo(fifo)
    with anyio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel([{"text": "never"}])) as server,
            httpx.AsyncClient(timeout=5) as http,
        ):
            replies = [
                await _rpc(http, server.url, _send({"model": f"scripted:{path}"}))
                for path in (leaky, fifo)
            ]
            replies.append(await _rpc(http, server.url, _send({"model": str(leaky)})))
            replies.append(await _rpc(http, server.url, _send({"model": "scripted"})))
            tasks = await _task_count(http, server.url)
    for reply in replies:
        error = reply["error"]
        assert error["code"] == INVALID_PARAMS
        assert "'model'" in error["message"] and "not offered" in error["message"]
        assert "default, mini" in error["message"]
        assert SECRET not in json.dumps(reply)
    assert tasks == 0  # refused before a task existed


async def test_a_listed_model_is_accepted(tmp_path: Path) -> None:
    # The operator's own script stands in for the endpoint behind "fast":
    # offline, every plain model name resolves to `settings.script`.
    operator_script = tmp_path / "operator.json"
    operator_script.write_text(json.dumps([{"text": "answered by the listed model"}]))
    settings = ModelSettings(script=str(operator_script))
    with anyio.fail_after(20):
        async with (
            served(
                tmp_path,
                ScriptedModel([{"text": "server model"}]),
                settings=settings,
                model_names=["fast"],
            ) as server,
            httpx.AsyncClient(timeout=10) as http,
        ):
            reply = await _rpc(http, server.url, _send({"model": "fast", "max_turns": 2}))
            unlisted = await _rpc(http, server.url, _send({"model": "gpt-5"}))
    task = reply["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["artifacts"][0]["parts"][0]["text"] == "answered by the listed model"
    assert unlisted["error"]["code"] == INVALID_PARAMS
    assert "default, fast, mini" in unlisted["error"]["message"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"tools": "read_file"}, "tools"),
        ({"tools": ["read_file", 3]}, "tools"),
        ({"max_turns": "x"}, "max_turns"),
        ({"max_turns": 2.5}, "max_turns"),
        ({"max_turns": 0}, "max_turns"),
        ({"timeout": True}, "timeout"),
        ({"system_prompt": 7}, "system_prompt"),
        ({"shell": "rm -rf /"}, "shell"),
        ({"shared_context": [{"role": "robot", "content": "x"}]}, "shared_context[0].role"),
        ({"tools": ["run_command"]}, "tools"),  # the architect has no run_command
        ({"max_turns": 9}, "max_turns"),  # the architect's maximum is 8
        ({"timeout": 301}, "timeout"),  # and 300 s
        ("not an object", "child config must be an object"),
    ],
)
async def test_wrong_or_wider_config_is_invalid_params_naming_the_field(
    tmp_path: Path, config: Any, field: str
) -> None:
    with anyio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel([{"text": "never"}])) as server,
            httpx.AsyncClient(timeout=5) as http,
        ):
            unary = await _rpc(http, server.url, _send(config))
            streamed = await _rpc(http, server.url, _send(config, method="SendStreamingMessage"))
            legacy = await http.post(server.url + "/", json=_v0_3(config))
            rest = await http.post(
                server.url + "/rest/message:send",
                headers={"A2A-Version": "1.0"},
                json=_send(config)["params"],
            )
            tasks = await _task_count(http, server.url)
    for reply in (unary, streamed, legacy.json()):
        assert reply["error"]["code"] == INVALID_PARAMS, reply
        assert field in reply["error"]["message"]
    assert rest.status_code == 400, rest.text
    assert field in rest.json()["error"]["message"]
    assert tasks == 0


async def test_non_finite_numbers_in_metadata_are_invalid_params(tmp_path: Path) -> None:
    """JSON allows NaN and Infinity; protobuf's Struct cannot turn them back
    into data. That used to be an internal error (500 on REST)."""
    bodies = [_send({"max_turns": float("nan")}), _send({"budget": {"tokens": float("inf")}})]
    plain = _send({})
    plain["params"]["message"]["metadata"] = {"trace": float("nan")}
    bodies.append(plain)
    with anyio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel([{"text": "never"}])) as server,
            httpx.AsyncClient(timeout=5) as http,
        ):
            headers = {"Content-Type": "application/json", "A2A-Version": "1.0"}
            replies = []
            for body in bodies:
                rpc = await http.post(server.url + "/", content=json.dumps(body), headers=headers)
                rest = await http.post(
                    server.url + "/rest/message:send",
                    content=json.dumps(body["params"]),
                    headers=headers,
                )
                replies.append((rpc, rest))
            tasks = await _task_count(http, server.url)
    for rpc, rest in replies:
        assert rpc.json()["error"]["code"] == INVALID_PARAMS, rpc.text
        assert "numbers must be finite" in rpc.json()["error"]["message"]
        assert rest.status_code == 400, rest.text
    assert tasks == 0


async def test_narrower_limits_and_tools_are_accepted(tmp_path: Path) -> None:
    seen: list[Sequence[ChatMessage]] = []

    def model(messages: Sequence[ChatMessage]) -> dict[str, Any]:
        seen.append(list(messages))
        return {"text": "done"}

    config = {
        "system_prompt": "be brief",
        "tools": ["read_file"],
        "max_turns": 8,
        "timeout": 30,
        "shared_context": [{"role": "user", "content": "context from the parent"}],
    }
    with anyio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel(model)) as server,
            httpx.AsyncClient(timeout=10) as http,
        ):
            reply = await _rpc(http, server.url, _send(config))
    assert reply["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", reply
    assert seen[0][0] == {"role": "system", "content": "be brief"}
    assert seen[0][1]["content"] == "context from the parent"


async def test_the_remote_transport_config_passes_through_a_stock_client(tmp_path: Path) -> None:
    # Exactly what `RemoteRun` sends: `ChildConfig.overrides()` as metadata.
    overrides = ChildConfig(
        role="architect", prompt="p", tools=("read_file",), model="mini", max_turns=3, timeout=20
    ).overrides()
    message = new_text_message("hi", role=A2ARole.ROLE_USER)
    message.metadata.update({CONFIG_KEY: overrides})
    with anyio.fail_after(20):
        async with (
            served(tmp_path, ScriptedModel([{"text": "never"}])) as server,
            a2a_client(server.url) as client,
        ):
            states = [
                response.status_update.status.state
                async for response in client.send_message(SendMessageRequest(message=message))
                if response.HasField("status_update")
            ]
    # Offline, `mini` is the offline scripted model: it completes, saying so.
    assert states and states[-1] == TaskState.TASK_STATE_COMPLETED


def test_script_parse_errors_name_the_place_not_the_text(tmp_path: Path) -> None:
    yaml_script = tmp_path / "broken.yaml"
    yaml_script.write_text(f"- text: ok\n- text: [{SECRET}\n")
    json_script = tmp_path / "broken.json"
    json_script.write_text(f'[{{"text": "ok"}},\n {SECRET}]\n')
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(f"- {SECRET}: 1\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"- text: \xff\xfe" + SECRET.encode())
    messages = []
    for path in (yaml_script, json_script, unknown, binary):
        with pytest.raises(ConfigError) as caught:
            ScriptedModel.from_file(path)
        messages.append(str(caught.value))
    for path, message in zip((yaml_script, json_script, unknown, binary), messages, strict=True):
        assert str(path) in message
        assert SECRET not in message
    assert "line 3" in messages[0] or "line 2" in messages[0]
    assert "line 2, column 2" in messages[1]
    assert "turn 1: unknown turn field" in messages[2]


def test_offered_models_come_from_the_role_file_and_the_operator(tmp_path: Path) -> None:
    role_file = tmp_path / "lister.md"
    role_file.write_text("---\nmodels: [fast, meta-llama/Llama-3.1-8B]\n---\nList things.\n")
    role = load_role_file(role_file)
    assert role.models == ("fast", "meta-llama/Llama-3.1-8B")
    assert offered_models(role, ["big", " "]) == {
        "default",
        "mini",
        "fast",
        "meta-llama/Llama-3.1-8B",
        "big",
    }
    # A script in the operator's list would let callers load a file: refused at start.
    with pytest.raises(ConfigError, match="may not be model scripts"):
        offered_models(role, ["scripted:/etc/passwd"])


async def test_local_children_get_the_same_type_checks_but_operator_limits(
    tmp_path: Path,
) -> None:
    delegate = LocalDelegate(
        Workspace(tmp_path), models=lambda name: ScriptedModel([{"text": "x"}])
    )
    spec = AgentSpec(name="architect", role="architect")
    with pytest.raises(ConfigError, match="'tools': must be a list of tool names, not a string"):
        await delegate.open(
            spec,
            ChildConfig(role="architect", prompt="p", tools="read_file"),  # type: ignore[arg-type]
            child_id="c1",
        )
    with pytest.raises(ConfigError, match="'max_turns'"):
        apply_child_config(find_role("architect"), {"max_turns": "x"})
    # The operator's own code may go past the role's limits (it owns them).
    run = await delegate.open(
        spec, ChildConfig(role="architect", prompt="p", max_turns=50), child_id="c2"
    )
    assert run.conversation.max_turns == 50


def test_serve_flags_and_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    monkeypatch.setenv("A2A_MODELS", "fast, big")
    monkeypatch.setenv("A2A_MAX_MEMORY_MB", "64")
    limits = _server_limits(parser.parse_args(["serve", "coder"]))
    assert limits == {
        "model_names": ["fast", "big"],
        "max_memory": 64 * 1024 * 1024,
        "body_timeout": 30.0,
    }
    flags = parser.parse_args(
        ["serve", "coder", "--models", "x", "--max-memory-mb", "1", "--body-timeout", "5"]
    )
    assert _server_limits(flags) == {
        "model_names": ["x"],
        "max_memory": 1024 * 1024,
        "body_timeout": 5.0,
    }
    monkeypatch.setenv("A2A_BODY_TIMEOUT", "soon")
    with pytest.raises(Exception, match="A2A_BODY_TIMEOUT must be a number"):
        _server_limits(parser.parse_args(["serve", "coder"]))


# -- point 8: bounded resources ----------------------------------------------------


async def _read_response(stream: Any) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    while True:
        try:
            chunk = await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            return data
        data += chunk


async def test_unauthenticated_body_is_refused_before_it_is_read(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with served(tmp_path, ScriptedModel([]), token=TOKEN) as server:
            stream = await anyio.connect_tcp("127.0.0.1", server.port)
            async with stream:
                # Announce 4 MiB, send 10 bytes, and wait: a server that read
                # the body before auth would sit waiting for the rest.
                await stream.send(
                    b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/json\r\n"
                    + f"Content-Length: {4 * 1024 * 1024}\r\n\r\n".encode()
                    + b'{"jsonrpc"'
                )
                with anyio.fail_after(3):
                    reply = await _read_response(stream)
    assert reply.startswith(b"HTTP/1.1 401"), reply[:200]
    assert b"connection: close" in reply.lower()


async def test_a_body_sent_to_the_public_card_is_refused_unread(tmp_path: Path) -> None:
    # The card needs no token; a POST there must not make the server buffer
    # a body for a client that never authenticated.
    with anyio.fail_after(20):
        async with served(tmp_path, ScriptedModel([]), token=TOKEN) as server:
            stream = await anyio.connect_tcp("127.0.0.1", server.port)
            async with stream:
                await stream.send(
                    b"POST /.well-known/agent-card.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    + f"Content-Length: {4 * 1024 * 1024}\r\n\r\n".encode()
                    + b"0123456789"
                )
                with anyio.fail_after(3):
                    reply = await _read_response(stream)
            async with httpx.AsyncClient() as http:
                card = await http.get(server.url + "/.well-known/agent-card.json")
    assert reply.startswith(b"HTTP/1.1 405"), reply[:200]
    assert b"connection: close" in reply.lower()
    assert card.status_code == 200


async def test_a_trickled_body_gets_408_within_the_deadline(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with served(tmp_path, ScriptedModel([]), token=TOKEN, body_timeout=1.0) as server:
            stream = await anyio.connect_tcp("127.0.0.1", server.port)
            async with stream, anyio.create_task_group() as tg:

                async def trickle() -> None:
                    # One byte at a time, never the whole body; it ends
                    # quietly once the server closed the connection.
                    with contextlib.suppress(
                        anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
                    ):
                        for _ in range(100):
                            await stream.send(b" ")
                            await anyio.sleep(0.2)

                await stream.send(
                    b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    + f"Authorization: Bearer {TOKEN}\r\n".encode()
                    + b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                )
                started = anyio.current_time()
                tg.start_soon(trickle)
                with anyio.move_on_after(5) as scope:
                    reply = await _read_response(stream)
                elapsed = anyio.current_time() - started
                tg.cancel_scope.cancel()
    assert not scope.cancel_called, "the server never ended the slow request"
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert 0.8 <= elapsed < 4


async def test_a_header_flood_gets_400_before_the_server_buffers_it(tmp_path: Path) -> None:
    sent = 0
    with anyio.fail_after(20):
        async with served(tmp_path, ScriptedModel([])) as server:
            stream = await anyio.connect_tcp("127.0.0.1", server.port)
            async with stream, anyio.create_task_group() as tg:

                async def flood() -> None:
                    # A header that never ends, 4 KiB at a time, each its own
                    # read on the server's side; it stops once the server
                    # closed the connection.
                    nonlocal sent
                    with contextlib.suppress(
                        anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
                    ):
                        await stream.send(b"GET /.well-known/agent-card.json HTTP/1.1\r\n")
                        await stream.send(b"Host: 127.0.0.1\r\nX-Flood: ")
                        for _ in range(256):
                            await stream.send(b"a" * 4096)
                            sent += 4096
                            await anyio.sleep(0.01)

                tg.start_soon(flood)
                with anyio.move_on_after(10) as scope:
                    reply = await _read_response(stream)
                tg.cancel_scope.cancel()
    assert not scope.cancel_called, "the server kept reading the flood"
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    # Refused at the limit, long before the megabyte the flood had to send:
    # the server runs in this event loop, so it reads each piece before the
    # next goes (16 KiB sent, every time in trials).
    assert sent < 4 * MAX_REQUEST_HEAD, sent


def test_servers_parse_requests_with_h11_even_where_httptools_is_installed() -> None:
    # uvicorn's default picks httptools whenever it imports, and that parser
    # has no limit on a request head. A stand-in module is enough to make
    # uvicorn pick it; the test runs in a fresh interpreter so the stand-in
    # reaches no other test.
    program = (
        "import sys, types\n"
        "sys.modules['httptools'] = types.ModuleType('httptools')\n"
        "from uvicorn.protocols.http.h11_impl import H11Protocol\n"
        "from a2a_orchestrator.server.serving import server_config\n"
        "async def app(scope, receive, send): pass\n"
        "config = server_config(app)\n"
        "config.load()\n"
        "print(issubclass(config.http_protocol_class, H11Protocol))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"  # h11, with the head deadline (serving.py)


async def test_conversations_are_bounded_by_bytes_and_rebuilt(tmp_path: Path) -> None:
    megabyte = 1024 * 1024
    limit = 4 * megabyte
    seen: list[list[int]] = []

    def model(messages: Sequence[ChatMessage]) -> dict[str, Any]:
        # What the model was given: the sizes of the user messages.
        seen.append([len(m["content"]) for m in messages if m.get("role") == "user"])
        return {"text": "noted"}

    contexts: list[str] = []
    held: list[int] = []
    with anyio.fail_after(120):
        async with (
            served(tmp_path, ScriptedModel(model), max_memory=limit) as server,
            a2a_client(server.url) as client,
        ):
            executor = server.executor
            for number in range(12):
                message = new_text_message(
                    f"{number:02d}" + "x" * (megabyte - 2), role=A2ARole.ROLE_USER
                )
                message.context_id = f"ctx-{number}"
                async for _ in client.send_message(SendMessageRequest(message=message)):
                    pass
                contexts.append(message.context_id)
                held.append(executor.held_bytes)
            evicted = contexts[0] not in executor.held_contexts
            follow_up = new_text_message("and now?", role=A2ARole.ROLE_USER)
            follow_up.context_id = contexts[0]
            async for _ in client.send_message(SendMessageRequest(message=follow_up)):
                pass
    assert max(held) <= limit, held
    assert held[-1] >= 3 * megabyte  # it still keeps what fits
    assert evicted
    # The evicted context continued its conversation: rebuilt from the task
    # store, the model saw the first megabyte message before the follow-up.
    assert seen[-1] == [megabyte, len("and now?")]


async def test_conversations_are_bounded_by_count_oldest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("a2a_orchestrator.server.executor.MAX_CONVERSATIONS", 3)
    seen: list[list[str]] = []

    def model(messages: Sequence[ChatMessage]) -> dict[str, Any]:
        seen.append([str(m["content"]) for m in messages if m.get("role") == "user"])
        return {"text": "noted"}

    held: list[frozenset[str]] = []
    with anyio.fail_after(60):
        async with (
            served(tmp_path, ScriptedModel(model)) as server,
            a2a_client(server.url) as client,
        ):

            async def say(text: str, context_id: str) -> None:
                message = new_text_message(text, role=A2ARole.ROLE_USER)
                message.context_id = context_id
                async for _ in client.send_message(SendMessageRequest(message=message)):
                    pass
                held.append(server.executor.held_contexts)

            for number in range(5):
                await say(f"first in {number}", f"ctx-{number}")
            # A used context becomes the most recent: ctx-2 outlives ctx-3.
            await say("again in 2", "ctx-2")
            await say("first in 5", "ctx-5")
            # An evicted one is rebuilt from the task store when used again.
            await say("again in 0", "ctx-0")
    assert held[4] == {"ctx-2", "ctx-3", "ctx-4"}
    assert held[5] == {"ctx-2", "ctx-3", "ctx-4"}
    assert held[6] == {"ctx-2", "ctx-4", "ctx-5"}
    assert held[7] == {"ctx-2", "ctx-5", "ctx-0"}
    assert seen[-1] == ["first in 0", "again in 0"]


async def test_a_conversation_waiting_for_input_is_never_evicted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("a2a_orchestrator.server.executor.MAX_CONVERSATIONS", 2)

    def model(messages: Sequence[ChatMessage]) -> dict[str, Any]:
        if messages[1]["content"] != "ask me":
            return {"text": "noted"}
        answers = [m["content"] for m in messages if m.get("role") == "tool"]
        if not answers:
            return {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which?"}}]}
        return {"text": f"answered {answers[0]}"}

    held: list[frozenset[str]] = []
    with anyio.fail_after(60):
        async with (
            served(tmp_path, ScriptedModel(model)) as server,
            a2a_client(server.url) as client,
        ):

            async def say(text: str, context_id: str, task_id: str = "") -> list[Any]:
                message = new_text_message(text, role=A2ARole.ROLE_USER)
                message.context_id, message.task_id = context_id, task_id
                frames = [f async for f in client.send_message(SendMessageRequest(message=message))]
                held.append(server.executor.held_contexts)
                return frames

            asked = await say("ask me", "ctx-q")
            for number in range(1, 4):
                await say(f"first in {number}", f"ctx-{number}")
            answered = await say("blue", "ctx-q", task_id=asked[0].task.id)
    assert asked[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    # Over the bound from the third context on: the idle ones go, oldest
    # first, the one waiting for its answer stays.
    assert held[1:4] == [{"ctx-q", "ctx-1"}, {"ctx-q", "ctx-2"}, {"ctx-q", "ctx-3"}]
    done = answered[-1].status_update.status
    assert done.state == TaskState.TASK_STATE_COMPLETED
    assert done.message.parts[0].text == "answered blue"
