"""Selecting child events, and rendering what to say about them.

A selector `{kind?, tool?, success?, contains?}` picks events of a child;
an inject template (Jinja, in a bounded sandbox: `templates.py`) turns a
picked event into text. Shared by supervisor subscriptions and by reactions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import ControlError
from .events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    ToolCalled,
    ToolResult,
    event_to_dict,
)
from .templates import render_inject

__all__ = ["EVENT_KINDS", "Child", "Selector", "event_content", "event_context", "render_inject"]


class Child(Protocol):
    """What a selector reads of a child: a delegation `ChildHandle`, named
    here by shape so the runtime does not import the delegation layer."""

    @property
    def child_id(self) -> str: ...

    @property
    def role(self) -> str: ...


EVENT_KINDS = {
    "tool_call": "tool_called",
    "tool_result": "tool_result",
    "message": "message",
    "input_required": "input_required",
    "done": "done",
    "failed": "failed",
    "error": "failed",
}
"""Selector kinds and the child event kinds they select (`error`: a failure
whose reason is an error, not a budget, an abort or a timeout)."""


def event_context(handle: Child, event: ChildEvent) -> dict[str, Any]:
    """What a template sees as `event`: the event's fields, its child, and `content`."""
    context = event_to_dict(event)
    context.pop("uuid", None)
    kind = next((k for k, v in EVENT_KINDS.items() if v == event.kind and k != "error"), event.kind)
    context.update(kind=kind, child=handle.child_id, pid=handle.child_id, role=handle.role)
    context["content"] = event_content(event)
    return context


def event_content(event: ChildEvent) -> str:
    """An event's main text: what `contains` looks in, and `event.content`."""
    match event:
        case ToolResult(output=output):
            return output
        case ToolCalled(arguments=arguments):
            return json.dumps(arguments, ensure_ascii=False)
        case AssistantMessage(text=text) | Done(text=text):
            return text
        case InputRequired(question=question):
            return question
        case Failed(message=message):
            return message
    return ""


@dataclass(frozen=True, kw_only=True)
class Selector:
    """Which events a subscription takes; every field given must match."""

    kind: str | None = None
    tool: str | None = None
    success: bool | None = None
    contains: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Selector:
        data = dict(data or {})
        unknown = set(data) - {"kind", "tool", "success", "contains"}
        if unknown:
            raise ControlError(f"event selector: unknown field(s) {sorted(unknown)}")
        kind = data.get("kind")
        if kind is not None and (not isinstance(kind, str) or kind not in EVENT_KINDS):
            raise ControlError(f"event selector: kind must be one of {', '.join(EVENT_KINDS)}")
        success = data.get("success")
        if success is not None and not isinstance(success, bool):
            raise ControlError("event selector: success must be true or false")
        for name in ("tool", "contains"):
            if data.get(name) is not None and not isinstance(data[name], str):
                # Checked here, not at the first event: `contains` is searched in text.
                raise ControlError(f"event selector: {name} must be a string")
        return cls(kind=kind, tool=data.get("tool"), success=success, contains=data.get("contains"))

    def matches(self, handle: Child, event: ChildEvent) -> bool:
        """Whether `handle`'s `event` is selected (see `selects`)."""
        return self.selects(event)

    def selects(self, event: ChildEvent) -> bool:
        """Whether `event` is selected; needs no handle, so a role server can
        evaluate a caller's pause rule on its own events."""
        if self.kind is not None:
            if event.kind != EVENT_KINDS[self.kind]:
                return False
            if self.kind == "error" and not (isinstance(event, Failed) and event.reason == "error"):
                return False
        if self.tool is not None and getattr(event, "tool", None) != self.tool:
            return False
        if self.success is not None and getattr(event, "success", None) is not self.success:
            return False
        if self.contains is not None:
            return self.contains in event_content(event)
        return True
