"""Push notifications: role servers deliver task updates by webhook, and the
orchestrator delegates in push mode. Real servers on 127.0.0.1 throughout;
only the models are scripted."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2, a2a_v0_3_pb2_grpc
from a2a.server.context import ServerCallContext
from a2a.types import (
    InvalidParamsError,
    ListTaskPushNotificationConfigsRequest,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
    TaskState,
    a2a_pb2_grpc,
)
from google.protobuf.json_format import MessageToDict, ParseDict
from google.rpc import error_details_pb2, status_pb2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support.messages import user_message
from support.processes import CRASH
from support.servers import a2a_client

from a2a_orchestrator.delegation.network import AgentSpec, Network, load_agent_file
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.push_receiver import PushReceiver
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.protocol.decoding import StreamDecoder
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.server.push import PushPolicy
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.storage.tasks.push import PushLimits, open_push_config_store

pytestmark = pytest.mark.anyio

LOOPBACK = PushPolicy.parse("127.0.0.0/8")


def coder_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Write a file, then answer (whatever the task)."""
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        call = {"name": "write_file", "arguments": {"path": "out.txt", "content": "x"}}
        return {"delay": 0.3, "tool_calls": [call]}
    return {"text": "wrote out.txt"}


@asynccontextmanager
async def coder_server(
    workdir: Path, db: Path, *, push_policy: PushPolicy | None = LOOPBACK, script: Any = None
) -> AsyncIterator[RunningServer]:
    async with run_role_server(
        find_role("coder"),
        ScriptedModel(script or coder_script),
        workdir,
        db=str(db),
        push_policy=push_policy,
    ) as server:
        yield server


@dataclass
class Hook:
    """A webhook receiver: what was posted to it, with its headers."""

    url: str = ""
    posts: list[tuple[dict[str, str], StreamResponse]] = field(default_factory=list)
    arrived: anyio.Event = field(default_factory=anyio.Event)

    async def endpoint(self, request: Request) -> Response:
        frame = ParseDict(await request.json(), StreamResponse(), ignore_unknown_fields=True)
        self.posts.append((dict(request.headers), frame))
        self.arrived.set()
        self.arrived = anyio.Event()
        return Response(status_code=204)

    async def wait_for(self, state: TaskState) -> None:
        while not any(_state(frame) == state for _, frame in self.posts):
            await self.arrived.wait()


def _state(frame: StreamResponse) -> int:
    if frame.HasField("task"):
        return frame.task.status.state
    if frame.HasField("status_update"):
        return frame.status_update.status.state
    return TaskState.TASK_STATE_UNSPECIFIED


@asynccontextmanager
async def webhook() -> AsyncIterator[Hook]:
    hook = Hook()
    sock = bind_socket("127.0.0.1", 0)
    app = Starlette(routes=[Route("/hook", hook.endpoint, methods=["POST"])])
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, app, sock)
        hook.url = f"http://127.0.0.1:{port}/hook"
        yield hook
        tg.cancel_scope.cancel()


def with_push(request: SendMessageRequest, url: str, token: str) -> SendMessageRequest:
    config = TaskPushNotificationConfig(url=url, token=token)
    request.configuration.task_push_notification_config.CopyFrom(config)
    request.configuration.return_immediately = True
    return request


async def test_a_role_server_posts_each_update_to_the_webhook_with_its_token(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with (
            webhook() as hook,
            coder_server(tmp_path, tmp_path / "role.db") as server,
            a2a_client(server.url, streaming=False) as client,
        ):
            async with httpx.AsyncClient() as http:
                card = await http.get(server.url + "/.well-known/agent-card.json")
            request = with_push(user_message("write out.txt"), hook.url, "secret-1")
            answer = [r async for r in client.send_message(request)]
            await hook.wait_for(TaskState.TASK_STATE_COMPLETED)
    assert card.json()["capabilities"]["pushNotifications"] is True
    # Answered at once; the rest came by webhook, each post with the token.
    assert answer[0].task.status.state != TaskState.TASK_STATE_COMPLETED
    assert {headers["x-a2a-notification-token"] for headers, _ in hook.posts} == {"secret-1"}
    task_ids = {getattr(f, str(f.WhichOneof("payload"))).task_id for _, f in hook.posts[1:]}
    assert hook.posts[0][1].task.id == answer[0].task.id and task_ids == {answer[0].task.id}
    decoder = StreamDecoder()
    events = [e for _, frame in hook.posts for e in decoder.decode(frame)]
    assert [e.kind for e in events if e.kind != "message_delta"] == [
        "started",
        "tool_called",
        "tool_result",
        "message",
        "done",
    ]
    assert isinstance(events[-1], Done) and events[-1].text == "wrote out.txt"
    assert (tmp_path / "out.txt").read_text() == "x"


async def rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with httpx.AsyncClient() as http:
        response = await http.post(url, json=body, headers={"A2A-Version": "1.0"})
    return dict(response.json())


INTERNAL = [
    "http://127.0.0.1:9/hook",
    "http://localhost:9/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/hook",
    "http://[::1]:9/hook",
    "http://[::ffff:192.168.0.1]/hook",
    "file:///etc/passwd",
    "ftp://example.com/hook",
]


async def test_a_webhook_at_an_internal_address_is_refused_unless_allowed(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with coder_server(tmp_path, tmp_path / "role.db", push_policy=None) as server:
            async with a2a_client(server.url) as client:
                answer = [r async for r in client.send_message(user_message("go"))]
                task_id = answer[0].task.id
            created = [
                await rpc(
                    server.url,
                    "CreateTaskPushNotificationConfig",
                    {"taskId": task_id, "url": url, "token": "t"},
                )
                for url in INTERNAL
            ]
            message = {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "go"}]}
            config = {"url": "http://169.254.169.254/", "token": "t"}
            sent = await rpc(
                server.url,
                "SendMessage",
                {"message": message, "configuration": {"taskPushNotificationConfig": config}},
            )
            async with httpx.AsyncClient() as http:
                rest = await http.post(
                    f"{server.url}/rest/tasks/{task_id}/pushNotificationConfigs",
                    json={"url": "http://127.0.0.1:9/hook", "token": "t"},
                    headers={"A2A-Version": "1.0"},
                )
            listed = await rpc(server.url, "ListTaskPushNotificationConfigs", {"taskId": task_id})
    assert [c.get("error", {}).get("code") for c in created] == [-32602] * len(INTERNAL)
    assert sent["error"]["code"] == -32602
    assert rest.status_code == 400
    assert listed["result"].get("configs", []) == []
    # What the operator allows passes; a public address passes by itself.
    allowed = PushPolicy.parse("10.0.0.0/8, 127.0.0.0/8")
    assert await allowed.refusal("http://10.1.2.3/hook") is None
    assert await allowed.refusal("http://127.0.0.1:9/hook") is None
    assert await allowed.refusal("http://169.254.169.254/") is not None
    assert await PushPolicy().refusal("http://8.8.8.8/hook") is None


# A refused URL and what its refusal must say: the reason, and the address
# the URL itself resolved to (nothing of the operator's allow-list).
REFUSALS = {
    "http://169.254.169.254/latest/meta-data/": (
        "not-public",
        "169.254.169.254",
        "resolves to 169.254.169.254, which is not public",
    ),
    "http://no-such-host.invalid/hook": (
        "does-not-resolve",
        None,
        "no-such-host.invalid does not resolve",
    ),
    "ftp://example.com/hook": ("not-http", None, "not an http(s) URL"),
}


async def test_a_refused_webhook_says_why_on_every_binding(tmp_path: Path) -> None:
    # Issue 29: the reason was only in the server's log.
    answers: dict[tuple[str, str], tuple[str, Any]] = {}
    async with (
        run_role_server(
            find_role("coder"),
            ScriptedModel(coder_script),
            tmp_path,
            db=str(tmp_path / "role.db"),
            push_policy=PushPolicy(LOOPBACK.allow),
            grpc_port=0,
        ) as server,
        a2a_client(server.url) as client,
        httpx.AsyncClient() as http,
    ):
        with anyio.fail_after(60):
            answer = [r async for r in client.send_message(user_message("go"))]
            task = answer[0].task.id
            assert server.grpc_address is not None
            channel = grpc.aio.insecure_channel(server.grpc_address)
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            stub_v03 = a2a_v0_3_pb2_grpc.A2AServiceStub(channel)
            for url in REFUSALS:
                v1 = {"taskId": task, "url": url, "token": "t"}
                error = (await rpc(server.url, "CreateTaskPushNotificationConfig", v1))["error"]
                assert error["code"] == -32602
                answers["json-rpc", url] = error["message"], error.get("data")
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tasks/pushNotificationConfig/set",
                    "params": {"taskId": task, "pushNotificationConfig": {"url": url}},
                }
                error = (await http.post(server.url, json=body)).json()["error"]
                assert error["code"] == -32602
                answers["json-rpc 0.3", url] = error["message"], error.get("data")
                rest = await http.post(
                    f"{server.url}/rest/tasks/{task}/pushNotificationConfigs",
                    json=v1,
                    headers={"A2A-Version": "1.0"},
                )
                assert rest.status_code == 400, rest.text
                error = rest.json()["error"]
                answers["http+json", url] = error["message"], error.get("details")
                with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
                    await stub.CreateTaskPushNotificationConfig(
                        ParseDict(v1, TaskPushNotificationConfig())
                    )
                assert over_grpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                answers["grpc", url] = (
                    over_grpc.value.details() or "",
                    grpc_error_info(over_grpc.value),
                )
                with pytest.raises(grpc.aio.AioRpcError) as over_grpc_v03:
                    await stub_v03.CreateTaskPushNotificationConfig(
                        a2a_v0_3_pb2.CreateTaskPushNotificationConfigRequest(
                            parent=f"tasks/{task}",
                            config_id="c",
                            config=a2a_v0_3_pb2.TaskPushNotificationConfig(
                                name=f"tasks/{task}/pushNotificationConfigs/c",
                                push_notification_config=a2a_v0_3_pb2.PushNotificationConfig(
                                    id="c", url=url
                                ),
                            ),
                        )
                    )
                assert over_grpc_v03.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                # The v0.3 gRPC binding's errors carry a message only.
                answers["grpc 0.3", url] = over_grpc_v03.value.details() or "", None
            await channel.close()
            listed = await rpc(server.url, "ListTaskPushNotificationConfigs", {"taskId": task})
    assert listed["result"].get("configs", []) == []
    for (binding, url), (message, data) in answers.items():
        reason, address, says = REFUSALS[url]
        assert "Invalid push notification URL: " in message, (binding, message)
        assert says in message, (binding, message)
        expected = {"reason": reason, **({"address": address} if address else {})}
        # 0.3 JSON-RPC carries `data` as is; 1.0 bindings as an ErrorInfo's metadata.
        if binding == "grpc 0.3":
            assert data is None
        elif binding == "json-rpc 0.3":
            assert data == expected, (binding, data)
        else:
            [info] = data
            assert info["reason"] == "INVALID_PARAMS" and info["metadata"] == expected, binding
        assert "127.0.0.0" not in message + str(data)  # the allow-list stays unsaid


def grpc_error_info(error: grpc.aio.AioRpcError) -> list[dict[str, Any]]:
    """The ErrorInfo details of a gRPC error's rich status, as JSON."""
    metadata = dict(error.trailing_metadata() or ())
    status = status_pb2.Status.FromString(metadata["grpc-status-details-bin"])
    found = []
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            found.append(MessageToDict(info))
    return found


def test_an_ipv6_address_wrapping_an_internal_ipv4_one_is_refused() -> None:
    # 6to4 (2002::/16) wraps loopback and the metadata address; Teredo,
    # IPv4-compatible and NAT64 addresses wrap one too.
    wrapped = [
        "http://[2002:7f00:1::]/hook",
        "http://[2002:a9fe:a9fe::]/hook",
        "http://[2002:a00:1::1]/hook",
        "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/hook",  # Teredo, client 127.0.0.1
        "http://[::127.0.0.1]/hook",
        "http://[64:ff9b::a9fe:a9fe]/hook",
    ]

    async def check() -> None:
        for url in wrapped:
            assert await PushPolicy().refusal(url) is not None, url
        # A 6to4 address of a public one stays callable; the operator's
        # allow-list covers the address it wraps.
        assert await PushPolicy().refusal("http://[2002:808:808::1]/hook") is None
        assert await LOOPBACK.refusal("http://[2002:7f00:1::]/hook") is None

    anyio.run(check)


LIMITS = PushLimits(per_task=3, per_owner=4)


@pytest.mark.parametrize("store", ["file", "url"])
async def test_push_configs_are_limited_per_task_per_caller_and_in_size(
    tmp_path: Path, store: str
) -> None:
    # `url`: the database store replicas use (a2a-sdk's, on SQLAlchemy).
    db = tmp_path / "role.db"
    async with (
        run_role_server(
            find_role("coder"),
            ScriptedModel(coder_script),
            tmp_path,
            db=str(db) if store == "file" else f"sqlite+aiosqlite:///{db}",
            push_policy=PushPolicy(LOOPBACK.allow, LIMITS),
        ) as server,
        a2a_client(server.url) as client,
    ):
        with anyio.fail_after(30):
            tasks = []
            for n in (1, 2):
                answer = [r async for r in client.send_message(user_message(f"go {n}"))]
                tasks.append(answer[0].task.id)
            first, second = tasks

            async def create(task_id: str, config_id: str, **extra: str) -> dict[str, Any]:
                config = {"url": "http://127.0.0.1:9/hook", "token": "t", **extra}
                return await rpc(
                    server.url,
                    "CreateTaskPushNotificationConfig",
                    {"taskId": task_id, "id": config_id, **config},
                )

            made = [await create(first, f"c{i}") for i in range(3)]
            past_task = await create(first, "c3")
            replaced = await create(first, "c0", token="again")
            other_task = await create(second, "c0")
            past_owner = await create(second, "c1")
            long_url = await create(first, "c0", url="http://127.0.0.1:9/" + "a" * 2048)
            long_token = await create(first, "c0", token="t" * 1025)
            message = {"role": "ROLE_USER", "messageId": "m-x", "parts": [{"text": "go"}]}
            sent = await rpc(
                server.url,
                "SendMessage",
                {
                    "message": message,
                    "configuration": {
                        "taskPushNotificationConfig": {"url": "http://127.0.0.1:9/h", "token": "t"}
                    },
                },
            )
            async with httpx.AsyncClient() as http:
                rest = await http.post(
                    f"{server.url}/rest/tasks/{first}/pushNotificationConfigs",
                    json={"url": "http://127.0.0.1:9/hook", "token": "t", "id": "r"},
                    headers={"A2A-Version": "1.0"},
                )
            listed = await rpc(server.url, "ListTaskPushNotificationConfigs", {"taskId": first})
    assert all("result" in answer for answer in [*made, replaced, other_task])
    assert past_task["error"]["code"] == -32602
    assert "limit is 3 per task" in past_task["error"]["message"]
    assert past_owner["error"]["code"] == -32602
    assert "limit is 4 per caller" in past_owner["error"]["message"]
    assert long_url["error"]["code"] == -32602 and "2048" in long_url["error"]["message"]
    assert long_token["error"]["code"] == -32602 and "1024" in long_token["error"]["message"]
    assert sent["error"]["code"] == -32602  # a new task's config, past the caller's limit
    assert rest.status_code == 400 and "per task" in rest.text
    configs = listed["result"]["configs"]
    assert sorted(c["id"] for c in configs) == ["c0", "c1", "c2"]
    assert next(c["token"] for c in configs if c["id"] == "c0") == "again"


async def test_every_field_of_a_push_config_is_bounded_on_every_binding(tmp_path: Path) -> None:
    # Issue 26 finding 7: credentials and the config id had no limit (20
    # configs of 3.5 MB each were stored, and sent as headers).
    big = {"credentials": "c" * 5000, "id": "i" * 300, "scheme": "s" * 100}
    refused: dict[tuple[str, str], str] = {}
    async with (
        run_role_server(
            find_role("coder"),
            ScriptedModel(coder_script),
            tmp_path,
            db=str(tmp_path / "role.db"),
            push_policy=PushPolicy(LOOPBACK.allow),
            grpc_port=0,
        ) as server,
        a2a_client(server.url) as client,
        httpx.AsyncClient() as http,
    ):
        with anyio.fail_after(60):
            answer = [r async for r in client.send_message(user_message("go"))]
            task = answer[0].task.id
            assert server.grpc_address is not None
            channel = grpc.aio.insecure_channel(server.grpc_address)
            stub = a2a_pb2_grpc.A2AServiceStub(channel)
            for field_name in big:
                scheme = big["scheme"] if field_name == "scheme" else "Bearer"
                credentials = big["credentials"] if field_name == "credentials" else "secret"
                config_id = big["id"] if field_name == "id" else "ok"
                v1 = {
                    "taskId": task,
                    "id": config_id,
                    "url": "http://127.0.0.1:9/hook",
                    "authentication": {"scheme": scheme, "credentials": credentials},
                }
                answer_rpc = await rpc(server.url, "CreateTaskPushNotificationConfig", v1)
                refused["json-rpc", field_name] = answer_rpc["error"]["message"]
                v03 = {
                    "taskId": task,
                    "pushNotificationConfig": {
                        "id": config_id,
                        "url": "http://127.0.0.1:9/hook",
                        "authentication": {"schemes": [scheme], "credentials": credentials},
                    },
                }
                body = {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tasks/pushNotificationConfig/set",
                    "params": v03,
                }
                answer_v03 = (await http.post(server.url, json=body)).json()
                refused["json-rpc 0.3", field_name] = answer_v03["error"]["message"]
                rest = await http.post(
                    f"{server.url}/rest/tasks/{task}/pushNotificationConfigs",
                    json=v1,
                    headers={"A2A-Version": "1.0"},
                )
                assert rest.status_code == 400, rest.text
                refused["http+json", field_name] = rest.json()["error"]["message"]
                config = ParseDict(v1, TaskPushNotificationConfig())
                with pytest.raises(grpc.aio.AioRpcError) as over_grpc:
                    await stub.CreateTaskPushNotificationConfig(config)
                assert over_grpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                refused["grpc", field_name] = over_grpc.value.details() or ""
            await channel.close()
            listed = await rpc(server.url, "ListTaskPushNotificationConfigs", {"taskId": task})
    names = {"credentials": "credentials", "id": "id", "scheme": "scheme"}
    for (binding, field_name), message in refused.items():
        assert names[field_name] in message and "longer than" in message, (binding, message)
    assert listed["result"].get("configs", []) == []  # nothing stored


def _with_unknown_fields(
    config: TaskPushNotificationConfig, size: int
) -> TaskPushNotificationConfig:
    """`config` as a binary (gRPC) client may send it: plus a field 99 of
    `size` bytes, at the top and inside `authentication`, which this
    protocol version does not know (protobuf keeps such bytes when parsing)."""

    def field_99(data: bytes) -> bytes:
        return b"\x9a\x06" + _varint(len(data)) + data  # field 99, length-delimited

    auth = config.authentication.SerializeToString() + field_99(b"a" * size)
    top = config.SerializeToString() + field_99(b"u" * size)
    # Field 6 (authentication) again: protobuf merges it into the first.
    return TaskPushNotificationConfig.FromString(top + b"\x32" + _varint(len(auth)) + auth)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        out += bytes([n & 0x7F | (0x80 if n >> 7 else 0)])
        n >>= 7
        if not n:
            return out


@pytest.mark.parametrize("store", ["file", "url"])
async def test_fields_a_push_config_does_not_know_are_not_stored(
    tmp_path: Path, store: str
) -> None:
    # Over gRPC a config arrives as protobuf bytes, and fields this version
    # does not know were kept and stored whole: 3.5 MB configs past every
    # field limit (issue 26, finding 7, by another door).
    size = 1024 * 1024
    db = tmp_path / "role.db"
    async with run_role_server(
        find_role("coder"),
        ScriptedModel(coder_script),
        tmp_path,
        db=str(db) if store == "file" else f"sqlite+aiosqlite:///{db}",
        push_policy=LOOPBACK,
        grpc_port=0,
    ) as server:
        assert server.grpc_address is not None
        with anyio.fail_after(60):
            async with (
                a2a_client(server.url) as client,
                grpc.aio.insecure_channel(
                    server.grpc_address, options=[("grpc.max_send_message_length", 4 * size)]
                ) as channel,
            ):
                answer = [r async for r in client.send_message(user_message("go"))]
                task = answer[0].task.id
                config = ParseDict(
                    {
                        "taskId": task,
                        "id": "c",
                        "url": "http://127.0.0.1:9/hook",
                        "authentication": {"scheme": "Bearer", "credentials": "secret"},
                    },
                    TaskPushNotificationConfig(),
                )
                sent = _with_unknown_fields(config, size)
                assert sent.ByteSize() > 2 * size
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                echoed = await stub.CreateTaskPushNotificationConfig(sent)
            listed = await rpc(server.url, "ListTaskPushNotificationConfigs", {"taskId": task})
    assert echoed.ByteSize() < 1024
    assert [c["authentication"]["credentials"] for c in listed["result"]["configs"]] == ["secret"]
    assert db.stat().st_size + sum(p.stat().st_size for p in tmp_path.glob("role.db-*")) < size


async def test_push_configs_kept_in_memory_are_limited_too() -> None:
    configs = open_push_config_store(object(), LIMITS)
    context = ServerCallContext()
    for n in range(3):
        await configs.set_info("t1", TaskPushNotificationConfig(id=f"c{n}", url="u"), context)
    with pytest.raises(InvalidParamsError, match="3 per task"):
        await configs.set_info("t1", TaskPushNotificationConfig(id="c3", url="u"), context)
    await configs.set_info("t2", TaskPushNotificationConfig(id="c0", url="u"), context)
    with pytest.raises(InvalidParamsError, match="4 per caller"):
        await configs.set_info("t2", TaskPushNotificationConfig(id="c1", url="u"), context)
    assert len(await configs.get_info_for_dispatch("t1")) == 3
    fresh = open_push_config_store(object(), LIMITS)
    odd = _with_unknown_fields(TaskPushNotificationConfig(id="c9", url="u"), 100_000)
    await fresh.set_info("t9", odd, context)
    assert [c.ByteSize() < 100 for c in await fresh.get_info_for_dispatch("t9")] == [True]


def test_push_limits_come_from_the_flags_else_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("A2A_PUSH_MAX_PER_TASK", "7")
    assert PushPolicy.from_settings("").limits == PushLimits(per_task=7)
    assert PushPolicy.from_settings("", max_per_task=2, max_per_owner=5).limits == PushLimits(
        per_task=2, per_owner=5
    )
    monkeypatch.setenv("A2A_PUSH_MAX_PER_OWNER", "0")
    with pytest.raises(ConfigError, match="at least 1"):
        PushPolicy.from_settings("")


async def test_webhook_configs_survive_a_role_server_restart(tmp_path: Path) -> None:
    db = tmp_path / "role.db"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(m["role"] == "tool" for m in messages):
            question = {"name": "ask_parent", "arguments": {"question": "Which file?"}}
            return {"tool_calls": [question]}
        return {"text": "done at last"}

    with anyio.fail_after(40):
        async with webhook() as hook:
            async with coder_server(tmp_path, db, script=script) as server:
                async with a2a_client(server.url) as client:
                    responses = [r async for r in client.send_message(user_message("go"))]
                    task_id = responses[-1].status_update.task_id
                    await client.create_task_push_notification_config(
                        TaskPushNotificationConfig(
                            task_id=task_id, id="mine", url=hook.url, token="kept"
                        )
                    )
            async with coder_server(tmp_path, db, script=script) as server:
                async with a2a_client(server.url, streaming=False) as client:
                    listed = await client.list_task_push_notification_configs(
                        ListTaskPushNotificationConfigsRequest(task_id=task_id)
                    )
                    follow_up = user_message("out.txt", task_id=task_id)
                    follow_up.configuration.return_immediately = True
                    [r async for r in client.send_message(follow_up)]
                    await hook.wait_for(TaskState.TASK_STATE_COMPLETED)
    assert [(c.id, c.url, c.token) for c in listed.configs] == [("mine", hook.url, "kept")]
    decoder = StreamDecoder()
    events = [e for _, frame in hook.posts for e in decoder.decode(frame)]
    assert isinstance(events[-1], Done) and events[-1].text == "done at last"
    assert {headers["x-a2a-notification-token"] for headers, _ in hook.posts} == {"kept"}


def parent_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        agents = [
            {"role": "streamer", "prompt": "write out.txt"},
            {"role": "pusher", "prompt": "write out.txt"},
        ]
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": agents}}]}
    finals = sum(m["content"].count("FINAL_ANSWER") for m in messages if m["role"] == "user")
    if finals < 2:
        return {"tool_calls": [{"name": "agent_manage", "arguments": {}}]}
    return {"text": "both answered\nTASK_DONE"}


def reader_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Read a file, then answer (the same for every child)."""
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        call = {"name": "read_file", "arguments": {"path": "seed.txt"}}
        return {"delay": 0.3, "tool_calls": [call]}
    return {"text": "seed read"}


def _shape(payload: dict[str, Any]) -> dict[str, Any]:
    """An event as a comparison sees it: without what differs per run."""
    drop = {"uuid", "call_id", "id", "created_at"}
    shaped = {k: v for k, v in payload.items() if k not in drop}
    for key in ("spent", "usage"):
        if isinstance(shaped.get(key), dict):
            shaped[key] = {k: v for k, v in shaped[key].items() if k != "seconds"}
    return shaped


async def test_the_orchestrator_delegates_in_push_mode_with_the_events_of_a_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCH_TOKEN", "caller-token")
    store_path = tmp_path / "orchestrator.db"
    parent = ScriptedModel(parent_script)
    with anyio.fail_after(50):
        async with AsyncExitStack() as stack:
            (tmp_path / "seed.txt").write_text("seed")
            role = await stack.enter_async_context(
                coder_server(tmp_path, tmp_path / "role.db", script=reader_script)
            )
            network = Network.of(
                AgentSpec(name="streamer", role="coder", url=role.url),
                AgentSpec(name="pusher", role="coder", url=role.url, push=True),
            )
            orchestrator = await stack.enter_async_context(
                run_orchestrator_server(
                    store_path=store_path,
                    workdir=tmp_path,
                    network=network,
                    models=lambda name: parent,
                    db=str(tmp_path / "orchestrator-tasks.db"),
                    # The webhook needs no caller token: it checks the child's own.
                    token="caller-token",
                )
            )
            async with a2a_client(orchestrator.url, token="caller-token") as client:
                request = user_message("delegate")
                request.message.metadata.update({MODE_KEY: "delegate"})
                responses = [r async for r in client.send_message(request)]
            session_id = responses[-1].status_update.context_id
            async with httpx.AsyncClient() as http:
                forged = await http.post(f"{orchestrator.url}/a2a/push/nobody", json={}, headers={})
            store = Store(store_path)
            children = {c.agent: c for c in await store.list_children(session_id=session_id)}
            events = {
                agent: await store.events(session_id, child_id=child.child_id)
                for agent, child in children.items()
            }
            store.close()
            async with a2a_client(role.url) as client:
                webhooks = {
                    agent: await client.list_task_push_notification_configs(
                        ListTaskPushNotificationConfigsRequest(task_id=child.a2a_task_id)
                    )
                    for agent, child in children.items()
                }
    # The pusher's updates were pushed to the orchestrator's endpoint.
    assert [c.url for c in webhooks["pusher"].configs] == [
        f"{orchestrator.url}/a2a/push/{children['pusher'].child_id}"
    ]
    assert list(webhooks["streamer"].configs) == []
    assert responses[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert {a: c.status for a, c in children.items()} == {
        "streamer": "completed",
        "pusher": "completed",
    }
    streamed = [(e.kind, _shape(e.payload)) for e in events["streamer"]]
    pushed = [(e.kind, _shape(e.payload)) for e in events["pusher"]]
    assert pushed == streamed
    assert [k for k, _ in pushed if k not in ("input", "message_delta", "message")] == [
        "started",
        "tool_called",
        "tool_result",
        "done",
    ]
    assert forged.status_code == 401


REMOTE_SCRIPT = [
    {
        "delay": 2.0,
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "remote.txt", "content": "remote"}}
        ],
    },
    {"delay": 1.0, "text": "remote done"},
]


@asynccontextmanager
async def receiver_served(store: Store) -> AsyncIterator[PushReceiver]:
    sock = bind_socket("127.0.0.1", 0)
    receiver = PushReceiver(store, f"http://127.0.0.1:{sock.getsockname()[1]}")
    async with anyio.create_task_group() as tg:
        await tg.start(serve, Starlette(routes=receiver.routes()), sock)
        yield receiver
        tg.cancel_scope.cancel()


async def test_the_webhook_endpoint_answers_400_to_a_body_that_is_not_a_frame(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "orchestrator.db")
    deep = b"[" * 100_000 + b"]" * 100_000
    deep_object = b'{"task": ' * 5000 + b"{}" + b"}" * 5000
    bodies = [b"1", b"null", b'"text"', b"[]", b"true", deep, deep_object, b"{", b'{"task": 1}']
    try:
        with anyio.fail_after(30):
            async with receiver_served(store) as receiver, httpx.AsyncClient() as http:
                inbox = await receiver.open("c1")
                headers = {"X-A2A-Notification-Token": inbox.token}
                url = receiver.url_for("c1")
                answers = [await http.post(url, content=body, headers=headers) for body in bodies]
                status = {"state": "TASK_STATE_WORKING"}
                frame = {"statusUpdate": {"taskId": "t1", "status": status}}
                good = await http.post(url, json=frame, headers=headers)
    finally:
        store.close()
    assert [a.status_code for a in answers] == [400] * len(bodies)
    assert all("not a StreamResponse" in a.json()["error"] for a in answers)
    assert good.status_code == 204 and receiver.accepted == 1
    assert (await inbox.next()).status_update.task_id == "t1"


async def test_kill_9_the_orchestrator_then_recovery_completes_the_push_child_once(
    tmp_path: Path,
) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    store_path = tmp_path / "orchestrator.db"
    with anyio.fail_after(50):
        async with coder_server(workdir, tmp_path / "role.db", script=REMOTE_SCRIPT) as server:
            parent = subprocess.Popen(
                [
                    sys.executable,
                    str(CRASH / "crash_push.py"),
                    str(store_path),
                    "s1",
                    str(workdir),
                    server.url,
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                assert parent.stdout is not None
                line = await anyio.to_thread.run_sync(parent.stdout.readline)
                assert line.strip() == "READY", line + (
                    parent.stderr.read() if parent.stderr else ""
                )
                store = Store(store_path)
                while not await store.events("s1", child_id="p1", kinds=["started"]):
                    await anyio.sleep(0.05)
                before = await store.get_child("p1")
                parent.send_signal(signal.SIGKILL)
                await anyio.to_thread.run_sync(parent.wait)
            finally:
                if parent.poll() is None:
                    parent.kill()
            assert before is not None and before.status == "running" and before.a2a_task_id
            # Back on another port: recovery registers the new webhook URL.
            async with (
                receiver_served(store) as receiver,
                Session(
                    store,
                    workdir=workdir,
                    network=Network.of(
                        AgentSpec(name="pusher", role="coder", url=server.url, push=True)
                    ),
                    session_id="s1",
                    remote=functools.partial(RemoteDelegate, push=receiver),
                ) as session,
            ):
                recovered = await session.recover()
                assert [h.child_id for h in recovered] == ["p1"]
                result = await recovered[0].result()
                accepted = receiver.accepted
                async with a2a_client(server.url) as client:
                    configs = await client.list_task_push_notification_configs(
                        ListTaskPushNotificationConfigsRequest(task_id=before.a2a_task_id)
                    )
            after = await store.get_child("p1")
            events = await store.events("s1", child_id="p1")
            store.close()
    assert isinstance(result, Done) and result.text == "remote done"
    assert after is not None and after.status == "completed"
    assert (workdir / "remote.txt").read_text() == "remote"
    # Updates after the restart came by push, to the new address.
    assert accepted > 0
    assert [c.url for c in configs.configs] == [receiver.url_for("p1")]
    kinds = [e.kind for e in events]
    uuids = [e.uuid for e in events]
    assert len(uuids) == len(set(uuids))
    assert kinds.count("started") == 1 and kinds.count("done") == 1
    assert kinds[-1] == "done"


def test_an_agent_file_puts_its_agent_in_push_mode(tmp_path: Path) -> None:
    path = tmp_path / "coder.toml"
    path.write_text('role = "coder"\nurl = "https://coder.example"\npush = true\n')
    assert load_agent_file(path, environ={}).push is True
    path.write_text('role = "coder"\nurl = "https://coder.example"\npush = "yes"\n')
    with pytest.raises(ConfigError, match=r"'push'.*true or false"):
        load_agent_file(path, environ={})
