"""Hooks around children: `spawn.before` (may deny), `spawn.after`, `complete`.

Registered from Python (`Hooks.on(...)`) or from configuration: a TOML file
of commands (`[[hook]] on = "spawn.before"  command = "..."`), each run with
the hook's payload as JSON on standard input. A `spawn.before` command that
exits non-zero denies the spawn, its output (stderr, else stdout) being the
reason; other hooks' exit codes are logged, not acted on.
"""

from __future__ import annotations

import inspect
import json
import logging
import shlex
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

import anyio

from ..configfile import OperatorFile, Text, check
from ..errors import ConfigError
from ..runtime.lookup import toml_tables

__all__ = [
    "HOOK_POINTS",
    "CompleteInfo",
    "Deny",
    "HookPoint",
    "Hooks",
    "SpawnInfo",
    "load_hook_file",
]

logger = logging.getLogger(__name__)

HookPoint: TypeAlias = Literal["spawn.before", "spawn.after", "complete"]
HOOK_POINTS: tuple[HookPoint, ...] = ("spawn.before", "spawn.after", "complete")
_COMMAND_TIMEOUT = 30.0


@dataclass(frozen=True, kw_only=True)
class SpawnInfo:
    """What is about to be (or was) spawned."""

    session_id: str
    parent_id: str
    role: str
    prompt: str
    child_id: str = ""
    """Empty before the spawn."""
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class CompleteInfo:
    """A child whose outcome was delivered to its parent."""

    session_id: str
    parent_id: str
    child_id: str
    role: str
    status: str
    """`completed` or `failed`."""
    reason: str
    result: str
    """The full result (not cut to the budget)."""


@dataclass(frozen=True)
class Deny:
    """Returned by a `spawn.before` hook to refuse the spawn."""

    reason: str


Hook: TypeAlias = Callable[[Any], "Deny | Awaitable[Deny | None] | None"]


class Hooks:
    """The hooks of one control plane."""

    def __init__(self) -> None:
        self._hooks: dict[HookPoint, list[Hook]] = {point: [] for point in HOOK_POINTS}

    def on(self, point: HookPoint, hook: Hook | None = None) -> Any:
        """Register `hook` at `point`; usable as a decorator."""
        if point not in self._hooks:
            raise ConfigError(f"unknown hook point {point!r}; known: {', '.join(HOOK_POINTS)}")

        def register(fn: Hook) -> Hook:
            self._hooks[point].append(fn)
            return fn

        return register(hook) if hook is not None else register

    async def before_spawn(self, info: SpawnInfo) -> Deny | None:
        """The first denial, if any hook denies."""
        for hook in self._hooks["spawn.before"]:
            verdict = hook(info)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if isinstance(verdict, Deny):
                return verdict
        return None

    async def notify(self, point: HookPoint, info: SpawnInfo | CompleteInfo) -> None:
        """Run observer hooks; their failures are logged, never raised."""
        for hook in self._hooks[point]:
            try:
                result = hook(info)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("%s hook failed", point)


def _command_hook(command: str, point: HookPoint, cwd: Path) -> Hook:
    argv = shlex.split(command)

    async def run(info: SpawnInfo | CompleteInfo) -> Deny | None:
        payload = json.dumps({"hook": point, **asdict(info)}).encode()
        # stdin from a file, not a pipe: a hook that exits without reading
        # its payload must not break the spawn with a broken pipe.
        with tempfile.TemporaryFile() as stdin:
            stdin.write(payload)
            stdin.seek(0)
            try:
                with anyio.move_on_after(_COMMAND_TIMEOUT) as scope:
                    result = await anyio.run_process(argv, stdin=stdin, check=False, cwd=cwd)
            except OSError as exc:
                if point == "spawn.before":
                    return Deny(f"hook {command!r} could not run: {exc}")
                logger.warning("%s hook %r could not run: %s", point, command, exc)
                return None
        if scope.cancelled_caught:
            if point == "spawn.before":
                return Deny(f"hook {command!r} timed out")
            logger.warning("%s hook %r timed out", point, command)
            return None
        if result.returncode != 0:
            output = (result.stderr or result.stdout).decode(errors="replace").strip()
            if point == "spawn.before":
                return Deny(output or f"hook {command!r} exited {result.returncode}")
            logger.warning("%s hook %r exited %s: %s", point, command, result.returncode, output)
        return None

    return run


def load_hook_file(path: str | Path, hooks: Hooks | None = None) -> Hooks:
    """Add the command hooks a TOML file declares; errors name the file and entry."""
    path = Path(path)
    hooks = hooks or Hooks()
    for where, entry in toml_tables(path, "hook", "hook"):
        hook = check(_HookEntry, entry, where)
        hooks.on(hook.on, _command_hook(hook.command, hook.on, path.parent))
    return hooks


class _HookEntry(OperatorFile):
    """One `[[hook]]` table of a hook file."""

    on: HookPoint
    command: Text
