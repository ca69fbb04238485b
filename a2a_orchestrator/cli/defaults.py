"""The CLI's defaults: ports, the store's path, the token variable, exit codes.

Apart from `commands/` so the parser (`cli.py`) can show them in `--help`
without importing what the commands run.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_STORE",
    "DEFAULT_TOKEN_ENV",
    "EXIT_CODES",
    "NO_SIGNAL",
    "NO_SIGNAL_EXIT",
    "PROTOCOLS",
]

DEFAULT_PORTS = {
    "orchestrator": 9100,
    "architect": 9101,
    "coder": 9102,
    "reviewer": 9103,
    "observer": 9104,
}
"""Where `serve` listens by default; other roles default to 9110."""
DEFAULT_TOKEN_ENV = "A2A_AUTH_TOKEN"
DEFAULT_STORE = Path(".a2a") / "orchestrator.db"
EXIT_CODES: dict[str, int] = {"TASK_DONE": 0, "TASK_FAILED": 1, "TASK_SKIPPED": 3}
"""`run` and `demo` exit with the task's signal (`pipeline.Signal`, each one
here: tests/test_cli.py checks); 2 means bad usage or configuration. Keyed by
plain strings so this module imports nothing of the package."""
NO_SIGNAL = "no signal"
"""What `status`, `run --parent` and the web view say of a parent agent's
answer that ends with no `TASK_*` line: it did not say how the task went."""
NO_SIGNAL_EXIT = 4
"""`run --parent`'s exit code for `NO_SIGNAL` (none of `EXIT_CODES`, nor 2)."""
PROTOCOLS = ("both", "1.0")
"""`both`: endpoints for A2A 1.0 and 0.3 (v0.3 peers can read the card);
`1.0`: a card with A2A 1.0 fields only."""
