"""The one boundary where httpx, gRPC and a2a client errors become
`DelegationError`s (`translate_error`), with the cause kept: the remote
transport's calls run inside `translated(url)`; `says_finished` reads which
of them mean the task is over rather than gone."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
from a2a.client import A2AClientError, A2AClientTimeoutError, AgentCardResolutionError
from a2a.utils.errors import A2AError

from ...errors import AgentUnavailableError, DelegationError, DelegationTimeoutError, ProtocolError
from .grpc_channels import grpc_error, is_grpc_error

__all__ = ["says_finished", "translate_error", "translated"]


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


# What peers answer a follow (SubscribeToTask, tasks/resubscribe) of a task
# that is over, as a2a-sdk's servers word it:
# - 1.x, UnsupportedOperationError: "Task ID is in terminal state:
#   TASK_STATE_COMPLETED" (both request handlers; also ActiveTask.start when
#   the task finished between the handler's read and its tap);
# - 1.x, UnsupportedOperationError: "Task ID is already completed." (the
#   task's ActiveTask finished but is not cleaned up yet, whatever the end);
# - 0.3, InvalidParamsError: "Task ID is in terminal state: completed".
_FINISHED_WORDS = ("is in terminal state", "is already completed")


def says_finished(exc: DelegationError) -> bool:
    """The agent refused a call because the task is over: the task is there
    to be read (GetTask), with its result, artifacts and usage.

    A cue, not the answer: the caller reads the task, and its state decides.
    Answers that mean "gone" are not cues: TaskNotFoundError, or HTTP 404 (a
    REST peer that deletes finished tasks answers so after completion, as it
    does for a task it never had): nothing is left to read, so the result
    cannot be known and the child is lost, not done. A 0.3 server also
    answers tasks/resubscribe with TaskNotFoundError when the task's queue
    is gone, which happens when it finished (or the server restarted) since
    the read; the caller's read tells those apart, since it reads the task
    again after any refused follow, cue or not.
    """
    cause = exc.__cause__
    return isinstance(cause, A2AError | A2AClientError) and any(
        words in str(cause) for words in _FINISHED_WORDS
    )
