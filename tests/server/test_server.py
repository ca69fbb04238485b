"""A role as an A2A server: real uvicorn on 127.0.0.1, real SQLite, stock a2a-sdk client."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    TaskState,
)
from support.messages import collect, task_id_of, user_message
from support.processes import running_with_args
from support.servers import a2a_client, role_server

from a2a_orchestrator.protocol.decoding import StreamDecoder
from a2a_orchestrator.runtime.events import ChildEvent, Done, Failed, InputRequired, ToolResult
from a2a_orchestrator.storage.tasks.sqlite import SQLiteTaskStore

pytestmark = pytest.mark.anyio


def kinds(events: list[ChildEvent]) -> list[str]:
    return [e.kind for e in events if e.kind != "message_delta"]


CODER_SCRIPT = [
    {
        "text": "Writing the module.",
        "tool_calls": [
            {
                "name": "write_file",
                "arguments": {"path": "pkg/hello.py", "content": "print('hi')\n"},
            }
        ],
    },
    {
        "tool_calls": [
            {"name": "run_command", "arguments": {"command": "python3 pkg/hello.py > out.txt"}}
        ]
    },
    {"text": "Implemented and ran it.\nTASK_DONE"},
]


async def test_stream_a_coder_task(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with role_server(tmp_path, CODER_SCRIPT) as server, a2a_client(server.url) as client:
            responses, events = await collect(client, user_message("write hello"))
    assert kinds(events) == [
        "started",
        "message",
        "tool_called",
        "tool_result",
        "tool_called",
        "tool_result",
        "message",
        "done",
    ]
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.tool for r in results] == ["write_file", "run_command"]
    assert all(r.success for r in results)
    assert (tmp_path / "pkg" / "hello.py").read_text() == "print('hi')\n"
    assert (tmp_path / "out.txt").read_text() == "hi\n"
    done = events[-1]
    assert (
        isinstance(done, Done) and done.text.endswith("TASK_DONE") and done.usage.output_tokens > 0
    )
    # The final frame is COMPLETED, and the result artifact came before it.
    assert responses[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    artifacts = [r for r in responses if r.HasField("artifact_update")]
    assert [a.artifact_update.artifact.name for a in artifacts] == ["result"]


async def test_multi_turn_through_ask_parent(tmp_path: Path) -> None:
    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        answers = [m for m in messages if m["role"] == "tool"]
        if not answers:
            return {
                "tool_calls": [
                    {"name": "ask_parent", "arguments": {"question": "Which file name?"}}
                ]
            }
        name = answers[0]["content"]
        if not any(
            m.get("tool_calls", [{}])[0].get("function", {}).get("name") == "write_file"
            for m in messages
            if m["role"] == "assistant" and m.get("tool_calls")
        ):
            return {
                "tool_calls": [{"name": "write_file", "arguments": {"path": name, "content": "x"}}]
            }
        return {"text": f"wrote {name}\nTASK_DONE"}

    with anyio.fail_after(20):
        async with role_server(tmp_path, script) as server, a2a_client(server.url) as client:
            first, events = await collect(client, user_message("make a file"))
            assert kinds(events)[-1] == "input_required"
            assert (
                isinstance(events[-1], InputRequired) and events[-1].question == "Which file name?"
            )
            assert first[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            task_id = task_id_of(first)
            context_id = first[-1].status_update.context_id
            second, events = await collect(client, user_message("notes.md", task_id=task_id))
            task = await client.get_task(GetTaskRequest(id=task_id))
    assert isinstance(events[-1], Done) and events[-1].text == "wrote notes.md\nTASK_DONE"
    assert (tmp_path / "notes.md").read_text() == "x"
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.context_id == context_id
    assert all(
        r.status_update.context_id == context_id for r in second if r.HasField("status_update")
    )


async def test_cancel_mid_run_kills_the_command(tmp_path: Path) -> None:
    script = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {"command": "echo ok > pid; exec sleep 60.173"},
                }
            ]
        }
    ]
    with anyio.fail_after(20):
        async with role_server(tmp_path, script) as server, a2a_client(server.url) as client:
            seen: list[ChildEvent] = []
            task_id = ""
            pid_file = tmp_path / "pid"

            async def stream() -> None:
                nonlocal task_id
                decoder = StreamDecoder()
                async for response in client.send_message(user_message("run it")):
                    if not task_id:
                        task_id = task_id_of([response])
                    seen.extend(decoder.decode(response))

            async with anyio.create_task_group() as tg:
                tg.start_soon(stream)
                while not task_id or not pid_file.exists() or not pid_file.read_text().strip():
                    await anyio.sleep(0.02)
                assert running_with_args("sleep", "60.173")
                canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
            task = await client.get_task(GetTaskRequest(id=task_id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    assert running_with_args("sleep", "60.173") == []
    assert isinstance(seen[-1], Failed) and seen[-1].reason == "aborted"


async def test_restart_keeps_finished_tasks_and_resumes_waiting_ones(tmp_path: Path) -> None:
    db = tmp_path / "store" / "tasks.db"

    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        user = [m["content"] for m in messages if m["role"] == "user"]
        answers = [m["content"] for m in messages if m["role"] == "tool"]
        if user and user[0] == "ask me" and not answers:
            return {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Color?"}}]}
        if answers:
            # Only a faithfully rebuilt transcript has the first user turn here.
            return {"text": f"{user[0]} -> {answers[-1]}"}
        return {"text": f"echo {user[-1]}"}

    with anyio.fail_after(30):
        async with role_server(tmp_path, script, db=db) as server, a2a_client(server.url) as client:
            done, _ = await collect(client, user_message("hello"))
            waiting, _ = await collect(client, user_message("ask me"))
        finished_id, waiting_id = task_id_of(done), task_id_of(waiting)
        async with role_server(tmp_path, script, db=db) as server, a2a_client(server.url) as client:
            finished = await client.get_task(GetTaskRequest(id=finished_id))
            parked = await client.get_task(GetTaskRequest(id=waiting_id))
            _, events = await collect(client, user_message("blue", task_id=waiting_id))
    assert finished.status.state == TaskState.TASK_STATE_COMPLETED
    assert finished.artifacts[0].parts[0].text == "echo hello"
    assert parked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert isinstance(events[-1], Done) and events[-1].text == "ask me -> blue"


async def test_max_turns_and_timeout_end_failed_with_reason(tmp_path: Path) -> None:
    def forever(messages: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": "list_files", "arguments": {}}]}

    with anyio.fail_after(20):
        async with (
            role_server(tmp_path, forever, max_turns=2) as server,
            a2a_client(server.url) as client,
        ):
            responses, events = await collect(client, user_message("loop"))
        assert responses[-1].status_update.status.state == TaskState.TASK_STATE_FAILED
        assert isinstance(events[-1], Failed) and events[-1].reason == "max_turns"

        slow = [{"text": "late", "delay": 30}]
        async with (
            role_server(tmp_path, slow, timeout=0.5) as server,
            a2a_client(server.url) as client,
        ):
            responses, events = await collect(client, user_message("wait"))
        assert responses[-1].status_update.status.state == TaskState.TASK_STATE_FAILED
        assert isinstance(events[-1], Failed) and events[-1].reason == "timeout"


async def test_v0_3_message_send_and_rest_binding(tmp_path: Path) -> None:
    script = [{"text": "pong"}]
    legacy = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "role": "user",
                "messageId": "m-1",
                "parts": [{"kind": "text", "text": "ping"}],
            }
        },
    }
    with anyio.fail_after(20):
        async with (
            role_server(tmp_path, lambda m: {"text": "pong"}) as server,
            httpx.AsyncClient(timeout=10) as http,
        ):
            # No A2A-Version header: a v0.3 peer (Strands Agents, older ADK).
            reply = (await http.post(server.url + "/", json=legacy)).json()
            rest = await http.post(
                server.url + "/rest/message:send",
                headers={"A2A-Version": "1.0"},
                json={
                    "message": {
                        "role": "ROLE_USER",
                        "messageId": "m-2",
                        "parts": [{"text": "ping"}],
                    }
                },
            )
    assert script
    result = reply["result"]
    assert result["kind"] == "task" and result["status"]["state"] == "completed"
    assert result["artifacts"][0]["parts"][0]["text"] == "pong"
    assert rest.status_code == 200, rest.text
    task = rest.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["artifacts"][0]["parts"][0]["text"] == "pong"


async def test_card_describes_the_role(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        async with (
            role_server(tmp_path, [], role="architect") as server,
            httpx.AsyncClient() as http,
        ):
            response = await http.get(server.url + "/.well-known/agent-card.json")
    card = response.json()
    assert "max-age" in response.headers["cache-control"]
    assert card["name"] == "architect"
    assert card["capabilities"]["streaming"] is True
    bindings = {(i["protocolBinding"], i["protocolVersion"]) for i in card["supportedInterfaces"]}
    assert bindings == {
        ("JSONRPC", "1.0"),
        ("HTTP+JSON", "1.0"),
        ("JSONRPC", "0.3"),
        ("HTTP+JSON", "0.3"),
    }
    assert {s["id"] for s in card["skills"]} >= {"software-design"}
    assert "securitySchemes" not in card


async def test_bearer_auth(tmp_path: Path) -> None:
    token = "s3cret-token"
    with anyio.fail_after(20):
        async with role_server(tmp_path, lambda m: {"text": "ok"}, token=token) as server:
            async with httpx.AsyncClient() as http:
                card = (await http.get(server.url + "/.well-known/agent-card.json")).json()
                body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
                headers = {"A2A-Version": "1.0"}
                missing = await http.post(server.url + "/", json=body, headers=headers)
                wrong = await http.post(
                    server.url + "/", json=body, headers={**headers, "Authorization": "Bearer nope"}
                )
                rest = await http.get(server.url + "/rest/tasks/x", headers=headers)
            async with a2a_client(server.url, token=token) as client:
                _, events = await collect(client, user_message("hi"))
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]
    assert missing.status_code == 401 and wrong.status_code == 401 and rest.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert isinstance(events[-1], Done) and events[-1].text == "ok"


async def test_bad_requests_get_clear_errors(tmp_path: Path) -> None:
    headers = {"A2A-Version": "1.0", "content-type": "application/json"}
    with anyio.fail_after(20):
        async with (
            role_server(tmp_path, lambda m: {"text": "ok"}) as server,
            httpx.AsyncClient() as http,
        ):
            not_json = await http.post(server.url + "/", content=b"{nope", headers=headers)
            unknown = await http.post(
                server.url + "/",
                json={"jsonrpc": "2.0", "id": 2, "method": "NoSuchMethod", "params": {}},
                headers=headers,
            )
            missing_task = await http.post(
                server.url + "/",
                json={"jsonrpc": "2.0", "id": 3, "method": "GetTask", "params": {"id": "nope"}},
                headers=headers,
            )
            huge = await http.post(
                server.url + "/",
                content=json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 4,
                        "method": "SendMessage",
                        "params": {"blob": "x" * (5 * 1024 * 1024)},
                    }
                ).encode(),
                headers=headers,
            )
            still_up = await http.get(server.url + "/.well-known/agent-card.json")
    assert not_json.json()["error"]["code"] == -32700
    assert unknown.json()["error"]["code"] == -32601
    assert missing_task.json()["error"]["code"] == -32001
    assert huge.status_code == 413 and "too large" in huge.json()["error"]
    assert still_up.status_code == 200


async def test_path_escapes_are_refused_over_a2a(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    (tmp_path / "secret.txt").write_text("keep out")
    script = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "../escaped.txt", "content": "x"}},
                {"name": "read_file", "arguments": {"path": str(tmp_path / "secret.txt")}},
            ]
        },
        {"text": "could not\nTASK_FAILED"},
    ]
    with anyio.fail_after(20):
        async with role_server(workdir, script) as server, a2a_client(server.url) as client:
            _, events = await collect(client, user_message("escape"))
    results = [e for e in events if isinstance(e, ToolResult)]
    assert [r.success for r in results] == [False, False]
    assert all("outside the work directory" in r.output for r in results)
    assert "keep out" not in results[1].output
    assert not (tmp_path / "escaped.txt").exists()
    assert isinstance(events[-1], Done)


async def test_a_chunked_oversized_body_is_a_413(tmp_path: Path) -> None:
    async def chunks() -> Any:
        for _ in range(6):
            yield b"x" * (1024 * 1024)

    headers = {"A2A-Version": "1.0", "content-type": "application/json"}
    with anyio.fail_after(20):
        async with (
            role_server(tmp_path, lambda m: {"text": "ok"}) as server,
            httpx.AsyncClient() as http,
        ):
            huge = await http.post(server.url + "/", content=chunks(), headers=headers)
            small = await http.post(
                server.url + "/",
                json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "nope"}},
                headers=headers,
            )
    assert "content-length" not in huge.request.headers
    assert huge.status_code == 413
    assert small.json()["error"]["code"] == -32001


async def test_one_turn_at_a_time_in_a_context(tmp_path: Path) -> None:
    def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(m["role"] == "tool" for m in messages):
            return {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which?"}}]}
        return {"text": "answered"}

    with anyio.fail_after(20):
        async with role_server(tmp_path, script) as server, a2a_client(server.url) as client:
            first, _ = await collect(client, user_message("ask me", context_id="ctx-1"))
            other, events = await collect(client, user_message("another task", context_id="ctx-1"))
            waiting = task_id_of(first)
            answered, _ = await collect(client, user_message("this one", task_id=waiting))
    assert isinstance(events[-1], Failed)
    assert f"waiting for input on task {waiting}" in events[-1].message
    assert other[-1].status_update.status.state == TaskState.TASK_STATE_FAILED
    assert answered[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_message_naming_no_context_opens_a_new_one_without_reading_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server makes the context (a UUID, as a2a-sdk would): no task can
    be in it yet, so neither the owners check nor the executor's listing of
    the context's earlier tasks reads the store. A follow-up naming that
    context is checked against the store as any other."""
    asked: list[str] = []
    listed: list[str] = []
    looked: list[str] = []
    owners, listing = SQLiteTaskStore.context_owners, SQLiteTaskStore.list
    lookup = SQLiteTaskStore.task_opened_by

    async def spied_owners(self: SQLiteTaskStore, context_id: str) -> set[str]:
        asked.append(context_id)
        return await owners(self, context_id)

    async def spied_list(self: SQLiteTaskStore, params: Any, context: Any) -> Any:
        listed.append(params.context_id)
        return await listing(self, params, context)

    async def spied_lookup(self: SQLiteTaskStore, context_id: str, *args: Any) -> Any:
        looked.append(context_id)
        return await lookup(self, context_id, *args)

    # Spies on the real store: the reads are what this behaviour saves.
    monkeypatch.setattr(SQLiteTaskStore, "context_owners", spied_owners)
    monkeypatch.setattr(SQLiteTaskStore, "list", spied_list)
    monkeypatch.setattr(SQLiteTaskStore, "task_opened_by", spied_lookup)
    with anyio.fail_after(20):
        async with role_server(tmp_path, [{"text": "one"}, {"text": "two"}]) as server:
            async with a2a_client(server.url) as client:
                first, opened = await collect(client, user_message("hi"))
                context_id = first[0].task.context_id
                read_by_the_first = [*asked, *listed, *looked]
                second, followed = await collect(
                    client, user_message("again", context_id=context_id)
                )
    assert str(uuid.UUID(context_id)) == context_id
    assert kinds(opened) == kinds(followed) == ["started", "message", "done"]
    assert second[0].task.context_id == context_id
    assert task_id_of(second) != task_id_of(first)
    assert read_by_the_first == []
    # The follow-up's owners check, and its check that it repeats no message
    # a task of the context was opened by; no listing of the context's tasks
    # (its conversation is held).
    assert asked == looked == [context_id]
    assert listed == []


async def test_a_v0_3_client_over_http_json(tmp_path: Path) -> None:
    """A 0.3 peer that prefers HTTP+JSON picks the card's 0.3 REST interface."""
    with anyio.fail_after(20):
        async with role_server(tmp_path, lambda m: {"text": "rest ok"}) as server:
            async with httpx.AsyncClient(timeout=30) as http:
                card = await A2ACardResolver(http, server.url).get_agent_card()
                legacy = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
                del card.supported_interfaces[:]
                card.supported_interfaces.extend(legacy)
                config = ClientConfig(
                    httpx_client=http, streaming=True, supported_protocol_bindings=["HTTP+JSON"]
                )
                client = ClientFactory(config).create(card)
                _, events = await collect(client, user_message("hi"))
                await client.close()
    assert isinstance(events[-1], Done) and events[-1].text == "rest ok"
