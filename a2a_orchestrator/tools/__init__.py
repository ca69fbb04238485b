"""The tools a role may be given, confined to one work directory.

A role names the tools it wants; `build_tools` turns those names into `Tool`
objects bound to the session's `Workspace`. A role gets only what it names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import ConfigError
from .base import Tool
from .command import run_command_tool
from .files import (
    edit_file_tool,
    grep_tool,
    list_files_tool,
    read_file_tool,
    write_file_tool,
)
from .sandbox import Sandbox
from .workspace import Workspace

__all__ = ["TOOL_NAMES", "Sandbox", "Tool", "Workspace", "build_tools"]

TOOL_NAMES: tuple[str, ...] = (
    "read_file",
    "list_files",
    "grep",
    "write_file",
    "edit_file",
    "run_command",
)
"""Every tool name a role file may list, in a stable order."""


def build_tools(
    names: Iterable[str],
    workspace: Workspace,
    *,
    command_timeout: float = 60.0,
    max_output: int = 65536,
    sandbox: Sandbox | None = None,
) -> list[Tool]:
    """The tools called `names`, in that order, bound to `workspace`.

    `command_timeout` is `run_command`'s default and maximum timeout in
    seconds; `max_output` bounds the bytes `run_command` and `grep` return;
    `sandbox` is where `run_command` runs commands (default:
    `Sandbox.from_env()`), and `run_command` raises `ConfigError` when that
    sandbox cannot be had here.
    A name listed twice yields one tool (a model API rejects duplicate
    names). Raises `ConfigError` listing `TOOL_NAMES` for an unknown name.
    """
    factories: dict[str, Callable[[], Tool]] = {
        "read_file": lambda: read_file_tool(workspace),
        "list_files": lambda: list_files_tool(workspace),
        "grep": lambda: grep_tool(workspace, max_bytes=max_output),
        "write_file": lambda: write_file_tool(workspace),
        "edit_file": lambda: edit_file_tool(workspace),
        "run_command": lambda: run_command_tool(
            workspace, timeout=command_timeout, max_output=max_output, sandbox=sandbox
        ),
    }
    # A bare string is one name, not an iterable of one-letter names.
    wanted = list(dict.fromkeys([names] if isinstance(names, str) else names))
    unknown = [name for name in wanted if name not in factories]
    if unknown:
        raise ConfigError(
            f"Unknown tool {', '.join(map(repr, unknown))}. Known tools: {', '.join(TOOL_NAMES)}"
        )
    return [factories[name]() for name in wanted]
