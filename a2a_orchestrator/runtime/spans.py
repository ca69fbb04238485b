"""The seam between a conversation and whoever traces it.

A `Conversation` opens a span around each model call and each tool call
through the `Spans` it was given; whoever builds it (a role server, the
in-process transport, a parent agent) gives the tracer's
(`observe/tracing.py`), so the runtime itself imports no tracing. Built
without one, a conversation opens none (`NO_SPANS`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from ..models.base import ChatMessage, Model, ModelItem, ToolSpec

__all__ = ["NO_SPANS", "Spans", "ToolSpan"]


class ToolSpan(Protocol):
    """The span of one tool call, told how the call went."""

    def succeeded(self, success: bool) -> None: ...


class Spans(Protocol):
    """The spans a conversation opens."""

    def model_call(
        self, model: Model, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncIterator[ModelItem]:
        """`model.stream(messages, tools)`, inside a span of the model call."""
        ...

    def tool_call(self, tool: str) -> AbstractContextManager[ToolSpan]:
        """A span current while the tool runs."""
        ...


class _NoToolSpan:
    def succeeded(self, success: bool) -> None:
        return None


class _NoSpans:
    def model_call(
        self, model: Model, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncIterator[ModelItem]:
        return model.stream(messages, tools)

    @contextlib.contextmanager
    def tool_call(self, tool: str) -> Iterator[ToolSpan]:
        yield _NoToolSpan()


NO_SPANS: Spans = _NoSpans()
"""Spans that are none: the model's stream as it is, no span around a tool."""
