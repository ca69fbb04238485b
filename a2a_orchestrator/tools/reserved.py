"""Names in a work directory that belong to the server, not to the agents working there.

Both confinements read them from here: the sandbox (`sandbox.py`) hides
`STATE_DIR` from commands and mounts `READ_ONLY_DIRS` read-only; the file
tools (`workspace.py`) treat `STATE_DIR` as outside the work directory and
refuse to write into, or create, `READ_ONLY_DIRS`. Each is a name directly
under the work directory's root.
"""

from __future__ import annotations

__all__ = ["READ_ONLY_DIRS", "STATE_DIR"]

STATE_DIR = ".a2a"
"""The server's private directory: task stores, journals, hooks, reactions, roles."""
READ_ONLY_DIRS = ("roles", "agents")
"""Role and agent files an orchestrator started here reads: agents may not change them."""
