"""The strict writer: camelCase keys in what a role server emits; old names still read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.helpers import new_data_part, new_text_part
from a2a.types import Message, Role, Task, TaskState, TaskStatus
from support.servers import role_server

from a2a_orchestrator.protocol.decoding import StreamDecoder
from a2a_orchestrator.protocol.wire import EVENT_KEY
from a2a_orchestrator.runtime.events import Done, ToolCalled

pytestmark = pytest.mark.anyio

SCRIPT = [
    {"tool_calls": [{"name": "list_files", "arguments": {"path": ".", "max_depth": 1}}]},
    {"text": "listed", "usage": {"input_tokens": 565, "output_tokens": 7}},
]


def snake_keys(value: Any, path: str = "") -> list[str]:
    """Keys with an underscore, outside a tool call's own `arguments`."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if "_" in key:
                found.append(f"{path}.{key}")
            if key != "arguments":
                found.extend(snake_keys(item, f"{path}.{key}"))
    elif isinstance(value, list):
        for item in value:
            found.extend(snake_keys(item, path))
    return found


async def test_status_and_artifact_metadata_and_data_parts_are_camel_case(tmp_path: Path) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": "1",
        "method": "SendStreamingMessage",
        "params": {
            "message": {
                "messageId": "m1",
                "role": "ROLE_USER",
                "parts": [{"text": "list the files"}],
            }
        },
    }
    with anyio.fail_after(30):
        async with role_server(tmp_path, SCRIPT) as server:
            async with httpx.AsyncClient(timeout=20) as http:
                response = await http.post(server.url, json=body, headers={"A2A-Version": "1.0"})
    frames = [
        json.loads(line.removeprefix("data:"))["result"]
        for line in response.text.splitlines()
        if line.startswith("data:")
    ]
    checked: list[Any] = []
    for frame in frames:
        for update in (frame.get("statusUpdate"), frame.get("task")):
            message = (update or {}).get("status", {}).get("message")
            if message:
                checked.append(message.get("metadata", {}))
                checked.extend(p["data"] for p in message["parts"] if "data" in p)
        artifact = frame.get("artifactUpdate", {}).get("artifact")
        if artifact:
            checked.append(artifact.get("metadata", {}))
    assert snake_keys(checked) == []
    done = next(m for m in checked if m.get(EVENT_KEY) == "done")
    assert set(done["usage"]) == {"inputTokens", "outputTokens"}
    # A Struct's numbers are doubles on the wire (README, "Numbers").
    assert done["usage"]["inputTokens"] > 565 and float(done["usage"]["inputTokens"]).is_integer()
    assert done["spent"]["modelCalls"] == 2
    tool = next(d for d in checked if "callId" in d and "arguments" in d)
    assert tool["arguments"] == {"path": ".", "max_depth": 1}  # the tool's own keys


def test_the_reader_takes_the_old_snake_case_names() -> None:
    """A task stored (or a peer running) before the keys were camelCase."""
    call = Message(
        message_id="e1",
        role=Role.ROLE_AGENT,
        parts=[new_data_part({"call_id": "c1", "tool": "read_file", "arguments": {"a_b": 1}})],
    )
    call.metadata.update({"a2a_orchestrator.event": "tool_called"})
    done = Message(message_id="e2", role=Role.ROLE_AGENT, parts=[new_text_part("ok")])
    done.metadata.update(
        {
            "a2a_orchestrator.event": "done",
            "usage": {"input_tokens": 565, "output_tokens": 7},
            "spent": {"input_tokens": 565, "output_tokens": 7, "model_calls": 2},
        }
    )
    task = Task(
        id="t",
        context_id="c",
        history=[call],
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=done),
    )
    events = StreamDecoder().decode_task(task)
    assert events[0] == ToolCalled(uuid="e1", call_id="c1", tool="read_file", arguments={"a_b": 1})
    last = events[-1]
    assert isinstance(last, Done) and last.usage.input_tokens == 565
    assert type(last.usage.input_tokens) is int and last.spent.model_calls == 2
