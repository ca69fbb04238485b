"""Calling a tool as its runtime does, bounded in time."""

from __future__ import annotations

from typing import Any

import anyio

from a2a_orchestrator.tools import Tool


async def call(tool: Tool, **args: Any) -> str:
    with anyio.fail_after(10):
        return await tool.run(args)
