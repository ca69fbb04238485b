"""The A2A protocol versions a server can offer on its card and routes, and
where a server with gRPC lists it, and the version one request was made in.

Apart from `cards.py` so the CLI's parser can offer them as choices without
importing what serves a card.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from a2a.server.context import ServerCallContext

__all__ = [
    "GRPC_CARDS",
    "GRPC_CARD_PATH",
    "PROTOCOLS",
    "PROTOCOL_STATE",
    "call_protocol",
    "same_major",
]

PROTOCOLS = ("both", "1.0")
"""`both`: endpoints for A2A 1.0 and 0.3 (v0.3 peers can read the card);
`1.0`: a card with A2A 1.0 fields only."""

GRPC_CARDS = ("main", "separate")
"""Where a server that serves gRPC lists it: `main`, in its card at the
well-known path (first: preferred); `separate`, only in a second card at
`GRPC_CARD_PATH`, so the well-known card lists HTTP endpoints only (stock
ADK clients refuse a card naming any endpoint off the card's own origin)."""

GRPC_CARD_PATH = "/.well-known/agent-card-grpc.json"
"""Where `separate` serves the card that lists gRPC (the well-known card
plus the gRPC interfaces, signed like it)."""

PROTOCOL_STATE = "a2a_orchestrator.protocol"
"""Key of a call context's `state` naming the protocol version of the call
("1.0", "0.3") where no `A2A-Version` header says it (gRPC: its service)."""


def same_major(asked: str, expected: str) -> bool:
    """Whether a caller asking for version `asked` is served by `expected`:
    the same major version, as a2a-sdk's `validate_version` judges a header."""
    major = asked.strip().split(".", 1)[0]
    return major.isdigit() and int(major) == int(expected.split(".", 1)[0])


def call_protocol(context: ServerCallContext) -> str:
    """The protocol version ("1.0" or "0.3") a request was made in.

    gRPC says it in the state (`PROTOCOL_STATE`). Over HTTP, the `A2A-Version`
    header: a2a-sdk serves the 1.0 routes and methods only to a 1.x header
    and the 0.3 ones only without one or with a 0.x one, so the header of a
    request that got this far tells which it used. A context without
    headers was not made by a request (the server's own calls): 1.0."""
    known = context.state.get(PROTOCOL_STATE)
    if isinstance(known, str):
        return known
    headers = context.state.get("headers")
    if not isinstance(headers, dict):
        return "1.0"
    asked = next((str(v) for k, v in headers.items() if k.lower() == "a2a-version"), "")
    return "1.0" if asked and not same_major(asked, "0.3") else "0.3"
