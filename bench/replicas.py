"""Fan-out over role server replicas: children/s with 1, 2 and 3 replicas.

    python bench/replicas.py [--children 200] [--quick]

For each replica count, a fresh database on a throwaway PostgreSQL
(Debian's binaries, tests/support/postgres.py), that many `a2a-orchestrator serve
coder --db postgresql+asyncpg://...` processes (instant scripted model)
and HAProxy (Debian's `haproxy`) in front of them, balancing as
deploy/haproxy.cfg does (least connections). One Session (remote transport)
delegates every child to the balancer, all at once, and waits for all.
Prints the wall time and children per second for each count, and each
count's figure relative to one replica. On a machine with few cores the
replicas share them, so what grows with replicas is what one process
could not use (its own event loop), not the machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
from benchkit import machine_line, start_servers, stop_servers

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.store import Store

# The throwaway PostgreSQL of the tests (tests/support/postgres.py) serves the bench too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.postgres import Postgres, Unavailable, running_postgres

CARD = "/.well-known/agent-card.json"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def haproxy_config(port: int, servers: list[int]) -> str:
    """deploy/haproxy.cfg's balancing, on 127.0.0.1 (no Docker DNS)."""
    lines = [
        "global",
        "    maxconn 4096",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    retries 2",
        "    option redispatch",
        "frontend coder",
        f"    bind 127.0.0.1:{port}",
        "    default_backend coder-replicas",
        "backend coder-replicas",
        "    balance leastconn",
        "    option httpchk",
        f"    http-check send meth GET uri {CARD}",
        "    default-server check inter 1s fall 2 rise 1",
        *(f"    server coder-{i + 1} 127.0.0.1:{p}" for i, p in enumerate(servers)),
    ]
    return "\n".join(lines) + "\n"


@contextmanager
def balancer(work: Path, servers: list[int]) -> Iterator[str]:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        raise SystemExit("needs HAProxy (Debian package haproxy)")
    port = free_port()
    config = work / "haproxy.cfg"
    config.write_text(haproxy_config(port, servers))
    with (work / "haproxy.log").open("wb") as log:
        process = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=log, stderr=log)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


async def wait_until_up(url: str) -> None:
    with anyio.fail_after(30):
        async with httpx.AsyncClient(timeout=5) as http:
            while True:
                try:
                    if (await http.get(url + CARD)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.1)


async def fan_out(count: int, url: str, work: Path) -> float:
    """Seconds for `count` children delegated at once to `url`."""
    network = Network.of(AgentSpec(name="coder", role="coder", url=url))
    store = Store(work / "orchestrator.db")
    failures: list[str] = []
    async with Session(store, workdir=work, network=network) as session:
        # Warm: a connection, the card, each replica's first task.
        for _ in range(3):
            await (await session.spawn(ChildConfig(role="coder", prompt="warm"))).wait()

        async def child(index: int) -> None:
            handle = await session.spawn(ChildConfig(role="coder", prompt=f"child {index}"))
            result = await handle.result()
            if not isinstance(result, Done):
                failures.append(getattr(result, "message", type(result).__name__))

        started = time.perf_counter()
        async with anyio.create_task_group() as children:
            for index in range(count):
                children.start_soon(child, index)
        wall = time.perf_counter() - started
    store.close()
    if failures:
        raise SystemExit(f"{len(failures)} of {count} children did not finish: {set(failures)}")
    return wall


async def run(count: int, replicas: int, postgres: Postgres) -> float:
    work = Path(tempfile.mkdtemp(prefix="a2a-replicas-"))
    db = postgres.url(postgres.database("bench"), "postgresql+asyncpg")
    processes, urls = start_servers(replicas, work, [{"text": "ok"}], db=db)
    try:
        with balancer(work, [int(u.rsplit(":", 1)[1]) for u in urls]) as url:
            await wait_until_up(url)
            return await fan_out(count, url, work)
    finally:
        stop_servers(processes)
        shutil.rmtree(work, ignore_errors=True)


async def main(count: int) -> None:
    print(f"fan-out over role server replicas on PostgreSQL behind HAProxy, {count} children")
    print(f"machine: {machine_line()}")
    try:
        with running_postgres() as postgres:
            figures = {}
            for replicas in (1, 2, 3):
                wall = await run(count, replicas, postgres)
                figures[replicas] = count / wall
                ratio = figures[replicas] / figures[1]
                print(
                    f"{replicas} replica(s): {count} children in {wall:6.2f} s, "
                    f"{figures[replicas]:7.1f} children/s ({ratio:4.2f}x one replica)"
                )
    except Unavailable as exc:
        raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=200, help="children at once (200)")
    parser.add_argument("--quick", action="store_true", help="20 children: a smoke test")
    args = parser.parse_args()
    anyio.run(main, 20 if args.quick else args.children)
