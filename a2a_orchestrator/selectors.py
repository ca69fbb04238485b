"""Selecting child events, and rendering what to say about them.

A selector `{kind?, tool?, success?, contains?}` picks events of a child;
an inject template (Jinja, in a bounded sandbox: `templates.py`) turns a
picked event into text. Shared by supervisor subscriptions and by reactions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .delegation import ChildHandle
from .errors import ControlError
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

__all__ = ["EVENT_KINDS", "Selector", "event_context", "render_inject"]

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


def event_context(handle: ChildHandle, event: ChildEvent) -> dict[str, Any]:
    """What a template sees as `event`: the event's fields, its child, and `content`."""
    context = event_to_dict(event)
    context.pop("uuid", None)
    kind = next((k for k, v in EVENT_KINDS.items() if v == event.kind and k != "error"), event.kind)
    context.update(kind=kind, child=handle.child_id, pid=handle.child_id, role=handle.role)
    match event:
        case ToolResult(output=output):
            context["content"] = output
        case ToolCalled(arguments=arguments):
            context["content"] = json.dumps(arguments, ensure_ascii=False)
        case AssistantMessage(text=text) | Done(text=text):
            context["content"] = text
        case InputRequired(question=question):
            context["content"] = question
        case Failed(message=message):
            context["content"] = message
        case _:
            context["content"] = ""
    return context


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
        if kind is not None and kind not in EVENT_KINDS:
            raise ControlError(f"event selector: kind must be one of {', '.join(EVENT_KINDS)}")
        success = data.get("success")
        if success is not None and not isinstance(success, bool):
            raise ControlError("event selector: success must be true or false")
        return cls(kind=kind, tool=data.get("tool"), success=success, contains=data.get("contains"))

    def matches(self, handle: ChildHandle, event: ChildEvent) -> bool:
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
            return self.contains in str(event_context(handle, event)["content"])
        return True
