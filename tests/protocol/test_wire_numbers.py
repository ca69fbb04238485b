"""Integers are integers on the wire: whole numbers in metadata and data
parts leave every A2A route as JSON integers, fractions stay fractions."""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from support.servers import role_server

from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.protocol.numbers import IntegralNumbers, integral_json
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server

pytestmark = pytest.mark.anyio

USAGE = {"input_tokens": 565, "output_tokens": 7}
V1 = {"A2A-Version": "1.0"}
V0_3 = {"A2A-Version": "0.3"}
WHOLE_FLOAT = re.compile(r"^-?\d+\.0$")
TOKENS = re.compile(rb'"(inputTokens|outputTokens|modelCalls)": ?(\d+(?:\.\d+)?)')


def script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A tool call (whole numbers in a data part), then an answer with usage."""
    if messages[-1]["role"] != "tool":
        call = {"name": "list_files", "arguments": {"path": ".", "max_depth": 1}}
        return {"tool_calls": [call], "usage": USAGE}
    return {"text": "listed", "usage": USAGE}


@pytest.fixture
def priced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A price for the scripted model, so `spent.cost` is a fraction."""
    prices = tmp_path / "prices.toml"
    prices.write_text('[models."scripted"]\ninput = 1.3\noutput = 2.0\n')
    monkeypatch.setenv("A2A_PRICES", str(prices))


def float_literals(document: bytes) -> list[str]:
    """Every float literal in a JSON document, as written."""
    found: list[str] = []

    def keep(text: str) -> float:
        found.append(text)
        return float(text)

    json.loads(document, parse_float=keep)
    return found


def check(documents: list[bytes]) -> None:
    """Token counts are integers in the raw bytes; the only floats left are fractions."""
    tokens = [match for doc in documents for match in TOKENS.findall(doc)]
    assert tokens, documents
    assert all(b"." not in number for _, number in tokens), tokens
    assert (b"inputTokens", b"1130") in tokens, tokens  # two calls of 565
    literals = [text for doc in documents for text in float_literals(doc)]
    assert [text for text in literals if WHOLE_FLOAT.match(text)] == []
    # The cost (565 * 1.3 + 7 * 2.0 per million per call) stays a fraction.
    assert any(re.search(rb'"cost": ?0\.00\d+', doc) for doc in documents), documents
    assert any(re.search(rb'"max_depth": ?1[,}]', doc) for doc in documents), documents


def sse_documents(body: bytes) -> list[bytes]:
    lines = body.replace(b"\r\n", b"\n").split(b"\n")
    return [line.removeprefix(b"data:").strip() for line in lines if line.startswith(b"data:")]


def rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}


MESSAGE_1_0 = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "list"}]}}
MESSAGE_0_3 = {
    "message": {
        "messageId": "m1",
        "role": "user",
        "kind": "message",
        "parts": [{"kind": "text", "text": "list"}],
    }
}
# v0.3's HTTP+JSON binding is the v0.3 proto's JSON (`content`, not `parts`).
MESSAGE_0_3_REST = {
    "message": {"messageId": "m1", "role": "ROLE_USER", "content": [{"text": "list"}]}
}


async def test_every_route_sends_whole_numbers_as_integers(tmp_path: Path, priced: None) -> None:
    with anyio.fail_after(60):
        async with role_server(tmp_path, script) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:

                async def call(method: str, path: str, **kwargs: Any) -> bytes:
                    response = await http.request(method, path, **kwargs)
                    assert response.status_code == 200, response.text
                    return response.content

                stream = await call(
                    "POST", "/", json=rpc("SendStreamingMessage", MESSAGE_1_0), headers=V1
                )
                sent = await call("POST", "/", json=rpc("SendMessage", MESSAGE_1_0), headers=V1)
                task_id = json.loads(sent)["result"]["task"]["id"]
                answers = {
                    "jsonrpc stream": sse_documents(stream),
                    "jsonrpc send": [sent],
                    "jsonrpc get": [
                        await call("POST", "/", json=rpc("GetTask", {"id": task_id}), headers=V1)
                    ],
                    "jsonrpc list": [
                        await call("POST", "/", json=rpc("ListTasks", {}), headers=V1)
                    ],
                    "jsonrpc 0.3 stream": sse_documents(
                        await call("POST", "/", json=rpc("message/stream", MESSAGE_0_3))
                    ),
                    "jsonrpc 0.3 send": [
                        await call("POST", "/", json=rpc("message/send", MESSAGE_0_3))
                    ],
                    "rest stream": sse_documents(
                        await call("POST", "/rest/message:stream", json=MESSAGE_1_0, headers=V1)
                    ),
                    "rest send": [
                        await call("POST", "/rest/message:send", json=MESSAGE_1_0, headers=V1)
                    ],
                    "rest get": [await call("GET", f"/rest/tasks/{task_id}", headers=V1)],
                    "rest list": [await call("GET", "/rest/tasks", headers=V1)],
                    "rest 0.3 stream": sse_documents(
                        await call(
                            "POST", "/rest/v1/message:stream", json=MESSAGE_0_3_REST, headers=V0_3
                        )
                    ),
                    "rest 0.3 send": [
                        await call(
                            "POST", "/rest/v1/message:send", json=MESSAGE_0_3_REST, headers=V0_3
                        )
                    ],
                    "rest 0.3 get": [await call("GET", f"/rest/v1/tasks/{task_id}", headers=V0_3)],
                }
    for route, documents in answers.items():
        try:
            check(documents)
        except AssertionError as exc:
            raise AssertionError(f"{route}: {exc}") from exc
    # The JSON-RPC id (outside metadata) is echoed as it was sent.
    assert json.loads(answers["jsonrpc send"][0])["id"] == 7


def parent_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    if not any(m["role"] == "assistant" for m in messages):
        task = {"role": "coder", "prompt": "list the files"}
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": [task]}}], "usage": USAGE}
    return {"text": "The coder listed them.\nTASK_DONE", "usage": USAGE}


async def test_the_orchestrator_sends_whole_numbers_as_integers(
    tmp_path: Path, priced: None
) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    parent = ScriptedModel(parent_script)
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            coder = await stack.enter_async_context(
                run_role_server(
                    find_role("coder"), ScriptedModel(script), workdir, db=str(tmp_path / "c.db")
                )
            )
            orchestrator = await stack.enter_async_context(
                run_orchestrator_server(
                    store_path=tmp_path / "orchestrator.db",
                    workdir=workdir,
                    network=Network.of(AgentSpec(name="coder", role="coder", url=coder.url)),
                    models=lambda name: parent,
                    db=str(tmp_path / "orchestrator-tasks.db"),
                )
            )
            message = {**MESSAGE_1_0["message"], "metadata": {MODE_KEY: "delegate"}}
            async with httpx.AsyncClient(timeout=30) as http:
                response = await http.post(
                    orchestrator.url,
                    json=rpc("SendStreamingMessage", {"message": message}),
                    headers=V1,
                )
    assert response.status_code == 200, response.text
    documents = sse_documents(response.content)
    assert b"TASK_DONE" in documents[-2] + documents[-1]
    tokens = [match for doc in documents for match in TOKENS.findall(doc)]
    assert (b"inputTokens", b"1130") in tokens, tokens  # two calls of 565
    assert all(b"." not in number for _, number in tokens), tokens
    literals = [text for doc in documents for text in float_literals(doc)]
    assert [text for text in literals if WHOLE_FLOAT.match(text)] == []


def test_only_whole_floats_in_metadata_and_data_change() -> None:
    document = json.dumps(
        {
            "id": 7.0,
            "result": {
                "metadata": {"inputTokens": 565.0, "cost": 0.0123, "seconds": 1.5, "big": 1e300},
                "parts": [{"data": 3.0}, {"data": [1.0, {"n": 2.0}]}, {"text": "version 1.0, ok"}],
                "other": 4.0,
            },
        }
    ).encode()
    rewritten = integral_json(document)
    assert rewritten is not None
    assert json.loads(rewritten) == json.loads(document)
    assert b'"inputTokens":565,' in rewritten and b'"cost":0.0123' in rewritten
    assert b'"seconds":1.5' in rewritten and b'"big":1e+300' in rewritten
    assert b'"data":3}' in rewritten and b'"data":[1,{"n":2}]' in rewritten
    assert b'"id":7.0' in rewritten and b'"other":4.0' in rewritten
    assert b'"version 1.0, ok"' in rewritten
    # Nothing to change: the bytes are kept (None), parsed or not.
    assert integral_json(b'{"metadata":{"cost":0.5},"text":"1.0, 2.0"}') is None
    assert integral_json(b'{"metadata":{"n":1}}') is None


async def test_an_sse_line_split_across_body_chunks_is_rewritten_whole() -> None:
    """sse-starlette sends each event in one chunk, so a split needs an app
    that splits: this one sends one event in three pieces, then a ping."""
    event = b'data: {"result":{"metadata":{"inputTokens":565.0,"cost":0.25}}}\r\n\r\n'
    pieces = [event[:30], event[30:-3], event[-3:], b": ping\r\n\r\n"]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    sent: list[dict[str, Any]] = []

    async def collect(message: Any) -> None:
        sent.append(message)

    async def nothing() -> Any:
        return {"type": "http.disconnect"}

    await IntegralNumbers(app)({"type": "http"}, nothing, collect)
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    line = b'data: {"result":{"metadata":{"inputTokens":565,"cost":0.25}}}'
    # The piece cut mid-line waited for its line's end; the rest went on as it came.
    assert bodies == [line + b"\r", b"\n\r\n", b": ping\r\n\r\n", b""]
    assert sent[-1]["more_body"] is False
