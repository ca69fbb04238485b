"""The CLI's defaults: ports, the store's path, the token variable, exit codes.

Apart from `commands/` so the parser (`parser.py`) can show them in `--help`
without importing what the commands run.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DEFAULT_PORTS",
    "DEFAULT_STORE",
    "DEFAULT_TOKEN_ENV",
    "EXIT_CODES",
    "NO_SIGNAL_EXIT",
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
here: tests/cli/test_cli.py checks); 2 means bad usage or configuration. Keyed by
plain strings so this module imports nothing of the package."""
NO_SIGNAL_EXIT = 4
"""`run --parent`'s exit code for `outcome.NO_SIGNAL` (none of `EXIT_CODES`, nor 2)."""
