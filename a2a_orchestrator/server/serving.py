"""Serve an ASGI app with uvicorn on a socket bound up front.

Binding first gives the real port before uvicorn starts (no probe-then-rebind
race), and the socket is created with IPPROTO_TCP so asyncio sets TCP_NODELAY
on accepted connections; a plain `socket.socket()` leaves every kept-alive
response stalled ~40 ms on a delayed ACK.

Request heads have a deadline (`HeadDeadlineProtocol`): uvicorn has no
header timeout, so a client trickling its request line and headers (or
sending nothing after connecting) held its connection for ever, and enough
of them ran the server out of file descriptors. Here a connection waiting
for a request's head is closed with 408 `HEAD_TIMEOUT` seconds after it
opened (or after its previous response), and at most `MAX_PENDING_HEADS`
connections wait at once: past that the one waiting longest is closed.
A head that arrives whole in one read (every ordinary client's) never waits.
The same deadline holds the rest of a body the server answered before
reading (uvicorn reads it only to discard it): it is closed, without a 408,
`HEAD_TIMEOUT` seconds after that response.

Responses have a deadline too: a client that stops reading (a public
asset's requests pipelined, none of the answers read) left a response
waiting for ever for room in the socket, its connection and megabytes of
kernel buffers held without a token. A connection whose response has had
no room for `WRITE_TIMEOUT` seconds is dropped, and so is one the server
closed `WRITE_TIMEOUT` seconds ago with bytes its client has not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import struct
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import h11
import uvicorn
from anyio.abc import TaskStatus
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = [
    "HEAD_TIMEOUT",
    "MAX_PENDING_HEADS",
    "MAX_REQUEST_HEAD",
    "WRITE_TIMEOUT",
    "HeadDeadlineProtocol",
    "bind_socket",
    "serve",
    "server_config",
]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        before_shutdown: Callable[[], Awaitable[None]] | None,
        handle_signals: bool,
    ) -> None:
        super().__init__(config)
        self._before_shutdown = before_shutdown
        self._handle_signals = handle_signals

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn re-raises a captured signal after its shutdown, which would
        # kill the process with SIGTERM's status after a clean stop; here a
        # signal only asks for the orderly shutdown, and the caller exits 0.
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Runs before uvicorn waits for open connections: ending running tasks
        # here lets streaming clients receive their terminal event instead of
        # a cut connection.
        if self._before_shutdown is not None:
            await self._before_shutdown()
        await super().shutdown(sockets)


MAX_REQUEST_HEAD = 16 * 1024
"""Bytes of a request's line and headers h11 buffers while waiting for their
end; past it the request gets 400 (a head that arrives whole in one read of
the socket is parsed at once, whatever its size up to that read's)."""


HEAD_TIMEOUT = 10.0
"""Seconds a connection may take to send a request's head (request line and
headers), from its opening or its previous response's end."""

MAX_PENDING_HEADS = 1024
"""Connections of one server waiting for a request's head at once; a new one
past it closes the one waiting longest."""

WRITE_TIMEOUT = 30.0
"""Seconds a response may wait for its client to read (the socket's and the
transport's buffers full, none of it sent) before the connection is dropped."""

_HEAD_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 31\r\nconnection: close\r\n\r\nrequest head not sent in time\r\n"
)


class _Config(uvicorn.Config):
    """uvicorn's settings, and the head deadline's (read by `HeadDeadlineProtocol`)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        head_timeout: float,
        max_pending_heads: int,
        write_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self.head_timeout = head_timeout
        self.max_pending_heads = max_pending_heads
        self.write_timeout = write_timeout
        # The server's connections waiting for a head, oldest first (a dict
        # keeps insertion order; the event loop is the only writer).
        self.pending_heads: dict[HeadDeadlineProtocol, None] = {}


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request heads (see the module docstring).

    A connection waits for a head while h11 says the client is IDLE: no
    request of it is being read or answered. The timer runs from the moment
    it starts waiting, not from its last byte, so trickling does not extend it.
    """

    config: _Config

    def __init__(self, config: _Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._track_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self._writing()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        # The transport's buffer is past its high-water mark: the client
        # has not read for a while (the kernel's buffers filled first).
        super().pause_writing()
        self._start_write_timer()

    def _start_write_timer(self) -> None:
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(
                self.config.write_timeout, self._write_timed_out
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self.transport.is_closing():
            # A closing connection keeps its deadline: reading a little,
            # enough to resume writing, must not buy the rest unlimited time.
            self._writing()

    def _writing(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_timed_out(self) -> None:
        self._write_timer = None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            # A reset, not a FIN queued behind the unsent bytes: the kernel
            # would keep those (and the socket) while the client stalls.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Not close(): that waits for the buffer to be sent, which is what
        # the client is not letting happen.
        self.transport.abort()

    def handle_events(self) -> None:
        # Runs on every read and after every response: the one place that
        # sees a head complete and a new one start being waited for.
        super().handle_events()
        self._track_head()

    def on_response_complete(self) -> None:
        # A response sent before its request's body was read (a refusal on
        # a declared length, a public asset): uvicorn goes on reading that
        # body only to discard it and starts no new cycle, so the timer
        # must start here, at the response's end.
        super().on_response_complete()
        self._track_head()

    def _track_head(self) -> None:
        if self.transport.is_closing():
            self._stop_waiting()
            if self.transport.get_write_buffer_size():
                # Closed with bytes unsent (a last response, a 408 or 400):
                # asyncio keeps the socket until they are, which a client
                # not reading puts off for ever, below the high-water mark
                # that would have paused writing.
                self._start_write_timer()
        elif self.conn.their_state is h11.IDLE or (
            # Answered, the rest of its body still coming: uvicorn's
            # keep-alive timer stops at the first byte of it and is not set
            # again, so a client trickling it would hold the connection.
            self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.DONE
        ):
            self._start_waiting()
        else:
            self._stop_waiting()

    def _start_waiting(self) -> None:
        if self._head_timer is not None:
            return
        pending = self.config.pending_heads
        while len(pending) >= self.config.max_pending_heads:
            next(iter(pending))._head_timed_out()
        pending[self] = None
        self._head_timer = self.loop.call_later(self.config.head_timeout, self._head_timed_out)

    def _stop_waiting(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self.config.pending_heads.pop(self, None)

    def _head_timed_out(self) -> None:
        self._stop_waiting()
        if not self.transport.is_closing():
            if self.conn.their_state is h11.IDLE:
                # Written by hand: h11 sends no response before a request's head.
                self.transport.write(_HEAD_TIMEOUT_RESPONSE)
            self.transport.close()
            self._track_head()


def server_config(
    app: ASGIApp,
    log_level: str = "warning",
    *,
    head_timeout: float = HEAD_TIMEOUT,
    max_pending_heads: int = MAX_PENDING_HEADS,
    write_timeout: float = WRITE_TIMEOUT,
) -> uvicorn.Config:
    """The uvicorn settings every server here runs with."""
    return _Config(
        app,
        head_timeout=head_timeout,
        max_pending_heads=max_pending_heads,
        write_timeout=write_timeout,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ws="none",
        # h11 whatever else is installed: uvicorn's "auto" takes httptools
        # when it can be imported (uvicorn[standard] brings it), and that
        # parser buffers a request head of any size, so a header flood
        # would grow a connection's buffer without bound.
        # (with the head deadline: `HeadDeadlineProtocol`).
        http=HeadDeadlineProtocol,
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD,
        # An idle kept-alive connection is closed after this many seconds, so
        # idle clients cannot pin connections; slow request bodies are cut by
        # the body middleware's deadline (408).
        timeout_keep_alive=5,
    )


async def serve(
    app: ASGIApp,
    sock: socket.socket,
    *,
    before_shutdown: Callable[[], Awaitable[None]] | None = None,
    install_signal_handlers: bool = False,
    log_level: str = "warning",
    head_timeout: float = HEAD_TIMEOUT,
    max_pending_heads: int = MAX_PENDING_HEADS,
    write_timeout: float = WRITE_TIMEOUT,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `sock` (from `bind_socket`) until cancelled, or with
    signal handlers until SIGINT/SIGTERM; closes the socket at the end.

    Reports the port through `task_status` once uvicorn accepts connections,
    so after `await tg.start(serve, app, sock)` the server is ready.
    """
    config = server_config(
        app,
        log_level,
        head_timeout=head_timeout,
        max_pending_heads=max_pending_heads,
        write_timeout=write_timeout,
    )
    server = _Server(config, before_shutdown, install_signal_handlers)
    finished = anyio.Event()

    async def run() -> None:
        # Shielded so that cancelling `serve` becomes uvicorn's own orderly
        # shutdown (lifespan, connections) instead of a cut in mid-flight.
        with anyio.CancelScope(shield=True):
            try:
                await server.serve([sock])
            finally:
                finished.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            # uvicorn has no readiness callback; `started` flips once it listens.
            while not server.started:
                if finished.is_set():
                    raise RuntimeError(f"server on {sock.getsockname()} failed to start")
                await anyio.sleep(0.005)
            task_status.started(sock.getsockname()[1])
            try:
                await finished.wait()
            finally:
                server.should_exit = True
                with anyio.CancelScope(shield=True):
                    with anyio.move_on_after(15):
                        await finished.wait()
                    server.force_exit = True
    finally:
        sock.close()
