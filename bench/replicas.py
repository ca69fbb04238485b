"""Fan-out over role server replicas: children/s and their cost with 1, 2
and 3 replicas on PostgreSQL, beside one role server on SQLite.

    python bench/replicas.py [--children 200] [--replicas 1,2,3] [--pin] [--quick]

First one role server on its own SQLite file (the default, the floor the
replicas are measured against), then for each replica count a fresh
database on a throwaway PostgreSQL (Debian's binaries,
tests/support/postgres.py, with `pg_stat_statements`), that many
`a2a-orchestrator serve coder --db postgresql+asyncpg://...` processes
(instant scripted model); HAProxy (Debian's `haproxy`) in front of the
servers either way, balancing as deploy/haproxy.cfg does (least
connections). One Session (remote transport) delegates every child to the
balancer, all at once, and waits for all.

Prints for each setup the wall time and children per second (and the
figure relative to one replica), and per child, over the fan-out (after a
warm-up of three children): the role servers' CPU (their own counters, user
plus system), PostgreSQL's CPU (the postmaster's, its reaped backends' and
its live ones') and the statements PostgreSQL ran for the bench's database
(`pg_stat_statements`, transaction statements included), with the CPU's
ratio to the SQLite server's in the same run. On a machine with few cores
the processes share them, so what grows with replicas is what one process
could not use (its own event loop), not the machine; `--pin` gives each
replica a core of its own (`sched_setaffinity`) and PostgreSQL, HAProxy and
the orchestrator the cores left, when the machine has a core more than the
replicas.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import asyncpg
import httpx
from benchkit import cpu_seconds, machine_line, start_servers, stop_servers

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.store import Store

# The throwaway PostgreSQL of the tests (tests/support/postgres.py) serves the bench too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.postgres import Postgres, Unavailable, running_postgres

CARD = "/.well-known/agent-card.json"
STATEMENTS = ("shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def postmaster(postgres: Postgres) -> int:
    """The PostgreSQL server's main process (listening on its port)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"/postgres") and str(postgres.port).encode() in argv:
                return int(entry.name)
    raise SystemExit("the PostgreSQL server's process was not found")


def postgres_cpu(pid: int) -> float:
    """CPU seconds of the server: its own, its reaped backends' and its live ones'."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    reaped = (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    live = 0.0
    for child in _children(pid):
        try:
            live += cpu_seconds(child)
        except OSError:
            pass  # ended between the listing and the read: counted as reaped next time
    return cpu_seconds(pid) + reaped + live


@dataclass
class Meter:
    """What a fan-out costs: the servers' CPU, PostgreSQL's CPU and statements."""

    servers: list[int]
    database: str | None = None
    """The bench's database URL (None: the servers run on SQLite)."""
    postmaster: int = 0
    show: bool = False
    """Print the statements run, most first."""
    _start: tuple[float, float] = (0.0, 0.0)

    async def start(self) -> None:
        if self.database is not None:
            conn = await asyncpg.connect(self.database)
            try:
                await conn.execute("SELECT pg_stat_statements_reset()")
            finally:
                await conn.close()
        self._start = self._cpu()

    async def stop(self, count: int) -> tuple[float, float | None, float | None]:
        """Per child: the servers' CPU (ms), PostgreSQL's (ms), statements."""
        servers, pg = self._cpu()
        statements = None
        if self.database is not None:
            conn = await asyncpg.connect(self.database)
            try:
                rows = await conn.fetch(
                    "SELECT calls, query FROM pg_stat_statements WHERE dbid = "
                    "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND query NOT LIKE '%pg_stat_statements%' ORDER BY calls DESC"
                )
                statements = sum(row["calls"] for row in rows)
                for row in rows if self.show else ():
                    print(f"  {row['calls'] / count:6.2f}  {' '.join(row['query'].split())[:150]}")
            finally:
                await conn.close()
        return (
            (servers - self._start[0]) * 1000 / count,
            (pg - self._start[1]) * 1000 / count if self.postmaster else None,
            int(statements) / count if statements is not None else None,
        )

    def _cpu(self) -> tuple[float, float]:
        servers = sum(cpu_seconds(pid) for pid in self.servers)
        return servers, postgres_cpu(self.postmaster) if self.postmaster else 0.0


def pin(replicas: list[int], postmaster_pid: int) -> str:
    """Each replica on a core of its own, the rest (PostgreSQL, this
    process, HAProxy started after) on the cores left; what was done."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= len(replicas):
        return f"not pinned: {len(cores)} cores, {len(replicas)} replica(s) need one more"
    rest = set(cores[len(replicas) :])
    for core, pid in zip(cores, replicas, strict=False):
        os.sched_setaffinity(pid, {core})
    for pid in [postmaster_pid, *_children(postmaster_pid), os.getpid()]:
        os.sched_setaffinity(pid, rest)
    return f"replicas on cores {cores[: len(replicas)]}, the rest on {sorted(rest)}"


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


async def fan_out(count: int, url: str, work: Path, meter: Meter) -> tuple[float, tuple]:
    """Seconds for `count` children delegated at once to `url`, and their cost."""
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

        await meter.start()
        started = time.perf_counter()
        async with anyio.create_task_group() as children:
            for index in range(count):
                children.start_soon(child, index)
        wall = time.perf_counter() - started
        cost = await meter.stop(count)
    store.close()
    if failures:
        raise SystemExit(f"{len(failures)} of {count} children did not finish: {set(failures)}")
    return wall, cost


async def run(
    count: int, replicas: int | None, postgres: Postgres, pinned: bool, show: bool = False
) -> tuple[float, tuple]:
    """One setup: `replicas` on PostgreSQL, or None: one server on SQLite."""
    work = Path(tempfile.mkdtemp(prefix="a2a-replicas-"))
    database = db = None
    if replicas is not None:
        database = postgres.url(postgres.database("bench"))
        conn = await asyncpg.connect(database)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        finally:
            await conn.close()
        db = database.replace("postgresql://", "postgresql+asyncpg://", 1)
    processes, urls = start_servers(replicas or 1, work, [{"text": "ok"}], db=db)
    meter = Meter([p.pid for p in processes], database, show=show)
    affinity = os.sched_getaffinity(0)
    if database is not None:
        meter.postmaster = postmaster(postgres)
        if pinned:
            print(f"  {pin(meter.servers, meter.postmaster)}")
    try:
        with balancer(work, [int(u.rsplit(":", 1)[1]) for u in urls]) as url:
            await wait_until_up(url)
            return await fan_out(count, url, work, meter)
    finally:
        stop_servers(processes)
        os.sched_setaffinity(0, affinity)
        shutil.rmtree(work, ignore_errors=True)


def _ms(value: float | None) -> str:
    return f"{value:5.1f} ms" if value is not None else "-"


async def main(count: int, counts: list[int], pinned: bool, show: bool) -> None:
    print(f"fan-out over role server replicas on PostgreSQL behind HAProxy, {count} children")
    print(f"machine: {machine_line()}")
    try:
        with running_postgres(STATEMENTS) as postgres:
            wall, (floor, _, _) = await run(count, None, postgres, pinned=False)
            print(
                f"1 role server on SQLite: {count} children in {wall:6.2f} s, "
                f"{count / wall:7.1f} children/s; servers' CPU per child {_ms(floor)}"
            )
            figures = {}
            for replicas in counts:
                wall, (cpu, pg, statements) = await run(count, replicas, postgres, pinned, show)
                figures[replicas] = count / wall
                ratio = figures[replicas] / figures[counts[0]]
                print(
                    f"{replicas} replica(s): {count} children in {wall:6.2f} s, "
                    f"{figures[replicas]:7.1f} children/s ({ratio:4.2f}x {counts[0]} replica(s)); "
                    f"servers' CPU per child {_ms(cpu)} ({cpu / floor:4.2f}x SQLite), "
                    f"PostgreSQL's {_ms(pg)}, statements per child {statements:5.1f}"
                )
    except Unavailable as exc:
        raise SystemExit(str(exc)) from None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=200, help="children at once (200)")
    parser.add_argument(
        "--replicas", default="1,2,3", help="replica counts, comma-separated (1,2,3)"
    )
    parser.add_argument(
        "--pin", action="store_true", help="each replica on a core of its own (see above)"
    )
    parser.add_argument(
        "--statements", action="store_true", help="print the statements run per child"
    )
    parser.add_argument("--quick", action="store_true", help="20 children: a smoke test")
    args = parser.parse_args()
    counts = [int(n) for n in args.replicas.split(",")]
    anyio.run(main, 20 if args.quick else args.children, counts, args.pin, args.statements)
