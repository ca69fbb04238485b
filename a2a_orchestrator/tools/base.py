"""What a tool is: a spec the model sees and a coroutine that runs it.

Also the one seam between the runtime's at-most-once bookkeeping and the
tools that start processes: the runtime sets `current_call` around each tool
call; `run_command` puts `CallScope.marker` in its command's environment and
reports the process group it started through `CallScope.record_process`, so
a later recovery can find and kill what a crashed process left running.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ..models.base import ToolSpec
from .procs import CALL_MARKER_ENV

__all__ = ["CALL_MARKER_ENV", "CallScope", "Tool", "current_call"]


@dataclass(frozen=True, kw_only=True)
class CallScope:
    """The tool call being run, as the runtime's journal knows it.

    `marker` is unique per execution and recorded before the call starts;
    `record_process(pgid, start_ticks)` durably records a process group the
    call started (its leader's start time from /proc, in clock ticks).
    """

    marker: str
    record_process: Callable[[int, int], Awaitable[None]]


current_call: ContextVar[CallScope | None] = ContextVar("current_call", default=None)
"""Set by the runtime while a tool call runs; None outside one (tests, direct calls)."""


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One callable tool.

    `run` gets the parsed arguments and returns the text the model reads.
    It raises `ToolError` (with a message meant for the model) when the call
    is refused or fails; the runtime reports that as an unsuccessful result.
    """

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    run: Callable[[dict[str, Any]], Awaitable[str]]
    read_only: bool = False
    """True for a tool with no side effect (it only reads): its calls are not
    journaled, since running one again is harmless; after a crash, one
    without a recorded result is answered as not run, and a step of such
    calls alone is played again."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)
