"""The orchestrator's gRPC channels to agents whose cards prefer gRPC.

One channel per target for the delegate's life, shared by every client of
that agent (turns, control messages, probes), as the httpx client is shared
for the HTTP bindings: a2a-sdk's gRPC transport closes its channel when its
client closes, so clients get a handle whose `close` leaves the shared
channel open; `GrpcChannels.aclose` closes them all.

Targets: a card's gRPC URL is `host:port` (a2a-sdk's and this project's
servers), or with a scheme: `grpc://` is plaintext, `grpcs://` and `https://`
use TLS with the system's roots.

`grpc_error` is the remote transport's translation of a failed gRPC call
(the status code the SDK's client error carries as its cause).
"""

from __future__ import annotations

from typing import Any, TypeGuard
from urllib.parse import urlsplit

import grpc
import grpc.aio

from ...errors import AgentUnavailableError, DelegationError, ProtocolError

__all__ = ["GrpcChannels", "grpc_error", "is_grpc_error"]

_TLS_SCHEMES = frozenset({"grpcs", "https"})


class _SharedChannel:
    """A channel whose `close` is its owner's (`GrpcChannels`) to do."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    async def close(self, grace: float | None = None) -> None:
        """Kept open: other clients of the agent use it."""


class GrpcChannels:
    """The channels of one delegate (see the module docstring)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._closed = False

    def channel(self, url: str) -> Any:
        """The channel to a card's gRPC `url` (a2a-sdk's `grpc_channel_factory`)."""
        if self._closed:
            raise RuntimeError("the delegate's gRPC channels are closed")
        channel = self._channels.get(url)
        if channel is None:
            parts = urlsplit(url if "//" in url else f"//{url}")
            target = parts.netloc or url
            if parts.scheme in _TLS_SCHEMES:
                channel = grpc.aio.secure_channel(target, grpc.ssl_channel_credentials())
            else:
                channel = grpc.aio.insecure_channel(target)
            self._channels[url] = channel
        return _SharedChannel(channel)

    @property
    def targets(self) -> list[str]:
        """The gRPC URLs a channel was opened to."""
        return list(self._channels)

    async def aclose(self) -> None:
        self._closed = True
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


_UNAVAILABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED}
)
_REFUSED = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def is_grpc_error(exc: BaseException | None) -> TypeGuard[grpc.aio.AioRpcError]:
    """`exc` is a failed gRPC call (the cause of an a2a client error)."""
    return isinstance(exc, grpc.aio.AioRpcError)


def grpc_error(call: grpc.aio.AioRpcError, url: str) -> DelegationError:
    """The project's error for a gRPC call that failed with `call`'s status
    (a deadline is the SDK's timeout error, translated before this)."""
    code = call.code()
    if code in _REFUSED:
        return ProtocolError(
            f"agent at {url} refused the call ({code.name}: {call.details()}): check its token"
        )
    if code in _UNAVAILABLE:
        # Like a refused or cut HTTP connection: worth trying again.
        return AgentUnavailableError(f"agent at {url} is unreachable: {call.details()}")
    return ProtocolError(f"agent at {url} answered gRPC {code.name}: {call.details()}")
