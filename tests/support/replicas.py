"""Role server replicas as processes: `serve coder --db postgresql+asyncpg://...`.

A scripted model (the only fake) and the shared work directory and database
the caller gives; each replica named by `--replica-id` and leased for
`lease` seconds (short, so a SIGKILLed one's leases expire within a test).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
}


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[str]
    url: str


def served_at(process: subprocess.Popen[str]) -> str:
    """The URL a starting server prints (its first lines); fails with its output."""
    assert process.stdout is not None
    seen = ""
    while line := process.stdout.readline():
        seen += line
        match = re.search(r"serving A2A at (http://\S+)", line)
        if match:
            return match.group(1)
    process.kill()
    raise AssertionError(seen + (process.stderr.read() if process.stderr else ""))


@contextmanager
def role_replicas(
    names: Sequence[str],
    db_url: str,
    work: Path,
    script: Path,
    *,
    lease: float,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[list[Replica]]:
    """Replicas of the coder role, started one after another (the first
    creates the tables: a2a-sdk's store does not guard creating them at
    once), stopped (SIGTERM, then SIGKILL) on the way out; `args` and `env`
    go to each."""
    environ = {**os.environ, **OFFLINE, "A2A_MODEL_SCRIPT": str(script), **(env or {})}
    started: list[subprocess.Popen[str]] = []
    replicas: list[Replica] = []
    try:
        for name in names:
            command = [
                *(sys.executable, "-m", "a2a_orchestrator.cli", "serve", "coder"),
                *("--port", "0", "--db", db_url, "--workdir", str(work)),
                *("--replica-id", name, "--lease-seconds", str(lease), *args),
            ]
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environ,
            )
            started.append(process)
            replicas.append(Replica(name=name, process=process, url=served_at(process)))
        yield replicas
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
