"""The `a2a-orchestrator` command line: its parser, its commands, its defaults.

`main` (in `entry.py`) is the console script's entry point, named
`a2a_orchestrator.cli:main` as it always was (pyproject's `[project.scripts]`).
"""

from .entry import main

__all__ = ["main"]
