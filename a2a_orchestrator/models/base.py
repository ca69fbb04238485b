"""The `Model` protocol: what the agent runtime needs from a language model.

A model is handed the conversation so far (chat messages in the OpenAI shape,
which every OpenAI-compatible server and our transcripts share) and the tools
it may call, and streams back text deltas, complete tool calls and token usage.
A call that was cut and retried says so with a `Restart`: the text before it
is withdrawn, and the message begins again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

__all__ = [
    "ChatMessage",
    "Model",
    "ModelItem",
    "Restart",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "Usage",
]

ChatMessage: TypeAlias = dict[str, Any]
"""One message in the OpenAI chat shape: `role` (system / user / assistant /
tool), `content`, and for assistant turns `tool_calls`
(`[{"id", "type": "function", "function": {"name", "arguments": "<json>"}}]`),
for tool results `tool_call_id`."""


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    """The name the model calls it by."""
    description: str
    """What it does, for the model."""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    """JSON schema of the arguments object."""


@dataclass(frozen=True, kw_only=True)
class TextDelta:
    """A piece of the assistant's text, in stream order."""

    text: str


@dataclass(frozen=True, kw_only=True)
class Restart:
    """The text streamed so far in this call is withdrawn: the stream was cut
    and the retry begins the message again (its text may differ). Only text
    goes before a `Restart`; tool calls and usage never do."""

    reason: str
    """Why the first attempt broke off (the endpoint's error, for logs and views)."""


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """A complete tool call (streamed fragments are joined before it is emitted)."""

    id: str
    """The call id, echoed back in the tool result."""
    name: str
    arguments: dict[str, Any]
    """Parsed arguments; a model that sent invalid JSON gets `{"_raw": text}`."""


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Token counts for one model call, or a sum of several."""

    input_tokens: int = 0
    output_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )

    def as_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}


ModelItem: TypeAlias = TextDelta | Restart | ToolCall | Usage


@runtime_checkable
class Model(Protocol):
    """Streams one assistant turn.

    Raise `ModelError` for anything the caller should see as "the model
    failed" (unreachable, bad credentials, malformed answer).
    """

    @property
    def name(self) -> str:
        """The concrete model name, for events and the children table."""
        ...

    def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncIterator[ModelItem]:
        """Yield the turn's text deltas, tool calls and usage, in order; a
        `Restart` withdraws the text deltas yielded before it."""
        ...
