"""The one boundary where httpx, gRPC and a2a client errors become
`DelegationError`s (`translate_error`), with the cause kept: the remote
transport's calls run inside `translated(url)`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from a2a.client import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.utils.errors import A2AError

from ..errors import AgentUnavailableError, DelegationError, DelegationTimeoutError, ProtocolError
from .grpc_channels import grpc_error, is_grpc_error

__all__ = ["translate_error", "translated"]


def translate_error(exc: BaseException, url: str) -> DelegationError:
    """The project's error for an httpx or a2a client failure (cause kept by the caller)."""
    cause = exc.__cause__
    if isinstance(exc, A2AClientTimeoutError | httpx.TimeoutException) or isinstance(
        cause, httpx.TimeoutException
    ):
        return DelegationTimeoutError(f"agent at {url} did not answer in time: {exc}")
    if isinstance(exc, httpx.HTTPStatusError) or isinstance(cause, httpx.HTTPStatusError):
        status = exc if isinstance(exc, httpx.HTTPStatusError) else cause
        assert isinstance(status, httpx.HTTPStatusError)
        code = status.response.status_code
        if code in (401, 403):
            return ProtocolError(f"agent at {url} refused the call ({code}): check its token")
        return ProtocolError(f"agent at {url} answered HTTP {code}")
    if isinstance(exc, httpx.TransportError) or isinstance(cause, httpx.TransportError):
        return AgentUnavailableError(f"agent at {url} is unreachable: {cause or exc}")
    if isinstance(exc, A2AClientError) and is_grpc_error(cause):
        return grpc_error(cause, url)
    if isinstance(exc, AgentCardResolutionError):
        # Not a transport failure (those are above): the card came and is
        # not JSON or not a card.
        return ProtocolError(f"agent at {url} has no usable agent card: {exc}")
    if isinstance(exc, A2AClientError):
        return AgentUnavailableError(f"agent at {url}: {exc}")
    if isinstance(exc, A2AError):
        return ProtocolError(f"agent at {url} answered with an error: {exc}")
    return ProtocolError(f"agent at {url}: {type(exc).__name__}: {exc}")


_TRANSLATED = (httpx.HTTPError, A2AError)


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Raise what an a2a client, httpx or gRPC call raises as a `DelegationError`."""
    try:
        yield
    except _TRANSLATED as exc:
        raise translate_error(exc, url) from exc
