"""Reactions: declarative supervision rules, applied without a parent agent.

A TOML file of rules; each selects child events like a subscription does and
then either injects a rendered message into the parent's context, or signals
the child (pause, resume, interrupt, terminate):

    [[reaction]]
    event = { kind = "tool_result", success = false }
    role = "coder"                       # optional: only children of this role
    inject = "{{ event.role }} failed: {{ event.content }}"

    [[reaction]]
    event = { kind = "tool_result", contains = "rm -rf" }
    signal = "terminate"
    once = true

Injections go to the parent's transcript in the store and, when the parent
is an agent of this process, to its inbox. A template that fails on an event
(whatever the error) is recorded as an `inject_failed` event naming the rule,
and the rules after it still run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import StrictStr

from ..configfile import Flag, OperatorFile, check
from ..delegation.base import ChildHandle
from ..errors import ConfigError, ControlError
from ..runtime.events import ChildEvent
from ..runtime.lookup import toml_tables
from ..runtime.records import RecordKind
from ..runtime.selectors import Selector, event_context, render_inject

if TYPE_CHECKING:
    # Only in annotations (see control.py).
    from .plane import ControlPlane

__all__ = ["REACTION_SIGNALS", "Reaction", "Reactions", "load_reactions"]

_Signal = Literal["pause", "resume", "interrupt", "terminate"]
REACTION_SIGNALS: tuple[str, ...] = get_args(_Signal)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Reaction:
    event: Selector
    role: str | None = None
    child: str | None = None
    inject: str | None = None
    signal: str | None = None
    once: bool = False
    name: str = ""
    """Where the rule comes from (`<file>: reaction <n>`), for the records that name it."""


def load_reactions(path: str | Path) -> list[Reaction]:
    """The rules of a reactions file; errors name the file, the rule and the field."""
    reactions = []
    for where, entry in toml_tables(path, "reaction", "reactions"):
        rule = check(_ReactionEntry, entry, where)
        if (rule.inject is None) == (rule.signal is None):
            raise ConfigError(f"{where}: give exactly one of 'inject' and 'signal'")
        try:
            selector = Selector.from_dict(rule.event)
            if rule.inject is not None:
                render_inject(rule.inject, {})
        except ControlError as exc:
            raise ConfigError(f"{where}: {exc}") from exc
        reactions.append(
            Reaction(
                event=selector,
                role=rule.role,
                child=rule.child,
                inject=rule.inject,
                signal=rule.signal,
                once=rule.once,
                name=where,
            )
        )
    return reactions


class _ReactionEntry(OperatorFile):
    """One `[[reaction]]` table of a reactions file."""

    event: Any = None
    """Checked by `Selector.from_dict`, which the control API shares."""
    role: StrictStr | None = None
    child: StrictStr | None = None
    inject: StrictStr | None = None
    signal: _Signal | None = None
    once: Flag = False


class Reactions:
    """Applies rules to the children of one parent (`plane`)."""

    def __init__(self, plane: ControlPlane, rules: list[Reaction]) -> None:
        self.plane = plane
        self.rules = list(rules)
        self.fired: list[tuple[Reaction, str]] = []
        """Each firing: the rule and the child it fired for."""
        self._remove = plane.session.add_listener(self._on_event)

    def close(self) -> None:
        self._remove()

    async def _on_event(self, handle: ChildHandle, event: ChildEvent) -> None:
        if handle.parent_id != self.plane.parent_id:
            return
        for rule in list(self.rules):
            if rule.child is not None and rule.child != handle.child_id:
                continue
            if rule.role is not None and rule.role not in (handle.role, handle.agent):
                continue
            if not rule.event.matches(handle, event):
                continue
            if rule.once:
                self.rules.remove(rule)
            self.fired.append((rule, handle.child_id))
            await self._apply(rule, handle, event)

    async def _apply(self, rule: Reaction, handle: ChildHandle, event: ChildEvent) -> None:
        session = self.plane.session
        if rule.inject is not None:
            try:
                text = render_inject(rule.inject, event_context(handle, event))
            except ControlError as exc:
                # The rule's fault, not the child's: record it and go on.
                logger.warning("%s: %s", rule.name or "reaction", exc)
                await session.store.append_event(
                    session.id,
                    RecordKind.INJECT_FAILED,
                    {"reaction": rule.name, "error": str(exc), "from_child": handle.child_id},
                    child_id=self.plane.parent_id or None,
                )
                return
            await session.store.append_event(
                session.id,
                RecordKind.INJECT,
                {"text": text, "reaction": True, "from_child": handle.child_id},
                child_id=self.plane.parent_id or None,
            )
            if self.plane.inbox is not None:
                self.plane.inbox.steer(text)
            return
        actions: dict[str, Any] = {
            "pause": handle.pause,
            "resume": handle.resume,
            "interrupt": handle.interrupt,
            "terminate": handle.terminate,  # final, like the supervisor's
        }
        # A stop waits for the turn this very event belongs to to end; it runs
        # beside this watcher, which goes on with the events after it.
        if rule.signal in ("interrupt", "terminate"):
            action = actions[rule.signal]

            async def signal() -> None:
                await action()

            session.start_soon(signal, name=f"reaction {rule.signal}")
        else:
            await actions[str(rule.signal)]()
        await session.store.append_event(
            session.id,
            RecordKind.CONTROL,
            {"action": rule.signal, "reaction": True},
            child_id=handle.child_id,
        )
