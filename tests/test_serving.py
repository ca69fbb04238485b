"""What a client without a token can cost a server: bodies it announces,
request heads it trickles.

Real servers on 127.0.0.1 (the orchestrator's, which has every kind of
route: A2A, its HTTP API, the web view, push webhooks) and raw sockets, to
see when the server answers and when it closes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc
import pytest
from starlette.routing import BaseRoute, Mount, Route
from test_ui import orchestrator

pytestmark = pytest.mark.anyio

BIG = 3 * 1024 * 1024 + 768 * 1024  # 3.75 MiB, the size of the uploads


async def _head_of_answer(stream: anyio.abc.ByteStream) -> bytes:
    """The status line and headers the server sends ("" if it closes first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            data += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            break
    return data


def _every_route(routes: Sequence[BaseRoute], prefix: str = "") -> list[tuple[str, str]]:
    """(path, method) of every route, path parameters filled in."""
    found: list[tuple[str, str]] = []
    for route in routes:
        if isinstance(route, Mount):
            found += _every_route(route.routes, prefix + route.path)
            continue
        assert isinstance(route, Route)
        path = re.sub(r"\{\w+\}", "x", prefix + route.path)
        found += [(path, method) for method in sorted(route.methods or ()) if method != "HEAD"]
    return found


async def test_an_unauthenticated_large_body_is_refused_unread_on_every_route(
    tmp_path: Path,
) -> None:
    # Issue 26 finding 4: the push webhook read a body before checking its
    # token. Each request announces 3.75 MiB and sends 10 bytes: a route
    # that read the body first would sit waiting for the rest.
    answers: dict[tuple[str, str], bytes] = {}
    with anyio.fail_after(120):
        async with orchestrator(tmp_path) as server:
            assert server.app is not None
            routes = _every_route(server.app.routes)
            assert ("/a2a/push/x", "POST") in routes and ("/", "POST") in routes
            # Served before the routes (ui_auth.py): the login form, logout, the page's assets.
            routes += [("/ui/login", "POST"), ("/ui/logout", "POST"), ("/ui/static/ui.css", "GET")]
            for path, method in routes:
                stream = await anyio.connect_tcp("127.0.0.1", server.port)
                async with stream:
                    await stream.send(
                        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                        + b"Content-Type: application/json\r\n"
                        + f"Content-Length: {BIG}\r\n\r\n".encode()
                        + b'{"jsonrpc"'
                    )
                    answers[path, method] = b""
                    with anyio.move_on_after(3):
                        answers[path, method] = await _head_of_answer(stream)
    late = {key for key, reply in answers.items() if not reply.startswith(b"HTTP/1.1 ")}
    assert late == set(), "no answer before the body was sent"
    admitted = {
        key: reply.split(b"\r\n", 1)[0]
        for key, reply in answers.items()
        if key[0] != "/ui/static/ui.css"  # public, answered without reading the body
        and not re.match(rb"HTTP/1.1 (30[0-9]|4[0-9][0-9]) ", reply)
    }
    assert admitted == {}
    # Refused by a credential check on the headers, not by a size rule.
    assert answers["/a2a/push/x", "POST"].startswith(b"HTTP/1.1 401")
    assert answers["/", "POST"].startswith(b"HTTP/1.1 401")
