"""The tools a role may be given, confined to one work directory.

A role names the tools it wants; `build_tools` turns those names into `Tool`
objects bound to the session's `Workspace`. A role gets only what it names.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

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
    reuse: bool = True,
) -> list[Tool]:
    """The tools called `names`, in that order, bound to `workspace`.

    `command_timeout` is `run_command`'s default and maximum timeout in
    seconds; `max_output` bounds the bytes `run_command` and `grep` return;
    `sandbox` is where `run_command` runs commands (default:
    `Sandbox.from_env()`), and `run_command` raises `ConfigError` when that
    sandbox cannot be had here.
    A name listed twice yields one tool (a model API rejects duplicate
    names). Raises `ConfigError` listing `TOOL_NAMES` for an unknown name.

    Tools hold no state of a call or a conversation, so the same ones serve
    every conversation on one `Workspace` object with the same settings: the
    last `_BUILT_MAX` sets built are kept (each spawn and each role-server
    conversation builds its tools, a few dozen microseconds). `reuse=False`
    for a workspace made for one conversation: its set is built anew and not
    kept (keeping it would keep the workspace's directory open).
    """
    # A bare string is one name, not an iterable of one-letter names.
    wanted = list(dict.fromkeys([names] if isinstance(names, str) else names))
    unknown = [name for name in wanted if name not in TOOL_NAMES]
    if unknown:
        raise ConfigError(
            f"Unknown tool {', '.join(map(repr, unknown))}. Known tools: {', '.join(TOOL_NAMES)}"
        )
    if "run_command" in wanted and sandbox is None:
        # Read here, so the settings it takes are part of the key below.
        sandbox = Sandbox.from_env()
    settings: dict[str, Any] = {
        "command_timeout": command_timeout,
        "max_output": max_output,
        "sandbox": sandbox,
    }
    # By the workspace's identity (a closed one's equal twin must not get
    # its tools), held by the entry so the id is not reused meanwhile.
    key = (tuple(wanted), id(workspace), command_timeout, max_output, sandbox)
    if not reuse:
        return [_made(name, workspace, **settings) for name in wanted]
    with _built_lock:
        built = _built.get(key)
        if built is not None and built[0] is workspace:
            _built.move_to_end(key)
            return list(built[1])
    tools = tuple(_made(name, workspace, **settings) for name in wanted)
    with _built_lock:
        _built[key] = (workspace, tools)
        _built.move_to_end(key)
        while len(_built) > _BUILT_MAX:
            _built.popitem(last=False)
    return list(tools)


_BUILT_MAX = 16
_built: OrderedDict[tuple[Any, ...], tuple[Workspace, tuple[Tool, ...]]] = OrderedDict()
_built_lock = threading.Lock()


def _made(
    name: str,
    workspace: Workspace,
    *,
    command_timeout: float,
    max_output: int,
    sandbox: Sandbox | None,
) -> Tool:
    if name == "read_file":
        return read_file_tool(workspace)
    if name == "list_files":
        return list_files_tool(workspace)
    if name == "grep":
        return grep_tool(workspace, max_bytes=max_output)
    if name == "write_file":
        return write_file_tool(workspace)
    if name == "edit_file":
        return edit_file_tool(workspace)
    return run_command_tool(
        workspace, timeout=command_timeout, max_output=max_output, sandbox=sandbox
    )
