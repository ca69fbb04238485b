"""The seam between the agent runtime and what watches it from a server.

A server installs its `Instruments` for everything that runs on its behalf
(`InstrumentsMiddleware`: requests and the lifespan, and so every task
they start); a `Conversation` looks them up once per turn and per model
call. With none installed (the CLI, a library user) both hooks hand back
what they were given, so the runtime pays one context-variable read.

A context variable, not a parameter, because conversations are built in
several places (role servers, in-process children, parent agents), while
what watches them belongs to the server they run in: two servers in one
process (tests, `demo`) each see only their own work.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

from ..errors import ModelError
from ..models.base import Usage
from .events import ChildEvent

__all__ = ["Instruments", "InstrumentsMiddleware", "observed_emit", "observed_stream"]

T = TypeVar("T")


class Instruments(Protocol):
    """What a server watches in the conversations it runs."""

    def event(self, role: str, model: str, event: ChildEvent, tools: Collection[str] = ()) -> None:
        """Every event a turn emits, as it emits it; `tools`: the names of the
        tools the conversation has (a tool call may name any other)."""

    def model_call(
        self, role: str, model: str, seconds: float, usage: Usage, error: ModelError | None
    ) -> None:
        """One model call ended: its wall time, the tokens it reported, and
        the error that ended it (None: it answered)."""


_current: ContextVar[Instruments | None] = ContextVar("a2a_instruments", default=None)


def observed_emit(
    emit: Callable[[ChildEvent], Awaitable[None]],
    role: str,
    model: str,
    tools: Collection[str] = (),
) -> Callable[[ChildEvent], Awaitable[None]]:
    """`emit`, telling the installed instruments of each event first (and
    the conversation's `tools`)."""
    instruments = _current.get()
    if instruments is None:
        return emit

    async def observed(event: ChildEvent) -> None:
        instruments.event(role, model, event, tools)
        await emit(event)

    return observed


def observed_stream(stream: AsyncIterator[T], role: str, model: str) -> AsyncIterator[T]:
    """`stream` (one model call), timed and its usage counted for the
    installed instruments."""
    instruments = _current.get()
    if instruments is None:
        return stream
    return _timed(stream, instruments, role, model)


async def _timed(
    stream: AsyncIterator[T], instruments: Instruments, role: str, model: str
) -> AsyncIterator[T]:
    started = time.perf_counter()
    usage = Usage()
    try:
        async for item in stream:
            if isinstance(item, Usage):
                usage = usage + item
            yield item
    except ModelError as exc:
        instruments.model_call(role, model, time.perf_counter() - started, usage, exc)
        raise
    instruments.model_call(role, model, time.perf_counter() - started, usage, None)


class InstrumentsMiddleware:
    """ASGI middleware installing `instruments` for every request and for the
    lifespan (so for the tasks each of them starts)."""

    def __init__(self, app: Callable[[Any, Any, Any], Awaitable[None]], instruments: Instruments):
        self.app = app
        self.instruments = instruments

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        token = _current.set(self.instruments)
        try:
            await self.app(scope, receive, send)
        finally:
            _current.reset(token)
