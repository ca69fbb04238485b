"""The `run_command` tool: one shell command in the workspace, bounded in time and output.

The command runs in the operator's `Sandbox` (bubblewrap: see
`tools.sandbox`) with an environment of its own, never the server's.

Concurrency contract. The command runs as `/bin/sh -c` in a new session, so
it and everything it starts (the sandbox too) share one process group.
However `run` ends —
the command finished, its timeout expired, or the awaiting task was
cancelled — before it returns or raises, the whole group has been sent
SIGTERM, then SIGKILL after a short grace, and the shell has been awaited.
Nothing the command started is left running. Cancellation is re-raised after
that cleanup, never swallowed.

A command whose background job keeps stdout open is waited for until its
timeout, like any shell pipeline reading to end of file.

A process that left the group on purpose (`setsid`) goes with the PID
namespace the command runs in: in a sandbox, SIGTERM ends bubblewrap, whose
namespace then takes every process in it down with SIGKILL; opted out, the
shell runs under the first process of an `unshare` namespace, which ends
with the shell and takes the rest down. Only where the opt-out has no
namespace (`Sandbox.describe` says so) does such a process survive.

At-most-once seam: when the runtime set `base.current_call`, the call's
marker is in the command's environment and the process group is reported
through `CallScope.record_process` right after the spawn, before anything can
cancel the call.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from ..errors import ConfigError, ToolError
from .base import Tool, current_call
from .procs import start_ticks
from .sandbox import Sandbox
from .workspace import Workspace

__all__ = ["run_command_tool"]

DEFAULT_TIMEOUT = 60.0
"""Seconds a command may run when the configuration does not say."""
DEFAULT_MAX_OUTPUT = 64 * 1024
"""Bytes of combined stdout and stderr kept (head and tail)."""
DEFAULT_GRACE = 2.0
"""Seconds between SIGTERM and SIGKILL for the process group."""


class _HeadTail:
    """Keeps the first and last bytes of a stream, counting what falls between."""

    def __init__(self, limit: int) -> None:
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self._total = 0

    def add(self, chunk: bytes) -> None:
        self._total += len(chunk)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        excess = len(self._tail) - self._tail_limit
        if excess > 0:
            del self._tail[:excess]

    def text(self) -> str:
        omitted = self._total - len(self._head) - len(self._tail)
        if omitted <= 0:
            return (self._head + self._tail).decode("utf-8", "replace")
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        return f"{head}\n…[{omitted} bytes of output omitted]…\n{tail}"


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # The id now names a group we do not own: ours is gone.
        return False
    return True


def _group_has_live_member(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running (not a zombie).

    `killpg(pgid, 0)` also succeeds for zombies, and orphaned zombies linger
    for good when PID 1 does not reap (a server running as PID 1 in a
    container). On Linux /proc tells them apart; elsewhere assume alive.
    """
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue  # exited while we looked
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = raw[raw.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def _end_group(process: anyio.abc.Process, grace: float) -> None:
    """SIGTERM the process group, SIGKILL it after `grace`, and reap the shell.

    Call it shielded: it must finish even when the caller is being cancelled.
    """
    pgid = process.pid  # start_new_session makes the shell the group leader
    if _signal_group(pgid, signal.SIGTERM):
        with anyio.move_on_after(grace):
            await process.wait()
            # Grandchildren are not ours to wait on; nothing signals their exit,
            # so poll.
            while await anyio.to_thread.run_sync(_group_has_live_member, pgid):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        _signal_group(pgid, signal.SIGKILL)
    await process.wait()
    await process.aclose()


def _timeout_arg(args: dict[str, Any], maximum: float) -> float:
    value = args.get("timeout")
    if value is None:
        return maximum
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ToolError(f"Argument 'timeout' must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"Argument 'timeout' must be a number, got {value!r}")
    if not value > 0:
        raise ToolError(f"Argument 'timeout' must be positive, got {value!r}")
    return min(float(value), maximum)


def _with_code(output: str, code: int) -> str:
    reason = f"exit code {code}"
    if code < 0:
        reason += f" (killed by signal {-code})"
    return f"{output.rstrip(chr(10))}\n[{reason}]"


def _confinement(sandbox: Sandbox) -> str:
    """What the model should know about where its command runs."""
    if not sandbox.enabled:
        return ""
    network = "with" if sandbox.network else "without"
    return (
        f" It runs in a sandbox {network} network access: only the work directory "
        "is writable (and a private, empty /tmp, which is also HOME)."
    )


def run_command_tool(
    workspace: Workspace,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_output: int = DEFAULT_MAX_OUTPUT,
    grace: float = DEFAULT_GRACE,
    sandbox: Sandbox | None = None,
) -> Tool:
    """`run_command(command, timeout=None)`: run `command` with `/bin/sh -c` in the workspace.

    `sandbox` is the operator's policy (default: `Sandbox.from_env()`).
    Raises `ConfigError` when it asks for a sandbox this machine cannot
    provide, so a server refuses to start rather than run commands unconfined.

    `timeout` (seconds) defaults to, and is capped at, the configured
    `timeout`. stdout and stderr are combined; at most `max_output` bytes are
    kept (head and tail, with a marker for the omitted middle). Returns the
    output followed by `[exit code 0]`. Raises `ToolError` with the exit code
    and output when the command exits non-zero, and when it times out.
    """
    if not timeout > 0:
        raise ConfigError(f"run_command timeout must be positive, got {timeout!r}")
    if max_output < 2:
        raise ConfigError(f"run_command max_output must be at least 2 bytes, got {max_output!r}")
    policy = sandbox if sandbox is not None else Sandbox.from_env()
    policy.check()

    async def run(args: dict[str, Any]) -> str:
        command = args.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ToolError("Argument 'command' must be a non-empty string")
        limit = _timeout_arg(args, timeout)
        buffer = _HeadTail(max_output)
        call = current_call.get()
        try:
            # Shielded so a cancellation cannot land between the spawn and our
            # holding the handle, which would leave the process unowned.
            with (
                anyio.CancelScope(shield=True),
                policy.launch(["/bin/sh", "-c", command], workspace.root) as launch,
            ):
                process = await anyio.open_process(
                    launch.argv,
                    cwd=workspace.root,
                    env=policy.environment(call.marker if call is not None else None),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=launch.pass_fds,
                )
        except OSError as exc:
            raise ToolError(f"Could not start the command: {exc}") from exc
        try:
            if call is not None:
                # A durable record of the group before the command can do
                # anything worth repeating; a cancellation must not skip it.
                with anyio.CancelScope(shield=True):
                    await call.record_process(process.pid, start_ticks(process.pid))
            with anyio.move_on_after(limit) as scope:
                assert process.stdout is not None
                async for chunk in process.stdout:
                    buffer.add(chunk)
                await process.wait()
        finally:
            # Runs on success, timeout and cancellation alike; the shield
            # lets the kill and the reaping finish before cancellation goes on.
            with anyio.CancelScope(shield=True):
                await _end_group(process, grace)
        output = buffer.text() or "(no output)"
        if scope.cancelled_caught:
            raise ToolError(
                f"Command timed out after {limit:g} s; its process group was killed.\n{output}"
            )
        code = process.returncode
        assert code is not None
        if code != 0:
            raise ToolError(f"Command failed.\n{_with_code(output, code)}")
        return _with_code(output, code)

    return Tool(
        name="run_command",
        description=(
            "Run a shell command (/bin/sh -c) in the work directory and return its "
            "combined stdout and stderr and exit code. A non-zero exit is reported as "
            f"a failure. Times out after {timeout:g} s at most; stdin is empty."
            + _confinement(policy)
        ),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command line."},
                "timeout": {
                    "type": "number",
                    "description": f"Seconds before the command is killed (at most {timeout:g}).",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        },
        run=run,
    )
