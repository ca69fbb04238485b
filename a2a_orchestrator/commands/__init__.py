"""What each `a2a-orchestrator` command does (the parser lives in `cli.py`).

common     what the commands share (output, configuration files, stores)
sessions   run, resume, demo: a session here
serve      serve (a role server, or the orchestrator) and its options; token
queries    status, children, events: reading a store
stop       stop
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from ..clidefaults import DEFAULT_PORTS, DEFAULT_STORE, DEFAULT_TOKEN_ENV, EXIT_CODES
from ..runner import stop_signal_listener
from .queries import children, events, status
from .serve import serve, token
from .sessions import demo, resume, run
from .stop import stop

__all__ = [
    "ASYNC_COMMANDS",
    "DEFAULT_PORTS",
    "DEFAULT_STORE",
    "DEFAULT_TOKEN_ENV",
    "EXIT_CODES",
]


def _stoppable(command: Callable[[argparse.Namespace], Awaitable[int]]) -> Any:
    """`command` runs sessions: while it runs, STOP_SIGNAL wakes their runners
    to read a stop request (`a2a-orchestrator stop` without a server)."""

    async def stoppable(args: argparse.Namespace) -> int:
        async with stop_signal_listener():
            return await command(args)

    return stoppable


ASYNC_COMMANDS = {
    "demo": demo,
    "run": _stoppable(run),
    "serve": _stoppable(serve),
    "status": status,
    "children": children,
    "events": events,
    "stop": stop,
    "resume": _stoppable(resume),
    "token": token,
}
