"""What each `a2a-orchestrator` command does (the parser lives in `parser.py`,
but for `send`, whose parser is beside its handler).

common     what the commands share (output, configuration files, stores)
sessions   run, resume, demo: a session here
serve      serve (a role server, or the orchestrator) and its options; token
queries    status, children, events: reading a store
stop       stop
send       send (its parser is beside it)
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any

from ...delegation.runner import stop_signal_listener
from ..defaults import DEFAULT_PORTS, DEFAULT_STORE, DEFAULT_TOKEN_ENV, EXIT_CODES

# The modules, not their functions: `serve` and `stop` name both, and the
# package's attributes stay the modules (`commands.serve.access_of`).
from . import queries, send, serve, sessions, stop

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


def _configured(command: Callable[[argparse.Namespace], Awaitable[int]]) -> Any:
    """`command` runs models: the role files, and the model scripts they and
    the model settings name, are read before any of them runs, so nothing a
    model's command writes later is taken as a role or replayed as a script."""

    async def configured(args: argparse.Namespace) -> int:
        from ...models import ModelSettings
        from ...models.config import read_scripts
        from ...runtime.roles import read_roles

        roles = read_roles()
        read_scripts([role.model for role in roles], ModelSettings.from_env())
        return await command(args)

    return configured


ASYNC_COMMANDS = {
    "demo": _configured(sessions.demo),
    "run": _stoppable(_configured(sessions.run)),
    "serve": _stoppable(_configured(serve.serve)),
    "status": queries.status,
    "children": queries.children,
    "events": queries.events,
    "stop": stop.stop,
    "resume": _stoppable(_configured(sessions.resume)),
    "token": serve.token,
    "send": send.send,
}
