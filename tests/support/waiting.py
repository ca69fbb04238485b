"""Bounded waits: poll a condition until it holds, or fail at the deadline."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 15) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():
            await anyio.sleep(0.05)


async def wait_for_text(path: Path, text: str, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not (path.exists() and text in path.read_text()):
            await anyio.sleep(0.05)
