"""A message's metadata as a server reads it, parsed once.

The request handler parses an incoming message's metadata (`TurnRequest.of`),
refusing bad input as invalid params before a task exists, and leaves the
result in the call context's state; the executor that plays the turn reads
it from there (`turn_request`) instead of parsing the message again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.types import InvalidParamsError, Message

from ..errors import ControlError
from ..protocol.wire import (
    CONFIG_KEY,
    CONTROL_KEY,
    PAUSE_ON_KEY,
    metadata_of,
    pause_rules_from_wire,
)
from ..runtime.selectors import Selector

__all__ = ["REQUEST_KEY", "TurnRequest", "turn_request"]

REQUEST_KEY = "a2aOrchestrator.request"
"""Call-context state: the request's `TurnRequest`, as the handler parsed it."""


@dataclass(frozen=True, kw_only=True)
class TurnRequest:
    """What a message's metadata asks of this server."""

    metadata: Mapping[str, Any] = field(default_factory=dict)
    """The metadata as plain data."""
    action: object = None
    """A control action (`CONTROL_KEY`, as sent: checked by the handler),
    None for an ordinary message."""
    rules: Mapping[str, Selector] = field(default_factory=dict)
    """The pause rules it gives (`PAUSE_ON_KEY`): the turn's, or a `pause_on`'s."""

    @property
    def has_config(self) -> bool:
        """Whether it carries a child configuration (`CONFIG_KEY`)."""
        return CONFIG_KEY in self.metadata

    @property
    def config(self) -> object:
        return self.metadata.get(CONFIG_KEY)

    @classmethod
    def of(cls, message: Message) -> TurnRequest:
        """Parse `message`'s metadata; invalid params for numbers protobuf's
        Struct cannot hold (JSON allows NaN and Infinity) and for malformed
        pause rules, on any message."""
        if not message.HasField("metadata"):
            return _EMPTY
        try:
            metadata = metadata_of(message)
        except ValueError as exc:
            raise InvalidParamsError(
                message=f"message metadata: numbers must be finite ({exc})"
            ) from exc
        try:
            rules = pause_rules_from_wire(metadata.get(PAUSE_ON_KEY))
        except ControlError as exc:
            raise InvalidParamsError(message=str(exc)) from exc
        return cls(metadata=metadata, action=metadata.get(CONTROL_KEY), rules=rules)


_EMPTY = TurnRequest()


def turn_request(call_context: ServerCallContext | None) -> TurnRequest:
    """The request the handler parsed for this call (empty when none was:
    a turn a replica adopts has no message)."""
    if call_context is None:
        return _EMPTY
    request = call_context.state.get(REQUEST_KEY)
    return request if isinstance(request, TurnRequest) else _EMPTY
