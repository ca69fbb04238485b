"""Serve an ASGI app with uvicorn on a socket bound up front.

Binding first gives the real port before uvicorn starts (no probe-then-rebind
race), and the socket is created with IPPROTO_TCP so asyncio sets TCP_NODELAY
on accepted connections; a plain `socket.socket()` leaves every kept-alive
response stalled ~40 ms on a delayed ACK.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator

import anyio
import uvicorn
from anyio.abc import TaskStatus
from starlette.types import ASGIApp

__all__ = ["MAX_REQUEST_HEAD", "bind_socket", "serve", "server_config"]

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


def server_config(app: ASGIApp, log_level: str = "warning") -> uvicorn.Config:
    """The uvicorn settings every server here runs with."""
    return uvicorn.Config(
        app,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=5,
        ws="none",
        # h11 whatever else is installed: uvicorn's "auto" takes httptools
        # when it can be imported (uvicorn[standard] brings it), and that
        # parser buffers a request head of any size, so a header flood
        # would grow a connection's buffer without bound.
        http="h11",
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
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `sock` (from `bind_socket`) until cancelled, or with
    signal handlers until SIGINT/SIGTERM; closes the socket at the end.

    Reports the port through `task_status` once uvicorn accepts connections,
    so after `await tg.start(serve, app, sock)` the server is ready.
    """
    config = server_config(app, log_level)
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
