"""How many event streams a server holds open: per caller and in all.

Every open stream holds a connection, a task in the event loop and, for the
web view, a poll of the store; without a bound one caller's streams slowed
the server for everyone. `StreamSlots` counts the streams of each caller
(owner key) and of the server; one past `StreamLimits` is refused before it
starts:

- A2A streams (`SendStreamingMessage`, `SubscribeToTask`, on every binding:
  `handler.RoleRequestHandler` holds the slot) get a2a-sdk's
  `InvalidRequestError` naming the limit, shaped like a quota refusal
  (`quotas.refusal`: `Retry-After`, HTTP 429 on HTTP+JSON).
- The web view's streams (`ui.py`) get HTTP 429 with a JSON message. They
  have slots of their own, at most `VIEW_PER_CALLER` (16) per caller: they
  are a person's pages, and each polls the store.

A slot is held from the stream's start until it ends or its client goes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..storage.tasks.push import count_setting

__all__ = [
    "MAX_STREAMS_ENV",
    "MAX_STREAMS_PER_CALLER_ENV",
    "VIEW_PER_CALLER",
    "StreamLimits",
    "StreamRefused",
    "StreamSlots",
]

MAX_STREAMS_ENV = "A2A_MAX_STREAMS"
MAX_STREAMS_PER_CALLER_ENV = "A2A_MAX_STREAMS_PER_CALLER"

VIEW_PER_CALLER = 16
"""Web view streams one caller may hold open (a page holds one)."""

STREAM_RETRY_AFTER = 5
"""Seconds a refused client is told to wait (no stream's end is known)."""


@dataclass(frozen=True)
class StreamLimits:
    """Streams a server holds open at once."""

    per_caller: int = 512
    """Of one caller (owner key). An orchestrator is one caller of its role
    servers with a stream per remote child, so this leaves room for a wide
    fan-out."""
    per_server: int = 2048
    """Of all callers together."""

    @classmethod
    def from_settings(
        cls, per_caller: int | None = None, per_server: int | None = None
    ) -> StreamLimits:
        """The flags' values (`--max-streams-per-caller`, `--max-streams`), else
        `$A2A_MAX_STREAMS_PER_CALLER` / `$A2A_MAX_STREAMS`, else the defaults."""
        return cls(
            per_caller=count_setting(
                per_caller, MAX_STREAMS_PER_CALLER_ENV, cls.per_caller, what="stream limit"
            ),
            per_server=count_setting(
                per_server, MAX_STREAMS_ENV, cls.per_server, what="stream limit"
            ),
        )

    def for_view(self) -> StreamLimits:
        """The web view's limits: at most `VIEW_PER_CALLER` per caller."""
        return StreamLimits(
            per_caller=min(self.per_caller, VIEW_PER_CALLER), per_server=self.per_server
        )


class StreamRefused(Exception):
    """A stream past a limit; its message names the limit and the setting."""

    def __init__(self, quota: str, limit: int, message: str) -> None:
        super().__init__(message)
        self.quota = quota
        self.limit = limit
        self.retry_after = STREAM_RETRY_AFTER


class StreamSlots:
    """The open streams of a server, by caller (see the module docstring)."""

    def __init__(self, limits: StreamLimits | None = None) -> None:
        self.limits = limits or StreamLimits()
        self._open: dict[str, int] = {}
        self.total = 0

    def open_of(self, owner: str) -> int:
        return self._open.get(owner, 0)

    def refused(self, owner: str) -> StreamRefused | None:
        """Why one more stream of `owner` would be refused; None when it would not."""
        mine = self.open_of(owner)
        if mine >= self.limits.per_caller:
            return StreamRefused(
                "streams_per_caller",
                self.limits.per_caller,
                f"too many open streams: this caller has {mine}, the limit is "
                f"{self.limits.per_caller} per caller (operator setting "
                f"--max-streams-per-caller); close one and retry",
            )
        if self.total >= self.limits.per_server:
            return StreamRefused(
                "streams_per_server",
                self.limits.per_server,
                f"too many open streams: the server has {self.total}, the limit is "
                f"{self.limits.per_server} (operator setting --max-streams); retry later",
            )
        return None

    @contextlib.contextmanager
    def held(self, owner: str) -> Iterator[None]:
        """Hold a slot of `owner` for the block, or raise `StreamRefused`."""
        refused = self.refused(owner)
        if refused is not None:
            raise refused
        self._open[owner] = self.open_of(owner) + 1
        self.total += 1
        try:
            yield
        finally:
            self.total -= 1
            left = self._open[owner] - 1
            if left:
                self._open[owner] = left
            else:
                del self._open[owner]
