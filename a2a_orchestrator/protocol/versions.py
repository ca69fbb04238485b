"""The A2A protocol versions a server can offer on its card and routes.

Apart from `cards.py` so the CLI's parser can offer them as choices without
importing what serves a card.
"""

from __future__ import annotations

__all__ = ["PROTOCOLS"]

PROTOCOLS = ("both", "1.0")
"""`both`: endpoints for A2A 1.0 and 0.3 (v0.3 peers can read the card);
`1.0`: a card with A2A 1.0 fields only."""
