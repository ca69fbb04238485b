"""Child events: the one typed stream a parent sees from any child.

Local and remote children produce the same events in the same order; over
A2A they travel as task status updates and a result artifact (see `wire.py`,
where that mapping is written once, and `decoding.py`, where it is read
back). Every event is a frozen value with a `kind` discriminator and
serialises to a plain dict for the store and JSONL.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeAlias

from ..models.base import Usage
from .budgets import Spend

__all__ = [
    "CHILD_EVENT_KINDS",
    "TERMINAL_KINDS",
    "AssistantMessage",
    "ChildEvent",
    "Done",
    "FailReason",
    "Failed",
    "InputRequired",
    "MessageDelta",
    "MessageRestarted",
    "Started",
    "ToolCalled",
    "ToolResult",
    "event_from_dict",
    "event_to_dict",
    "new_uuid",
]


def new_uuid() -> str:
    return uuidlib.uuid4().hex


def _uuid() -> Any:
    # Identity, not value: two events that say the same thing compare equal.
    # Over A2A the uuid is the status message's id, so the orchestrator and
    # the role server know an event by the same uuid, and a replayed event
    # (re-attach, restart) is recognised and dropped.
    return field(default_factory=new_uuid, compare=False)


FailReason: TypeAlias = Literal["error", "max_turns", "aborted", "timeout", "lost", "budget"]

# Spend fields are `compare=False`: not part of an event's value (two events
# that say the same thing are equal whatever they cost), though stored with
# it, so a crash loses no spend.


@dataclass(frozen=True, kw_only=True)
class Started:
    """The child began (or resumed) a turn of work."""

    kind: Literal["started"] = "started"
    uuid: str = _uuid()
    role: str = ""
    """The role the child runs as."""
    model: str = ""
    """The concrete model name, when known."""


@dataclass(frozen=True, kw_only=True)
class MessageDelta:
    """A piece of assistant text as the model streams it."""

    kind: Literal["message_delta"] = "message_delta"
    uuid: str = _uuid()
    text: str


@dataclass(frozen=True, kw_only=True)
class MessageRestarted:
    """The deltas streamed so far in this step are withdrawn: the model's
    stream was cut, and its retry begins the message again, often in other
    words. The `message` that ends the step holds only the retry's answer.
    A reader that does not know this kind skips it and still gets that
    whole message."""

    kind: Literal["message_restarted"] = "message_restarted"
    uuid: str = _uuid()
    reason: str = ""
    """Why the stream broke off (the endpoint's error)."""


@dataclass(frozen=True, kw_only=True)
class AssistantMessage:
    """A complete assistant message (the deltas before it, joined)."""

    kind: Literal["message"] = "message"
    uuid: str = _uuid()
    text: str
    spent: Spend | None = field(default=None, compare=False)
    """The model call's spend, on the first event of each step (in-process:
    stored with the event, so a turn a crash cut keeps what it spent)."""


@dataclass(frozen=True, kw_only=True)
class ToolCalled:
    """The child called a tool."""

    kind: Literal["tool_called"] = "tool_called"
    uuid: str = _uuid()
    call_id: str
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    spent: Spend | None = field(default=None, compare=False)
    """The model call's spend, on a step's first event (see `AssistantMessage`)."""


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """A tool call finished; `success` is False when the tool refused or failed."""

    kind: Literal["tool_result"] = "tool_result"
    uuid: str = _uuid()
    call_id: str
    tool: str
    output: str
    success: bool


@dataclass(frozen=True, kw_only=True)
class InputRequired:
    """The child stopped to ask its parent; a follow-up message continues it."""

    kind: Literal["input_required"] = "input_required"
    uuid: str = _uuid()
    question: str
    spent: Spend = field(default_factory=Spend, compare=False)
    """The turn's spend (the turn ends here, waiting for the answer)."""


@dataclass(frozen=True, kw_only=True)
class Done:
    """The child finished its turn with a final answer."""

    kind: Literal["done"] = "done"
    uuid: str = _uuid()
    text: str
    usage: Usage = field(default_factory=Usage)
    spent: Spend = field(default_factory=Spend, compare=False)
    """The turn's spend: tokens, model calls, wall time, cost."""


@dataclass(frozen=True, kw_only=True)
class Failed:
    """The child ended without an answer; `reason` says why."""

    kind: Literal["failed"] = "failed"
    uuid: str = _uuid()
    reason: FailReason
    message: str
    usage: Usage = field(default_factory=Usage)
    spent: Spend = field(default_factory=Spend, compare=False)
    """The turn's spend; with reason `budget`, the message says the child's
    whole spend against its budget."""


ChildEvent: TypeAlias = (
    Started
    | MessageDelta
    | MessageRestarted
    | AssistantMessage
    | ToolCalled
    | ToolResult
    | InputRequired
    | Done
    | Failed
)

CHILD_EVENT_KINDS = frozenset(
    {"started", "message_delta", "message_restarted", "message", "tool_called", "tool_result"}
    | {"input_required", "done", "failed"}
)
"""Every kind a child event can have (stored rows of other kinds are records)."""

TERMINAL_KINDS = frozenset({"done", "failed", "input_required"})
"""Kinds that end a turn: after one of them the child waits or is finished."""

_BY_KIND: dict[str, type[Any]] = {
    cls.kind: cls
    for cls in (
        Started,
        MessageDelta,
        MessageRestarted,
        AssistantMessage,
        ToolCalled,
        ToolResult,
        InputRequired,
        Done,
        Failed,
    )
}


def event_to_dict(event: ChildEvent) -> dict[str, Any]:
    """A JSON-ready dict; `event_from_dict` turns it back.

    A new dict of the event's fields, its usage and spend as dicts; other
    values (a tool call's `arguments`) are the event's own, not copies:
    events are frozen and nothing changes them. Every stored and relayed
    event passes here, and `asdict`'s deep copy was most of its cost."""
    names = _FIELD_NAMES.get(type(event))
    if names is None:
        names = _FIELD_NAMES[type(event)] = tuple(f.name for f in fields(event))
    data = {name: getattr(event, name) for name in names}
    for name, value in data.items():
        if isinstance(value, Usage | Spend):
            data[name] = asdict(value)
    return data


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def event_from_dict(data: dict[str, Any]) -> ChildEvent:
    """Rebuild an event from `event_to_dict` output (or a stored payload)."""
    kind = data.get("kind")
    cls = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown child event kind: {kind!r}")
    fields = {k: v for k, v in data.items() if k != "kind"}
    if "usage" in fields and isinstance(fields["usage"], dict):
        fields["usage"] = Usage(
            input_tokens=int(fields["usage"].get("input_tokens", 0)),
            output_tokens=int(fields["usage"].get("output_tokens", 0)),
        )
    if isinstance(fields.get("spent"), dict):
        fields["spent"] = Spend.from_dict(fields["spent"])
    return cls(**fields)
