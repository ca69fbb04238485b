"""Record kinds: the stored rows beside child events, and the one reader that
turns a conversation's stored rows back into its transcript.

A session's store holds, in order, child events (`events.py`, each stored
under its own `kind`) and records: what was given to a conversation (its
inputs, steering, its children's results, injections) and what was done to
a child (control actions). Records are written under a `RecordKind`, whose
values are the strings stores have always held, so older stores read the
same. `transcript_entries` is how a parent (`parent.py`) and a reopened
child (`session.py`) alike read their transcript back.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Protocol

from .events import CHILD_EVENT_KINDS, ChildEvent, event_from_dict

__all__ = ["RecordKind", "StoredRow", "transcript_entries"]


class StoredRow(Protocol):
    """What the reader needs of a stored row: a store's `StoredEvent`, named
    here by shape (the store knows nothing of record kinds, nor the runtime
    of the store)."""

    @property
    def kind(self) -> str: ...

    @property
    def payload(self) -> dict[str, Any]: ...


class RecordKind(enum.StrEnum):
    """The kind of a stored row that is not a child event."""

    INPUT = "input"
    """Input that opened a turn: a prompt or a follow-up."""
    STEER = "steer"
    """Input the running turn took at a step boundary."""
    SUBAGENT_RESULT = "subagent_result"
    """A child's result, delivered to its parent's conversation."""
    INJECT = "inject"
    """Text a subscription or a reaction put into a parent's conversation
    (`as_turn`: it opened a parent turn, whose input row records it)."""
    INJECT_FAILED = "inject_failed"
    """An injection whose template could not be rendered (nothing was put in)."""
    CONTROL = "control"
    """A control action on a child: pause, resume, interrupt, terminate, reinstate."""
    SPAWN_REFUSED = "spawn_refused"
    """A spawn a hook, the gate, the policy or the offered models refused:
    the role asked for and the reason (stored under the parent that asked)."""


_CONVERSATION_INPUTS = frozenset(
    {RecordKind.INPUT, RecordKind.STEER, RecordKind.SUBAGENT_RESULT, RecordKind.INJECT}
)
"""Records whose text the conversation read (the rest are records only)."""


def transcript_entries(rows: Iterable[StoredRow]) -> list[str | ChildEvent]:
    """A conversation's entries for `transcript.rebuild_transcript`, in order:
    the text of each input it read, and its child events. Other records
    (control actions, failed injections) are left out, and so is an
    injection that opened a turn (that turn's input row holds its text)."""
    entries: list[str | ChildEvent] = []
    for row in rows:
        if row.kind in _CONVERSATION_INPUTS:
            if row.kind == RecordKind.INJECT and row.payload.get("as_turn"):
                continue
            entries.append(str(row.payload.get("text", "")))
        elif row.kind in CHILD_EVENT_KINDS:
            entries.append(event_from_dict(row.payload))
    return entries
