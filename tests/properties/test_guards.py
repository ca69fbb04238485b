"""No 5xx for bad input: a small fuzz over every route a role server and
`serve orchestrator` mount (walked from the served app), with bad encodings,
malformed bodies, wrong content types and bad query parameters; and the v0.3
HTTP+JSON stream of a finished task answering with the spec's error."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route
from support.servers import role_server

from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import run_orchestrator_server
from a2a_orchestrator.server.app import RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

V1 = {"A2A-Version": "1.0", "content-type": "application/json"}
V0_3 = {"A2A-Version": "0.3", "content-type": "application/json"}

BAD_UTF8_MESSAGE = (
    b'{"message":{"messageId":"m\xff","role":"ROLE_USER","parts":[{"text":"hi\xc3"}]}}'
)
BAD_UTF8_RPC = (
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"messageId":'
    b'"m\xfe","role":"ROLE_USER","parts":[{"text":"\xed\xa0\x80"}]}}}'
)
BAD_UTF8_RPC_V0_3 = (
    b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"messageId":'
    b'"m\xff","role":"user","kind":"message","parts":[{"kind":"text","text":"x"}]}}}'
)
BODIES: list[bytes] = [
    BAD_UTF8_MESSAGE,
    BAD_UTF8_RPC,
    BAD_UTF8_RPC_V0_3,
    b"\xff\xfe\x00{",
    b'{"message": ',
    b"",
    b"[" * 100_000 + b"]" * 100_000,
    b"[1, 2]",
    b"42",
    b'"text"',
    b"null",
    b"NaN",
    b'{"message": 5}',
    b'{"message": {"parts": "x", "role": 7}}',
    b'{"jsonrpc": "1.0", "id": [1], "method": 5}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": [1]}',
    b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "\\ud800"}}',
    b'{"a": 1e999999}',
]
CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
]
QUERIES = [
    "historyLength=abc",
    "historyLength=-1",
    "historyLength=99999999999999999999999",
    "pageSize=abc",
    "pageSize=-5",
    "pageToken=%FF%FE",
    "status=BOGUS",
    "contextId=%00",
    "%FF=%FF",
]


def mounted(routes: list[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(path template, method) for every route, mounts walked."""
    for route in routes:
        if isinstance(route, Mount):
            yield from mounted(list(route.routes), prefix + route.path)
        elif isinstance(route, Route):
            for method in sorted(route.methods or ()):
                yield prefix + route.path, method


def concrete(template: str, task_id: str) -> list[str]:
    """The path with its parameters filled in: a real finished task, an
    unknown one, and bytes that are not UTF-8 (percent-encoded)."""
    paths = []
    for value in (task_id, "%FF%FEnope"):
        path = template
        for name, fill in (("{tenant}", "t"), ("{id}", value), ("{push_id}", "p")):
            path = path.replace(name, fill)
        paths.append(path)
    return sorted(set(paths))


def requests(path: str, method: str) -> Iterator[dict[str, Any]]:
    if method in ("GET", "HEAD", "DELETE"):
        for query in QUERIES:
            yield {"method": method, "url": f"{path}?{query}"}
        for body in (BAD_UTF8_MESSAGE, b"{"):
            yield {"method": method, "url": path, "content": body, "headers": V1}
        return
    for body, headers in itertools.product(BODIES, (V1, V0_3)):
        yield {"method": method, "url": path, "content": body, "headers": headers}
    for content_type in CONTENT_TYPES:
        yield {
            "method": method,
            "url": path,
            "content": BAD_UTF8_MESSAGE,
            "headers": {"content-type": content_type},
        }


async def finished_task(url: str) -> str:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            url + "/rest/message:send",
            headers=V1,
            json={"message": {"role": "ROLE_USER", "messageId": "m-1", "parts": [{"text": "hi"}]}},
        )
    response.raise_for_status()
    task = response.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    return str(task["id"])


async def fuzz(server: RunningServer, task_id: str) -> tuple[int, list[str]]:
    """Send every bad request; the ones answered 5xx (or a JSON-RPC internal
    error, or a cut connection), and how many were sent."""
    assert server.app is not None
    calls = [
        call
        for template, method in mounted(list(server.app.routes))
        for path in concrete(template, task_id)
        for call in requests(path, method)
    ]
    failures: list[str] = []
    limiter = anyio.CapacityLimiter(8)

    async def one(http: httpx.AsyncClient, call: dict[str, Any]) -> None:
        async with limiter:
            what = f"{call['method']} {call['url']} {call.get('content', b'')[:60]!r}"
            try:
                async with http.stream(**call) as response:
                    # A live event stream (the web view's) never ends: its
                    # status and headers are the answer; other bodies are read.
                    if not response.headers.get("content-type", "").startswith("text/event-stream"):
                        await response.aread()
            except httpx.HTTPError as exc:
                failures.append(f"{what}: {exc!r}")
                return
            if response.status_code >= 500:
                failures.append(f"{what}: {response.status_code} {response.text[:200]}")
            elif response.headers.get("content-type", "").startswith("application/json"):
                body = response.json() if response.content else {}
                error = body.get("error") if isinstance(body, dict) else None
                if isinstance(error, dict) and error.get("code") == -32603:
                    failures.append(f"{what}: JSON-RPC internal error {body}")

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        async with anyio.create_task_group() as tg:
            for call in calls:
                tg.start_soon(one, http, call)
    return len(calls), failures


async def test_no_route_of_a_role_server_answers_bad_input_with_5xx(tmp_path: Path) -> None:
    with anyio.fail_after(170):
        async with role_server(tmp_path, lambda m: {"text": "done"}) as server:
            sent, failures = await fuzz(server, await finished_task(server.url))
    assert sent > 1000
    assert failures == [], "\n".join(failures)


async def test_no_route_of_the_orchestrator_answers_bad_input_with_5xx(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    with anyio.fail_after(170):
        async with (
            role_server(tmp_path / "r", lambda m: {"text": "remote done"}) as coder,
            run_orchestrator_server(
                store_path=tmp_path / "orchestrator.db",
                workdir=workdir,
                network=Network.of(AgentSpec(name="coder", role="coder", url=coder.url)),
                models=lambda name: ScriptedModel([{"text": "TASK_DONE"}]),
                db=str(tmp_path / "orchestrator-tasks.db"),
            ) as orchestrator,
        ):
            routes = {template for template, _ in mounted(list(orchestrator.app.routes))}
            sent, failures = await fuzz(orchestrator, "no-such-task")
    assert any(route.startswith("/api/") for route in routes)  # the control API too
    assert sent > 1000
    assert failures == [], "\n".join(failures)


async def test_bodies_over_the_limit_are_413_on_every_post_route(tmp_path: Path) -> None:
    big = b'{"message": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    with anyio.fail_after(60):
        async with role_server(tmp_path, lambda m: {"text": "done"}) as server:
            assert server.app is not None
            posts = sorted(
                path.replace("{tenant}", "t").replace("{id}", "x")
                for path, method in mounted(list(server.app.routes))
                if method == "POST"
            )
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                statuses = {
                    path: (await http.post(path, content=big)).status_code for path in posts
                }
    assert set(statuses.values()) == {413}, statuses


async def test_subscribing_to_a_finished_task_over_v0_3_rest_is_an_error_not_a_cut(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with role_server(tmp_path, lambda m: {"text": "done"}) as server:
            task_id = await finished_task(server.url)
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                answers = {
                    (method, version): await http.request(
                        method,
                        f"{prefix}/tasks/{task_id}:subscribe",
                        headers={"A2A-Version": version},
                    )
                    for method in ("GET", "POST")
                    for version, prefix in (("0.3", "/rest/v1"), ("1.0", "/rest"))
                }
                unknown = await http.get("/rest/v1/tasks/nope:subscribe")
    for key, response in answers.items():
        assert response.status_code == 400, (key, response.text)
        error = response.json()["error"]
        assert "terminal state" in error["message"], (key, error)
        assert error["details"][0]["reason"] == "UNSUPPORTED_OPERATION", (key, error)
    assert unknown.status_code == 404, unknown.text
