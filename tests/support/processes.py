"""Processes: host pids by command line, and the crash scripts run as subprocesses."""

from __future__ import annotations

from pathlib import Path


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
