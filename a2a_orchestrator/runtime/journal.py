"""What a conversation needs of the tool-call journal: one scope's calls.

The runtime writes a side-effecting call's start before the call runs, adds
the process group a command started, and closes the call once its result is
recorded (at most once: `conversation.py`). Where the rows live is the
storage layer's (`storage/journal.py`, whose `CallJournal` is this protocol
on disk); the runtime names only the shape.
"""

from __future__ import annotations

from typing import Protocol

from ..models.base import ToolCall

__all__ = ["Journal"]


class Journal(Protocol):
    """One conversation's tool-call journal (one scope)."""

    async def started(self, call: ToolCall) -> str:
        """Record that `call` starts now; return its marker (unique per run)."""
        ...

    async def process(self, marker: str, pgid: int, ticks: int) -> None:
        """Record the process group (and its start ticks) the call started."""
        ...

    async def finished(self, marker: str, outcome: str = "done") -> None:
        """Close the call: its result is recorded."""
        ...
