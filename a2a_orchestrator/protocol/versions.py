"""The A2A protocol versions a server can offer on its card and routes, and
where a server with gRPC lists it.

Apart from `cards.py` so the CLI's parser can offer them as choices without
importing what serves a card.
"""

from __future__ import annotations

__all__ = ["GRPC_CARDS", "GRPC_CARD_PATH", "PROTOCOLS"]

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
