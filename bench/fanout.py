"""Fan-out: N children at once over several role-server processes.

    python bench/fanout.py [--children 1000] [--servers 4] [--quick]

Starts the role servers as real processes (`a2a-orchestrator serve coder`,
instant scripted model), as a deployment runs them. One Session (remote
transport, round robin over the servers) then starts every child
concurrently, each in its own task (`spawn`, then `result`), and waits for
all. Prints the wall time, children per second, the most children in flight
at once (spawned and not yet finished), the CPU per child of the orchestrator
and of the servers together, and memory per child: the resident
memory (VmRSS from /proc) of the orchestrator and of each server at its
highest during the fan-out, less what it held just before, divided by N.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import anyio
from benchkit import (
    collector_line,
    cpu_seconds,
    machine_line,
    rss_mib,
    scratch,
    start_servers,
    stop_servers,
)

from a2a_orchestrator.cli.heap import settle
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.store import Store

# How often memory is read while the children run.
SAMPLE_EVERY = 0.05


class Counts:
    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0
        self.done = 0
        self.failures: list[str] = []


async def fan_out(
    count: int, urls: list[str], pids: list[int], work: Path, default_gc: bool
) -> None:
    network = Network.of(
        *(AgentSpec(name=f"coder-{i}", role="coder", url=url) for i, url in enumerate(urls))
    )
    store = Store(work / "orchestrator.db")
    counts = Counts()
    if not default_gc:
        # Where `a2a-orchestrator run` sets the collector (heap.py): its store
        # open, its session next. The servers are `serve`, which does too.
        settle()
    print(f"collector: {collector_line()}")
    async with Session(store, workdir=work, network=network) as session:
        # One child per server first, so connections and cards are warm.
        for index in range(len(urls)):
            await (await session.spawn(ChildConfig(role=f"coder-{index}", prompt="warm"))).wait()
        before = {"orchestrator": rss_mib()} | {
            f"server {i}": rss_mib(p) for i, p in enumerate(pids)
        }
        peak = dict(before)

        async def child(index: int) -> None:
            counts.in_flight += 1
            counts.most_in_flight = max(counts.most_in_flight, counts.in_flight)
            agent = f"coder-{index % len(urls)}"
            handle = await session.spawn(ChildConfig(role=agent, prompt=f"child {index}"))
            result = await handle.result()
            counts.in_flight -= 1
            if isinstance(result, Done):
                counts.done += 1
            else:
                counts.failures.append(getattr(result, "message", type(result).__name__))

        async def sample(stop: anyio.Event) -> None:
            while not stop.is_set():
                peak["orchestrator"] = max(peak["orchestrator"], rss_mib())
                for i, pid in enumerate(pids):
                    peak[f"server {i}"] = max(peak[f"server {i}"], rss_mib(pid))
                with anyio.move_on_after(SAMPLE_EVERY):
                    await stop.wait()

        stop = anyio.Event()
        served = sum(cpu_seconds(pid) for pid in pids)
        started, used = time.perf_counter(), time.process_time()
        async with anyio.create_task_group() as sampler:
            sampler.start_soon(sample, stop)
            async with anyio.create_task_group() as children:
                for index in range(count):
                    children.start_soon(child, index)
            wall, cpu = time.perf_counter() - started, time.process_time() - used
            servers_cpu = sum(cpu_seconds(pid) for pid in pids) - served
            stop.set()
    store.close()
    if counts.done != count:
        raise SystemExit(
            f"{count - counts.done} of {count} children did not finish: {set(counts.failures)}"
        )
    print(
        f"{count} children: wall {wall:6.2f} s (goal <= 6 s for 1,000), {count / wall:7.1f}"
        f" children/s, orchestrator cpu {cpu:6.2f} s, most in flight {counts.most_in_flight}"
    )
    # Two cores: the wall time is at least the busiest process's CPU, and at
    # least half of everyone's.
    print(
        f"  cpu per child: orchestrator {cpu / count * 1e3:5.2f} ms,"
        f" servers {servers_cpu / count * 1e3:5.2f} ms (all {len(pids)} together)"
    )
    for name in peak:
        grown = peak[name] - before[name]
        print(
            f"  {name:<12} RSS before {before[name]:7.1f} MiB, peak {peak[name]:7.1f} MiB,"
            f" per child {grown * 1024 / count:7.1f} KiB"
        )


async def main(count: int, servers: int, default_gc: bool = False) -> None:
    work = scratch("a2a-fanout-")
    processes, urls = start_servers(servers, work, [{"text": "ok"}])
    try:
        print(f"fan-out over {servers} role servers (processes), instant scripted model")
        print(f"machine: {machine_line()}")
        await fan_out(count, urls, [p.pid for p in processes], work, default_gc)
    finally:
        stop_servers(processes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=1000, help="children at once (1000)")
    parser.add_argument("--servers", type=int, default=4, help="role server processes (4)")
    parser.add_argument(
        "--default-gc",
        action="store_true",
        help="leave CPython's garbage collector as it is (this process only)",
    )
    parser.add_argument("--quick", action="store_true", help="20 children, 2 servers: a smoke test")
    args = parser.parse_args()
    children, servers = (20, 2) if args.quick else (args.children, args.servers)
    anyio.run(main, children, servers, args.default_gc)
