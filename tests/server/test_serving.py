"""What a client without a token can cost a server: bodies it announces,
request heads (and unread bodies) it trickles, answers it does not read.

Real servers on 127.0.0.1 (the orchestrator's, which has every kind of
route: A2A, its HTTP API, the web view, push webhooks) and raw sockets, to
see when the server answers and when it closes.
"""

from __future__ import annotations

import contextlib
import functools
import re
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from support.ports import until_not_established, until_not_established_blocking
from support.ui import orchestrator

from a2a_orchestrator.server.serving import bind_socket, serve

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


# A plain app stands in for a role server's: the deadline is the connection
# protocol's (serving.py), below any app, and the test needs a short one.
async def _card(request: Request) -> JSONResponse:
    return JSONResponse({"name": "card"})


ASSET = 512 * 1024


async def _asset(request: Request) -> Response:
    """A public answer of some size (the web view's script is one)."""
    return Response(b"a" * ASSET, media_type="text/javascript")


@asynccontextmanager
async def _served(**options: Any) -> AsyncIterator[int]:
    app = Starlette(
        routes=[
            Route("/.well-known/agent-card.json", _card),
            Route("/ui/static/ui.js", _asset),
        ]
    )
    sock = bind_socket("127.0.0.1", 0)
    async with anyio.create_task_group() as tg:
        yield await tg.start(functools.partial(serve, app, sock, **options))
        tg.cancel_scope.cancel()


async def _card_latencies(port: int, until: float) -> list[float]:
    """Seconds each card request took, one every 0.2 s until `until`."""
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=5) as http:
        while anyio.current_time() < until:
            started = anyio.current_time()
            answer = await http.get(f"http://127.0.0.1:{port}/.well-known/agent-card.json")
            assert answer.status_code == 200
            latencies.append(anyio.current_time() - started)
            await anyio.sleep(0.2)
    return latencies


async def test_trickling_heads_are_closed_at_the_deadline_and_the_card_keeps_answering() -> None:
    # Issue 26 finding 5: a connection trickling its head was never closed.
    count, deadline = 300, 2.0
    closed_after: list[float] = []
    replies: list[bytes] = []
    with anyio.fail_after(30):
        async with _served(head_timeout=deadline) as port:
            started = anyio.current_time()

            async def trickle() -> None:
                stream = await anyio.connect_tcp("127.0.0.1", port)
                opened = anyio.current_time()
                async with stream:
                    reply = b""
                    closing = (anyio.EndOfStream, anyio.BrokenResourceError, OSError)
                    with contextlib.suppress(*closing):
                        await stream.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                        # A header byte every 0.3 s, never the blank line;
                        # stops when the server closes (or after 8 s).
                        with anyio.move_on_after(8):
                            while True:
                                await stream.send(b"X")
                                with anyio.move_on_after(0.3):
                                    reply += await stream.receive()
                    closed_after.append(anyio.current_time() - opened)
                    replies.append(reply)

            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(trickle)
                latencies = await _card_latencies(port, started + deadline + 1)
    assert len(closed_after) == count
    assert max(latencies) < 1.0, latencies
    assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies), replies[:3]
    # Timed from each connection's opening (the server's clock starts when it
    # accepts, a little later under load).
    assert deadline - 0.2 <= min(closed_after) and max(closed_after) < deadline + 2.5


async def test_past_the_pending_heads_cap_the_longest_waiting_is_closed() -> None:
    cap = 20
    with anyio.fail_after(30):
        async with _served(head_timeout=30, max_pending_heads=cap) as port:
            silent = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(cap)]
            await anyio.sleep(0.2)  # all accepted and waiting
            newer = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(5)]
            evicted: list[bytes] = []
            for stream in silent[:5]:
                with anyio.fail_after(2):
                    evicted.append(await _head_of_answer(stream))
            with anyio.move_on_after(0.5) as kept:
                await silent[5].receive()
            # (Each card request is a new connection too: it closes the next oldest.)
            latencies = await _card_latencies(port, anyio.current_time() + 0.5)
            for stream in silent + newer:
                await stream.aclose()
    assert all(reply.startswith(b"HTTP/1.1 408") for reply in evicted)
    assert kept.cancel_called  # the sixth oldest still waits: only as many closed as needed
    assert max(latencies) < 1.0


async def test_the_rest_of_a_body_answered_unread_cannot_be_trickled_for_ever() -> None:
    # A response sent before its request's body (as the web view's assets
    # and the login form are, to anyone): uvicorn read on to discard the
    # announced body, and its keep-alive timer stopped at the first byte of
    # it, so a byte a second held the connection for ever.
    deadline = 1.5
    with anyio.fail_after(30):
        async with _served(head_timeout=deadline) as port:
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with stream:
                await stream.send(
                    b"GET /.well-known/agent-card.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Length: 1000000000\r\n\r\n"
                )
                answer = await _head_of_answer(stream)
                answered = anyio.current_time()
                late = b""
                with anyio.move_on_after(8) as held:
                    with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                        while True:
                            await stream.send(b"x")
                            with anyio.move_on_after(0.3):
                                late += await stream.receive()
                closed_after = anyio.current_time() - answered
    assert answer.startswith(b"HTTP/1.1 200")
    assert not held.cancel_called, "the connection was still open 8 s after its answer"
    assert deadline - 0.2 <= closed_after < deadline + 1.5
    assert b"408" not in late  # its request was answered: no second response


def _pipelined_unread(port: int, count: int, unread_for: float) -> tuple[int, str]:
    """Ask for the asset `count` times at once, read nothing for `unread_for`
    seconds (or until the server ends the connection), then read: the bytes
    received and how the connection ended."""
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /ui/static/ui.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * count)
        until_not_established_blocking(client, unread_for)
        return _read_to_the_end(client)


def _read_to_the_end(client: socket.socket) -> tuple[int, str]:
    """The bytes `client` still receives, and how its connection ends
    ("open": nothing for 3 s)."""
    client.settimeout(3)
    received = 0
    try:
        while chunk := client.recv(65536):
            received += len(chunk)
    except ConnectionResetError:
        return received, "reset"
    except TimeoutError:
        return received, "open"
    return received, "closed"


async def test_a_client_that_reads_no_answer_is_dropped_at_the_write_deadline() -> None:
    # Requests for a public asset, pipelined, their answers never read: the
    # server waited for ever for room in the socket, the connection and
    # megabytes of kernel buffers held without a token.
    count = 40
    with anyio.fail_after(30):
        async with _served(write_timeout=1.0) as port:
            received, ended = await anyio.to_thread.run_sync(_pipelined_unread, port, count, 3.0)
    assert ended in ("reset", "closed"), (received, ended)
    assert received < count * ASSET / 2


async def _closing(request: Request) -> Response:
    """An answer after which the server closes the connection (as a 401 does),
    of the size asked for in kibibytes."""
    size = int(request.query_params.get("kib", "32")) * 1024
    return Response(b"a" * size, headers={"connection": "close"})


async def test_a_closed_connection_whose_client_reads_nothing_is_let_go() -> None:
    # Closing waits until the unsent bytes are sent: a client that read
    # nothing held the socket for ever, with too few bytes left to pause
    # writing (and start the write deadline). Small kernel buffers on both
    # sides (accepted sockets inherit the listening one's) stand in for
    # full ones.
    app = Starlette(routes=[Route("/x", _closing)])
    sock = bind_socket("127.0.0.1", 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with anyio.fail_after(30), socket.socket() as client:
        async with anyio.create_task_group() as tg:
            options = {"write_timeout": 1.0}
            port = await tg.start(functools.partial(serve, app, sock, **options))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            client.connect(("127.0.0.1", port))
            client.sendall(b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            await until_not_established(client, 3)
            received, ended = await anyio.to_thread.run_sync(_read_to_the_end, client)
            tg.cancel_scope.cancel()
    assert ended == "reset", (received, ended)
    assert received < 32 * 1024


async def test_reading_a_little_of_a_closed_connections_answer_buys_no_time() -> None:
    # The client reads most of a large last answer (enough for writing to
    # resume) and then nothing: resuming must not cancel the deadline of a
    # connection already closed, or the rest waits for ever.
    app = Starlette(routes=[Route("/x", _closing)])
    sock = bind_socket("127.0.0.1", 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    size = 256 * 1024

    def read_most_then_stop(client: socket.socket) -> int:
        received = 0
        while received < size - 20 * 1024:
            received += len(client.recv(4096))
        return received

    with anyio.fail_after(30), socket.socket() as client:
        async with anyio.create_task_group() as tg:
            options = {"write_timeout": 1.5}
            port = await tg.start(functools.partial(serve, app, sock, **options))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            client.connect(("127.0.0.1", port))
            client.sendall(f"GET /x?kib={size // 1024} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            first = await anyio.to_thread.run_sync(read_most_then_stop, client)
            await until_not_established(client, 3)
            rest, ended = await anyio.to_thread.run_sync(_read_to_the_end, client)
            tg.cancel_scope.cancel()
    assert ended == "reset", (first, rest, ended)
    assert first + rest < size
