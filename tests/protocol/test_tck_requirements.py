"""The A2A TCK's checks that a2a-sdk 1.3 fails, run against our servers.

Each test makes the request the TCK (a2a-tck, branch 1.0-dev) makes and
asserts what it asserts, on `serve coder` and `serve orchestrator`, with
the card listing both protocol versions and with `--protocol 1.0`; real
servers on 127.0.0.1 with gRPC served too, only the models scripted.

- JSONRPC-SSE-002 (`tests/compatibility/jsonrpc/test_error_codes.py`,
  `test_content_type_not_supported_error`): a JSON-RPC request sent as
  text/plain is ContentTypeNotSupportedError, -32005 (a2a-sdk: -32700).
- GRPC-ERR-002 (`tests/compatibility/grpc/test_status_codes.py`): an
  unsupported `a2a-version` metadata is VersionNotSupportedError,
  UNIMPLEMENTED (a2a-sdk serves the call), and A2A errors carry the status
  spec 5.4 names with a `google.rpc.ErrorInfo` (a2a-sdk: FAILED_PRECONDITION
  for an unsupported operation).
- HTTP_JSON-SVC-001 (`tests/compatibility/core_operations/
  test_transport_behavior.py`, `test_response_content_type`): an HTTP+JSON
  answer's Content-Type is application/json (a2a-sdk: application/a2a+json).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import grpc
import grpc.aio
import httpx
import pytest
from a2a.compat.v0_3 import a2a_v0_3_pb2, a2a_v0_3_pb2_grpc
from a2a.types import (
    GetTaskRequest,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
    a2a_pb2_grpc,
)
from google.protobuf.json_format import ParseDict
from google.rpc import error_details_pb2, status_pb2
from support.servers import role_server

from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import run_orchestrator_server
from a2a_orchestrator.protocol.cards import CardOptions
from a2a_orchestrator.server.app import RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

SERVERS = [
    pytest.param("coder", "both", id="coder"),
    pytest.param("coder", "1.0", id="coder-1.0"),
    pytest.param("orchestrator", "both", id="orchestrator"),
    pytest.param("orchestrator", "1.0", id="orchestrator-1.0"),
]

# What the TCK sends (tck/transport/_helpers.py).
V1 = {"A2A-Version": "1.0"}


@asynccontextmanager
async def served(kind: str, protocol: str, tmp_path: Path) -> AsyncIterator[RunningServer]:
    """`serve coder` or `serve orchestrator` (its one agent a coder) with
    gRPC on a free port and the card of `protocol`."""
    options = CardOptions(protocol=protocol)
    async with AsyncExitStack() as stack:
        coder = await stack.enter_async_context(
            role_server(
                tmp_path,
                lambda m: {"text": "TASK_DONE"},
                card_options=options,
                grpc_port=0 if kind == "coder" else None,
            )
        )
        if kind == "coder":
            yield coder
            return
        orchestrator = await stack.enter_async_context(
            run_orchestrator_server(
                store_path=tmp_path / "orchestrator.db",
                workdir=tmp_path,
                network=Network.of(AgentSpec(name="coder", role="coder", url=coder.url)),
                models=lambda name: ScriptedModel(lambda m: {"text": "TASK_DONE"}),
                db=str(tmp_path / "orchestrator-tasks.db"),
                card_options=options,
                grpc_port=0,
            )
        )
        yield orchestrator


def tck_message(message_id: str) -> dict[str, Any]:
    return {"role": "ROLE_USER", "parts": [{"text": "tck"}], "messageId": message_id}


@pytest.mark.parametrize(("kind", "protocol"), SERVERS)
async def test_jsonrpc_unsupported_content_type_is_32005(
    tmp_path: Path, kind: str, protocol: str
) -> None:
    payload = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": tck_message("error-code-005")},
    }
    v0_3 = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "message/send",
        "params": {
            "message": {
                "role": "user",
                "kind": "message",
                "messageId": "v03",
                "parts": [{"kind": "text", "text": "x"}],
            }
        },
    }
    missing = {"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "nope"}}
    with anyio.fail_after(60):
        async with served(kind, protocol, tmp_path) as server, httpx.AsyncClient() as http:
            # The TCK's request: Python's repr of the payload, as text/plain.
            tck = await http.post(
                server.url,
                content=str(payload).encode(),
                headers={"Content-Type": "text/plain", **V1},
            )
            legacy = await http.post(
                server.url,
                content=json.dumps(v0_3).encode(),
                headers={"Content-Type": "text/plain"},
            )
            # Without a Content-Type a request is read as JSON, as before.
            untyped = await http.post(server.url, content=json.dumps(missing).encode(), headers=V1)
    error = tck.json()["error"]
    assert error["code"] == -32005, error
    assert [d["reason"] for d in error["data"]] == ["CONTENT_TYPE_NOT_SUPPORTED"]
    assert error["data"][0]["domain"] == "a2a-protocol.org"
    assert "text/plain" in error["message"]
    # A v0.3 method gets the v0.3 shape: its id back, no ErrorInfo list.
    assert legacy.json()["id"] == 7
    assert legacy.json()["error"]["code"] == -32005
    assert "data" not in legacy.json()["error"]
    assert untyped.json()["error"]["code"] == -32001


@pytest.mark.parametrize(("kind", "protocol"), SERVERS)
async def test_http_json_answers_are_application_json(
    tmp_path: Path, kind: str, protocol: str
) -> None:
    with anyio.fail_after(60):
        async with served(kind, protocol, tmp_path) as server, httpx.AsyncClient() as http:
            rest = server.url + "/rest"
            sent = await http.post(
                rest + "/message:send",
                json={"message": tck_message("transport-test-001")},
                headers=V1,
            )
            task_id = sent.json()["task"]["id"]
            got = await http.get(f"{rest}/tasks/{task_id}", headers=V1)
            listed = await http.get(f"{rest}/tasks", headers=V1)
    for answer in (sent, got, listed):
        assert answer.status_code == 200, answer.text
        # The TCK's check, and the exact type the spec names (11.1).
        content_type = answer.headers["content-type"]
        assert "application/json" in content_type
        assert content_type.split(";")[0] == "application/json"
    assert got.json()["id"] == task_id


def error_info(error: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo in a gRPC error's status details, as the TCK reads it
    (`tck/validators/grpc/error_validator.py`, `extract_error_info`)."""
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info
    return None


async def refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


@pytest.mark.parametrize(("kind", "protocol"), SERVERS)
async def test_grpc_errors_have_spec_statuses_and_versions_are_checked(
    tmp_path: Path, kind: str, protocol: str
) -> None:
    tck_send = ParseDict({"message": tck_message("grpc-status-ver-005")}, SendMessageRequest())
    with anyio.fail_after(60):
        async with served(kind, protocol, tmp_path) as server:
            assert server.grpc_address is not None
            async with grpc.aio.insecure_channel(server.grpc_address) as channel:
                stub = a2a_pb2_grpc.A2AServiceStub(channel)
                legacy = a2a_v0_3_pb2_grpc.A2AServiceStub(channel)
                # The TCK's call: SendMessage with an unsupported version.
                version = await refused(
                    stub.SendMessage(tck_send, metadata=[("a2a-version", "99.0")])
                )
                not_found = await refused(
                    stub.GetTask(GetTaskRequest(id="nonexistent-grpc-status-001"))
                )
                # Served with a version of the service's own, and without one.
                done = await stub.SendMessage(
                    ParseDict({"message": tck_message("v1")}, SendMessageRequest()),
                    metadata=[("a2a-version", "1.0")],
                )
                again = await stub.GetTask(GetTaskRequest(id=done.task.id))
                # Following a finished task is an unsupported operation.
                finished = stub.SubscribeToTask(SubscribeToTaskRequest(id=done.task.id))
                unsupported = await refused(finished.read())
                legacy_version = await refused(
                    legacy.GetTask(
                        a2a_v0_3_pb2.GetTaskRequest(name=f"tasks/{done.task.id}"),
                        metadata=[("a2a-version", "1.0")],
                    )
                )
                legacy_task = await legacy.GetTask(
                    a2a_v0_3_pb2.GetTaskRequest(name=f"tasks/{done.task.id}"),
                    metadata=[("a2a-version", "0.3")],
                )
    assert version.code() == grpc.StatusCode.UNIMPLEMENTED, version.details()
    info = error_info(version)
    assert info is not None and info.reason == "VERSION_NOT_SUPPORTED"
    assert info.domain == "a2a-protocol.org"
    assert "99.0" in (version.details() or "")
    assert not_found.code() == grpc.StatusCode.NOT_FOUND
    info = error_info(not_found)
    assert info is not None and info.reason == "TASK_NOT_FOUND"
    assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert again.id == done.task.id
    assert unsupported.code() == grpc.StatusCode.UNIMPLEMENTED, unsupported.details()
    info = error_info(unsupported)
    assert info is not None and info.reason == "UNSUPPORTED_OPERATION"
    # The 0.3 service refuses a 1.x version as the 0.3 JSON-RPC methods do.
    assert legacy_version.code() != grpc.StatusCode.OK
    assert "1.0" in (legacy_version.details() or "")
    assert legacy_task.id == done.task.id
