"""Reading the deployment files (compose, HAProxy) and running HAProxy in front of replicas."""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from a2a_orchestrator.delegation.network import AgentSpec, Network

ROOT = Path(__file__).resolve().parents[2]


def flag(command: list[str], name: str) -> str:
    """The value after `name` in a service's command; fails if it is absent."""
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def command_of(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    assert isinstance(command, list), "command must be a list (exec form)"
    assert all(isinstance(part, str) for part in command)
    return command


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    assert isinstance(env, dict)
    return {key: str(value) for key, value in env.items()}


def interpolate(text: str, environ: dict[str, str]) -> str:
    """Compose's `${VAR:-default}` and `${VAR:?error}`, the forms this file uses."""

    def one(match: re.Match[str]) -> str:
        name, op, word = match.group(1), match.group(2), match.group(3)
        value = environ.get(name, "")
        if op == ":?" and not value:
            raise ValueError(f"required variable {name} is missing a value: {word}")
        return value or word

    return re.sub(r"\$\{(\w+)(:-|:\?)([^}]*)\}", one, text)


REPLICAS = ["coder-1", "coder-2", "coder-3"]


def local_config(port: int, servers: dict[str, int], stats: Path) -> str:
    """deploy/haproxy.cfg as it is, except where it runs: the frontend binds
    127.0.0.1:`port`, the backend's servers are `servers` on 127.0.0.1, and
    Docker's DNS (absent here) is not used. An admin socket lets the test
    read each server's state."""
    out: list[str] = []
    binds = replaced = 0
    for header, body in sections(HAPROXY_CFG.read_text(encoding="utf-8")):
        if header.startswith("resolvers "):
            continue
        out.append(header)
        if header == "global":
            out.append(f"    stats socket {stats} mode 600 level admin")
        for line in body:
            keyword = line.split()[0]
            if keyword == "bind":
                binds += 1
                line = f"bind 127.0.0.1:{port}"
            elif keyword == "default-server":
                line = re.sub(r"\s+resolvers \S+", "", line)
            elif keyword == "server":
                if not replaced:
                    out.extend(f"    server {name} 127.0.0.1:{p}" for name, p in servers.items())
                replaced += 1
                continue
            out.append(f"    {line}")
    # The template still has the shape this rewrite expects.
    assert binds == 1 and replaced == len(REPLICAS)
    return "\n".join(out) + "\n"


@contextmanager
def haproxy(config: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    assert HAPROXY is not None
    with log.open("wb") as out:
        # -db: stay in the foreground, as in the container.
        process = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=out, stderr=out)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)


async def wait_for_states(stats: Path, wanted: dict[str, str]) -> None:
    while True:
        try:
            states = await server_states(stats)
        except OSError:
            states = {}  # not listening yet
        if all(states.get(name) == state for name, state in wanted.items()):
            return
        await anyio.sleep(0.1)


def agents() -> dict[str, AgentSpec]:
    """The agents of the repository's agents/ directory, without env overrides."""
    network = Network.load(cwd=ROOT, home=ROOT / "no-such-home", environ={})
    found = {
        name: spec
        for name, spec in network.agents.items()
        if spec.source is not None and spec.source.parent == ROOT / "agents"
    }
    assert found, "no agent files in agents/"
    return found


HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"


HAPROXY = shutil.which("haproxy")


def sections(text: str) -> list[tuple[str, list[str]]]:
    """(header, body lines) of an HAProxy config; comments and blank lines dropped."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        bare = line.split("#", 1)[0].rstrip()
        if not bare.strip():
            continue
        if not bare[0].isspace():
            found.append((bare, []))
        else:
            found[-1][1].append(bare.strip())
    return found


async def server_states(stats: Path) -> dict[str, str]:
    """Each server's status as its health checks see it: UP, DOWN, ..."""
    return {row["svname"]: row["status"] for row in await show_stat(stats)}


async def show_stat(stats: Path) -> list[dict[str, str]]:
    """The backend's server rows of HAProxy's `show stat` (admin socket)."""
    async with await anyio.connect_unix(str(stats)) as sock:
        await sock.send(b"show stat\n")
        raw = b""
        try:
            while True:
                raw += await sock.receive()
        except anyio.EndOfStream:
            pass
    rows = csv.DictReader(io.StringIO(raw.decode().removeprefix("# ")))
    return [row for row in rows if row["pxname"] == "coder-replicas" and row["svname"] in REPLICAS]


AGENTS = agents()


needs_haproxy = pytest.mark.skipif(
    HAPROXY is None, reason="HAProxy is not installed (Debian package `haproxy`)"
)
