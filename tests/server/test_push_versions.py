"""Webhook payloads in the protocol version of their registration: one
registered through the v0.3 methods gets the v0.3 push payload (the task,
in v0.3 JSON), one registered through v1.0 a v1.0 `StreamResponse`, and
each keeps its shape across a restart of the server. A real role server
and real webhook receivers on 127.0.0.1; raw JSON-RPC as a v0.3 and a v1.0
client send it, and the v0.3 gRPC service; only the model is scripted."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2, a2a_v0_3_pb2_grpc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.server.push import PushPolicy
from a2a_orchestrator.server.serving import bind_socket, serve

pytestmark = pytest.mark.anyio

V1 = {"A2A-Version": "1.0"}


def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Ask the caller first (the task waits, webhooks are registered), then answer."""
    if not any(m["role"] == "tool" for m in messages):
        return {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which file?"}}]}
    return {"text": "done at last"}


@asynccontextmanager
async def coder(tmp_path: Path) -> AsyncIterator[RunningServer]:
    async with run_role_server(
        find_role("coder"),
        ScriptedModel(script),
        tmp_path,
        db=str(tmp_path / "role.db"),
        push_policy=PushPolicy.parse("127.0.0.0/8"),
        grpc_port=0,
    ) as server:
        yield server


@dataclass
class Receiver:
    """A webhook receiver keeping each body as JSON, with its token."""

    url: str = ""
    posts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    arrived: anyio.Event = field(default_factory=anyio.Event)

    async def endpoint(self, request: Request) -> Response:
        token = request.headers.get("x-a2a-notification-token", "")
        self.posts.append((token, json.loads(await request.body())))
        self.arrived.set()
        self.arrived = anyio.Event()
        return Response(status_code=204)

    async def until(self, done: Callable[[dict[str, Any]], bool]) -> None:
        while not any(done(body) for _, body in self.posts):
            await self.arrived.wait()


@asynccontextmanager
async def receivers(count: int) -> AsyncIterator[list[Receiver]]:
    hooks = [Receiver() for _ in range(count)]
    routes = [Route(f"/hook{i}", hook.endpoint, methods=["POST"]) for i, hook in enumerate(hooks)]
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, Starlette(routes=routes), bind_socket("127.0.0.1", 0))
        for i, hook in enumerate(hooks):
            hook.url = f"http://127.0.0.1:{port}/hook{i}"
        yield hooks
        tg.cancel_scope.cancel()


async def rpc(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], **headers: str
) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = (await http.post(url, json=body, headers=headers)).json()
    assert "error" not in answer, answer
    return dict(answer["result"])


def completed(body: dict[str, Any]) -> bool:
    """Whether `body` says the task completed, in either version's shape
    (so a receiver sent the wrong one fails on its shape, not a timeout)."""
    if body.get("status", {}).get("state") == "completed":
        return True  # v0.3: the task
    for key in ("task", "statusUpdate"):
        if body.get(key, {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED":
            return True  # v1.0: a StreamResponse
    return False


async def test_a_v0_3_registration_gets_v0_3_tasks_and_a_v1_0_one_stream_responses(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(40):
        async with (
            receivers(4) as (legacy, current, legacy_on_send, legacy_grpc),
            httpx.AsyncClient() as http,
        ):
            async with coder(tmp_path) as server:
                first = await rpc(
                    http,
                    server.url,
                    "SendMessage",
                    {
                        "message": {
                            "role": "ROLE_USER",
                            "messageId": "m1",
                            "parts": [{"text": "go"}],
                        }
                    },
                    **V1,
                )
                task_id = first["task"]["id"]
                assert first["task"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
                # A v0.3 client (no A2A-Version header, v0.3 method and fields).
                await rpc(
                    http,
                    server.url,
                    "tasks/pushNotificationConfig/set",
                    {
                        "taskId": task_id,
                        "pushNotificationConfig": {"id": "old", "url": legacy.url, "token": "t03"},
                    },
                )
                await rpc(
                    http,
                    server.url,
                    "CreateTaskPushNotificationConfig",
                    {"taskId": task_id, "id": "new", "url": current.url, "token": "t10"},
                    **V1,
                )
                # A v0.3 gRPC client (the 0.3 service, no a2a-version metadata).
                assert server.grpc_address is not None
                async with grpc.aio.insecure_channel(server.grpc_address) as channel:
                    await a2a_v0_3_pb2_grpc.A2AServiceStub(
                        channel
                    ).CreateTaskPushNotificationConfig(
                        a2a_v0_3_pb2.CreateTaskPushNotificationConfigRequest(
                            parent=f"tasks/{task_id}",
                            config_id="grpc",
                            config=a2a_v0_3_pb2.TaskPushNotificationConfig(
                                name=f"tasks/{task_id}/pushNotificationConfigs/grpc",
                                push_notification_config=a2a_v0_3_pb2.PushNotificationConfig(
                                    id="grpc", url=legacy_grpc.url, token="t03g"
                                ),
                            ),
                        )
                    )
            # Restarted on the same file: each config keeps its version.
            async with coder(tmp_path) as server:
                # The answer, sent by a v0.3 client registering a third webhook with it.
                answer = await rpc(
                    http,
                    server.url,
                    "message/send",
                    {
                        "message": {
                            "kind": "message",
                            "role": "user",
                            "messageId": "m2",
                            "taskId": task_id,
                            "parts": [{"kind": "text", "text": "out.txt"}],
                        },
                        "configuration": {
                            "blocking": False,
                            "pushNotificationConfig": {
                                "id": "on-send",
                                "url": legacy_on_send.url,
                                "token": "t03s",
                            },
                        },
                    },
                )
                for hook in (legacy, legacy_on_send, legacy_grpc, current):
                    await hook.until(completed)
    assert answer["kind"] == "task" and answer["id"] == task_id
    for hook, token in ((legacy, "t03"), (legacy_on_send, "t03s"), (legacy_grpc, "t03g")):
        assert {t for t, _ in hook.posts} == {token}
        # Each post is the whole task in v0.3 JSON, as a2a-sdk 0.3 sent it.
        for _, body in hook.posts:
            assert body.get("kind") == "task" and body["id"] == task_id, body
            assert body["contextId"] == first["task"]["contextId"]
            assert body["status"]["state"] in ("submitted", "working", "completed"), body
            assert "statusUpdate" not in body and "task" not in body
        last = hook.posts[-1][1]
        assert last["status"]["state"] == "completed"
        texts = [p["text"] for a in last["artifacts"] for p in a["parts"] if p["kind"] == "text"]
        assert "done at last" in "".join(texts)
        assert {m["role"] for m in last["history"]} <= {"user", "agent"}
    # The v1.0 registration: StreamResponses, as before.
    assert {t for t, _ in current.posts} == {"t10"}
    for _, body in current.posts:
        assert len(body.keys() & {"task", "statusUpdate", "artifactUpdate", "message"}) == 1, body
        assert "kind" not in body
    assert any(
        body.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_WORKING"
        for _, body in current.posts
    )
