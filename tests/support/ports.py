"""Loopback ports: a free one to serve on, one nothing listens on."""

from __future__ import annotations

import socket
import time

import anyio


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def until_not_established(client: socket.socket, within: float) -> None:
    """Wait until the server ends `client`'s TCP connection (a reset or its
    FIN), for at most `within` seconds. The state is read with TCP_INFO,
    which neither reads the socket's bytes nor clears its error, so what
    the test reads afterwards is what it would have read then."""
    with anyio.move_on_after(within):
        while _state(client) == TCP_ESTABLISHED:
            await anyio.sleep(0.02)


TCP_ESTABLISHED = 1  # tcpi_state, the first byte of Linux's struct tcp_info


def until_not_established_blocking(client: socket.socket, within: float) -> None:
    """`until_not_established` for a thread that is not async."""
    deadline = time.monotonic() + within
    while _state(client) == TCP_ESTABLISHED and time.monotonic() < deadline:
        time.sleep(0.02)


def _state(client: socket.socket) -> int:
    return client.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
