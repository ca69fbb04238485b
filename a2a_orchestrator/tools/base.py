"""What a tool is: a spec the model sees and a coroutine that runs it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..models.base import ToolSpec

__all__ = ["Tool"]


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

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)
