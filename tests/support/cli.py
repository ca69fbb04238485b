"""The `a2a-orchestrator` command line run as a real subprocess."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
}


def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`a2a-orchestrator ARGS` run to its end, offline (no model endpoint
    from the environment) unless `env` names one."""
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **OFFLINE, **(env or {})},
    )
