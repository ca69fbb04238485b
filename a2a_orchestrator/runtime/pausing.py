"""Pause rules: where a caller would have its child held.

A pause rule is an event selector (`selectors.Selector`) under an id; the
moment a turn emits an event a rule selects, the child is held before its
next step (`Conversation.pause_on`), until whoever set the rule confirms or
releases the hold, or `HOLD_LIMIT` passes. Light on purpose: the
conversation imports it, and so does every command's start-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from .events import TERMINAL_KINDS, ChildEvent

__all__ = ["HOLD_LIMIT", "Rule", "selecting_rule"]

HOLD_LIMIT = 30.0
"""Seconds a child held by a pause rule waits for its caller to confirm
(pause) or release (resume) before it goes on by itself: a caller that
crashed, or whose rule was dropped meanwhile, cannot leave it held for good."""


class Rule(Protocol):
    """What a pause rule is asked (a `selectors.Selector`)."""

    def selects(self, event: ChildEvent) -> bool: ...


def selecting_rule(rules: Mapping[str, Rule], event: ChildEvent) -> str | None:
    """The id of the first pause rule that selects `event`, where a child
    would be held; None for a turn's last event (no next step to hold)."""
    if event.kind in TERMINAL_KINDS:
        return None
    return next((rule_id for rule_id, rule in rules.items() if rule.selects(event)), None)
