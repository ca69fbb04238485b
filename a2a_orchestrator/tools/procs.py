"""Finding and ending process groups a crashed process left behind (Linux /proc).

A command's process group is recorded with its leader's start time (field 22
of /proc/PID/stat, clock ticks since boot) and the call's marker, which every
process it starts carries in its environment (`CALL_MARKER_ENV`).
A group is ours when its leader still has the recorded start time, or, once
the leader is gone, for each remaining process that carries the marker.
Nothing else is signalled: a pid or group id reused by an unrelated process
never matches both.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Iterator

__all__ = ["CALL_MARKER_ENV", "end_leftovers", "marked_processes", "start_ticks"]

CALL_MARKER_ENV = "A2A_ORCHESTRATOR_CALL"
"""Environment variable that tags every process a tool call starts."""


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # Fields after the parenthesised command name: state (3), ppid, pgrp, ...
    return raw[raw.rfind(b")") + 2 :].split()


def start_ticks(pid: int) -> int:
    """When process `pid` started (clock ticks since boot); 0 when unknown."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return 0
    return int(fields[19])


def _pids() -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read().split(b"\0")
    except OSError:
        return False


def marked_processes(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment carries `marker`."""
    needle = f"{CALL_MARKER_ENV}={marker}".encode()
    found = []
    for pid in _pids():
        if pid == os.getpid():
            continue
        fields = _stat_fields(pid)
        if fields is None or fields[0] in (b"Z", b"X"):
            continue
        if _environ_has(pid, needle):
            found.append(pid)
    return found


def end_leftovers(groups: Iterable[tuple[int, int, str]]) -> int:
    """SIGKILL what each recorded `(pgid, start_ticks, marker)` left running.

    Returns how many processes or groups were signalled.
    """
    ended = 0
    for pgid, ticks, marker in groups:
        if pgid > 0 and ticks and start_ticks(pgid) == ticks:
            try:
                os.killpg(pgid, signal.SIGKILL)
                ended += 1
            except (ProcessLookupError, PermissionError):
                pass
        if not marker:
            continue
        for pid in marked_processes(marker):
            try:
                os.kill(pid, signal.SIGKILL)
                ended += 1
            except (ProcessLookupError, PermissionError):
                pass
    return ended
