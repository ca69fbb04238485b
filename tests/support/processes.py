"""Processes: host pids by command line, and the crash scripts run as subprocesses."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from a2a_orchestrator.tools.procs import marked_processes


def running_with_args(*argv: str) -> list[int]:
    """Host pids of live processes whose command line is exactly `argv`.

    A sandboxed command has a PID namespace of its own, so the pid it prints
    (`echo $$`) means nothing out here; a command line made unique by its
    test (`sleep 60.417`) finds it instead. Zombies have an empty command line.
    """
    wanted = b"".join(arg.encode() + b"\0" for arg in argv)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == wanted:
                    found.append(int(entry.name))
            except OSError:
                continue  # exited while we looked
    return found


# The scripts a test runs as a process and kills (`python CRASH / "crash_parent.py" ...`).
CRASH = Path(__file__).resolve().parent / "crash"


def running_with_text(text: str) -> list[int]:
    """Host pids of live processes whose command line contains `text`: the
    shell running a test's command (`sh -c "...; sleep 3; echo end"`), the
    bubblewrap that started it."""
    wanted = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if wanted in (entry / "cmdline").read_bytes().replace(b"\0", b" "):
                    found.append(int(entry.name))
            except OSError:
                continue  # exited while we looked
    return found


def journaled_processes(db: Path) -> list[int]:
    """Live processes of the tool calls journaled in the SQLite file `db`:
    each call's processes carry its marker in their environment, through
    `exec` and sandboxing alike."""
    conn = sqlite3.connect(db)
    try:
        markers = [row[0] for row in conn.execute("SELECT marker FROM tool_calls")]
    except sqlite3.OperationalError:
        markers = []  # no journal in this file (yet)
    finally:
        conn.close()
    return [pid for marker in markers if marker for pid in marked_processes(marker)]


async def until_none(find: Callable[[], list[int]], within: float) -> None:
    """Wait until `find()` finds no process, for at most `within` seconds.

    A test that shows something never happens (a file a command would write
    later, past a kill) waits here for the processes that could still do it,
    rather than for a fixed time: in a passing run they are gone already, so
    this returns at once; a survivor holds the wait up to `within`, the time
    the command needed, after which the test's own check sees what it did.
    """
    with anyio.move_on_after(within):
        while find():
            await anyio.sleep(0.02)


def until_none_blocking(find: Callable[[], list[int]], within: float) -> None:
    """`until_none` for a test that is not async."""
    deadline = time.monotonic() + within
    while find() and time.monotonic() < deadline:
        time.sleep(0.02)
