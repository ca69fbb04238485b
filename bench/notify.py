"""Cross-replica event streams: a2a-sdk's polling against LISTEN/NOTIFY.

    python bench/notify.py [--replicas 4] [--subscriptions 50] [--events 100] [--quick]

A simulation of N role server replicas x M remote subscriptions each (one
SubscribeToTask of a task running on another replica) against one
throwaway PostgreSQL (tests/support/postgres.py) with `pg_stat_statements`.
Each replica is its own set of connections in this process: for `polling`,
a SQLAlchemy engine under a2a-sdk's `DatabaseTaskEventStream` (0.5 s, its
default); for `notify`, a listening connection (`storage/notify.py`) and a
reads connection under `NotifiedTaskEventStream`. Both read the same
`task_events` table.

For each stream: every subscription makes its first read; then the
statements the database runs in `--window` seconds at rest (every
statement `pg_stat_statements` counts in the bench's database, BEGIN and
ROLLBACK included, less the bench's own counting), per second and per
subscription; then `--events` events, each written to `task_events` by
replica 0 (one INSERT on its own asyncpg connection, as the task store
appends it) and published, for a task subscribed on replica 1, at random
gaps of 20-100 ms: the latency from the INSERT's commit to the
subscriber's yield (median, 90th percentile, max), and the statements per
event. Last, the at-rest figure extrapolated linearly to 100 replicas x
1,000 subscriptions.

All replicas share this process's event loop and the machine's cores with
PostgreSQL: latency includes that contention (more for polling, whose
subscriptions all wake every 0.5 s).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from a2a.server.cluster import DatabaseTaskEventStream, VersionedDatabaseTaskStore
from a2a.server.cluster.event_stream import TaskEventStream, VersionedEvent
from a2a.server.cluster.version import TaskVersion
from a2a.types import StreamResponse, TaskState, TaskStatus, TaskStatusUpdateEvent
from benchkit import machine_line
from sqlalchemy.ext.asyncio import create_async_engine

from a2a_orchestrator.storage.database.postgres import PgConnection
from a2a_orchestrator.storage.notify import Notifier
from a2a_orchestrator.storage.tasks.notified import NotifiedTaskEventStream

# The throwaway PostgreSQL of the tests (tests/support/postgres.py) serves the bench too.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from support.postgres import Postgres, Unavailable, running_postgres

POLL = 0.5
"""a2a-sdk's default poll interval."""
TARGET = (100, 1000)
"""The extrapolation: replicas x subscriptions per replica."""
MODES = ("polling", "notify")


def event_bytes(task_id: str) -> bytes:
    status = TaskStatus(state=TaskState.TASK_STATE_WORKING)
    event = TaskStatusUpdateEvent(task_id=task_id, context_id=f"c-{task_id}", status=status)
    return StreamResponse(status_update=event).SerializeToString()


async def statements(admin: Any) -> int:
    """Statements run in the bench's database so far (the counting excluded)."""
    count = await admin.fetchval(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
        "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database() "
        "AND s.query NOT ILIKE '%pg_stat_statements%'"
    )
    return int(count)


@asynccontextmanager
async def streams(mode: str, url: str, replicas: int) -> AsyncIterator[list[TaskEventStream]]:
    """One stream per simulated replica, each on connections of its own."""
    async with AsyncExitStack() as stack:
        made: list[TaskEventStream] = []
        notifiers: list[Notifier] = []
        for _ in range(replicas):
            if mode == "polling":
                engine = create_async_engine(url)
                stack.push_async_callback(engine.dispose)
                made.append(
                    DatabaseTaskEventStream(engine, create_table=False, poll_interval_s=POLL)
                )
            else:
                notifier = Notifier(url)
                await stack.enter_async_context(notifier.running())
                stream = NotifiedTaskEventStream(PgConnection(url, "bench reads"), notifier)
                stack.callback(stream.connection.close)
                await stream.initialize()
                notifiers.append(notifier)
                made.append(stream)
        with anyio.fail_after(30):
            while not all(n.up for n in notifiers):
                await anyio.sleep(0.01)
        yield made


async def run_mode(
    mode: str, postgres: Postgres, database: str, args: argparse.Namespace
) -> dict[str, float]:
    url = postgres.url(database, "postgresql+asyncpg")
    plain = postgres.url(database)
    admin = await asyncpg.connect(plain)
    writer = await asyncpg.connect(plain)
    n, m = args.replicas, args.subscriptions
    tasks = {(r, i): f"{mode}-{r}-{i}" for r in range(n) for i in range(m)}
    await writer.executemany(
        "INSERT INTO task_events (task_id, owner, task_version, event_data) VALUES ($1, '', 1, $2)",
        [(task_id, event_bytes(task_id)) for task_id in tasks.values()],
    )
    arrived: dict[tuple[str, int], float] = {}
    sent: dict[tuple[str, int], float] = {}
    first_reads = 0
    try:
        async with streams(mode, url, n) as made, anyio.create_task_group() as tg:

            async def follow(stream: TaskEventStream, task_id: str) -> None:
                nonlocal first_reads
                subscription = stream.subscribe(task_id, after=TaskVersion(1))
                first_reads += 1
                async for versioned in subscription:
                    arrived[(task_id, int(versioned.version._value))] = time.perf_counter()

            for (r, _i), task_id in tasks.items():
                tg.start_soon(follow, made[r], task_id)
            # Every subscription has made its first read (polling: a few rounds).
            while first_reads < len(tasks):
                await anyio.sleep(0.05)
            await anyio.sleep(2 * POLL + 1.0)

            await admin.execute("SELECT pg_stat_statements_reset()")
            await anyio.sleep(args.window)
            at_rest = await statements(admin) / args.window

            # Events for replica 1's tasks, written and published by replica 0.
            watched = [tasks[(1 % n, i)] for i in range(m)]
            await admin.execute("SELECT pg_stat_statements_reset()")
            started = time.perf_counter()
            for k in range(args.events):
                task_id = watched[k % m]
                version = 2 + k // m
                data = event_bytes(task_id)
                await writer.execute(
                    "INSERT INTO task_events (task_id, owner, task_version, event_data) "
                    "VALUES ($1, '', $2, $3)",
                    task_id,
                    version,
                    data,
                )
                sent[(task_id, version)] = time.perf_counter()
                status = TaskStatusUpdateEvent(task_id=task_id, status=TaskStatus())
                await made[0].publish(task_id, VersionedEvent(status, TaskVersion(version)))
                await anyio.sleep(random.uniform(0.02, 0.1))
            with anyio.fail_after(30):
                while not all(key in arrived for key in sent):
                    await anyio.sleep(0.01)
            elapsed = time.perf_counter() - started
            during = await statements(admin)
            tg.cancel_scope.cancel()
    finally:
        await admin.close()
        await writer.close()
    latencies = sorted((arrived[key] - sent[key]) * 1000 for key in sent)
    # Beyond the rest of the subscriptions' background, what the events cost.
    per_event = (during - at_rest * elapsed) / args.events
    return {
        "at_rest": at_rest,
        "per_subscription": at_rest / len(tasks),
        "median": statistics.median(latencies),
        "p90": latencies[int(0.9 * (len(latencies) - 1))],
        "max": latencies[-1],
        "per_event": per_event,
    }


async def main(args: argparse.Namespace) -> None:
    print(machine_line())
    n, m = args.replicas, args.subscriptions
    print(
        f"{n} replicas x {m} subscriptions = {n * m} live subscriptions, "
        f"{args.events} events, {args.window:g} s at rest"
    )
    try:
        with running_postgres(["shared_preload_libraries=pg_stat_statements"]) as postgres:
            database = postgres.database("notify")
            admin = await asyncpg.connect(postgres.url(database))
            await admin.execute("CREATE EXTENSION pg_stat_statements")
            await admin.close()
            engine = create_async_engine(postgres.url(database, "postgresql+asyncpg"))
            await VersionedDatabaseTaskStore(engine, create_table=True).initialize()
            await engine.dispose()
            results = {mode: await run_mode(mode, postgres, database, args) for mode in MODES}
    except Unavailable as exc:
        sys.exit(f"bench/notify.py: {exc}")
    replicas, subscriptions = TARGET
    for mode, r in results.items():
        print(
            f"{mode:8} at rest {r['at_rest']:8.1f} statements/s "
            f"({r['per_subscription']:.3f} per subscription); "
            f"event latency median {r['median']:.1f} ms, p90 {r['p90']:.1f} ms, "
            f"max {r['max']:.1f} ms; {r['per_event']:.1f} statements per event"
        )
    for mode, r in results.items():
        print(
            f"{mode:8} extrapolated to {replicas} replicas x {subscriptions} subscriptions: "
            f"{r['per_subscription'] * replicas * subscriptions:,.0f} statements/s at rest"
        )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--subscriptions", type=int, default=50, help="per replica")
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured at rest")
    parser.add_argument("--quick", action="store_true", help="2 x 10, 20 events: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.replicas, args.subscriptions, args.events, args.window = 2, 10, 20, 3.0
    if args.replicas < 2:
        parser.error("--replicas must be at least 2 (the subscriber is on another replica)")
    return args


if __name__ == "__main__":
    anyio.run(main, parse())
