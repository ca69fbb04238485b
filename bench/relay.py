"""Child-event relay: events per second a parent receives from one busy child.

    python bench/relay.py [--rounds 5] [--turns 10] [--calls 100] [--tool none] [--quick]

A scripted model makes `--calls` tool calls (`read_file` of a small file) in
each of `--turns` turns, then answers: every call is a ToolCalled and a
ToolResult event, each stored by the orchestrator and relayed. `--tool none`
calls a tool no role has instead: the child answers each call at once
("Unknown tool"), with no journal rows and no file read, so the figure is
the relay's own (store, announce, wire) for a stream of small events, which
is what the goal means; with `read_file` each event pair also carries a
tool's work (a file read in a worker thread; a tool that only reads is not
journaled).
Message deltas are no such stream: a child coalesces them to one per 50 ms
(`runtime.DELTA_INTERVAL`) and stores none. The parent
counts what reaches it through `Session.relay()` from the spawn to the
child's Done, for an in-process child (local) and a child on a role server
in its own process (remote, `a2a-orchestrator serve coder`), interleaved in
rounds. Prints events/s per variant, min, median and max over the rounds,
and the CPU time per event of the orchestrator and (remote) of the server.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import anyio
from benchkit import cpu_seconds, machine_line, scratch, start_servers, stop_servers

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.storage.store import Store

GOALS = {"local": 20_000, "remote": 5_000}


def busy_script(turns: int, calls: int, tool: str = "read_file") -> list[dict[str, Any]]:
    if tool == "none":
        call: dict[str, Any] = {"name": "no_such_tool", "arguments": {}}
    else:
        call = {"name": "read_file", "arguments": {"path": "note.txt"}}
    return [{"tool_calls": [call] * calls} for _ in range(turns)] + [{"text": "done"}]


async def relayed(session: Session, agent: str) -> tuple[int, float, float]:
    """Events the parent received from one child of `agent`, with the wall
    and CPU seconds from its spawn to its Done."""
    async with session.relay() as relay:
        started, used = time.perf_counter(), time.process_time()
        handle = await session.spawn(ChildConfig(role=agent, prompt="read the note, often"))
        count = 0
        with anyio.fail_after(600):
            async for item in relay:
                if item.child_id != handle.child_id:
                    continue
                count += 1
                if isinstance(item.event, Failed):
                    raise SystemExit(f"{agent} child failed: {item.event.message}")
                if isinstance(item.event, Done):
                    break
        return count, time.perf_counter() - started, time.process_time() - used


async def main(rounds: int, turns: int, calls: int, tool: str) -> None:
    work = scratch("a2a-relay-")
    (work / "note.txt").write_text("a short note\n")
    script = busy_script(turns, calls, tool)
    processes, urls = start_servers(1, work, script)
    try:
        model = ScriptedModel(script)
        network = Network.of(
            AgentSpec(name="local", role="coder"),
            AgentSpec(name="remote", role="coder", url=urls[0]),
        )
        rates: dict[str, list[float]] = {"local": [], "remote": []}
        cpu_per_event: dict[str, list[float]] = {"local": [], "remote": []}
        server_cpu_per_event: list[float] = []
        counts: dict[str, int] = {}
        store = Store(work / "orchestrator.db")
        async with Session(
            store, workdir=work, network=network, models=lambda name: model
        ) as session:
            for agent in rates:  # warm up: connections, caches, the role file
                await relayed(session, agent)
            for _ in range(rounds):
                for agent in rates:
                    server_before = cpu_seconds(processes[0].pid)
                    count, wall, cpu = await relayed(session, agent)
                    if agent == "remote":
                        server_cpu = cpu_seconds(processes[0].pid) - server_before
                        server_cpu_per_event.append(server_cpu / count)
                    counts[agent] = count
                    rates[agent].append(count / wall)
                    cpu_per_event[agent].append(cpu / count)
        store.close()
    finally:
        stop_servers(processes)
    print(
        f"relay: {rounds} rounds, one child each, {turns} turns x {calls} tool calls"
        f" ({'read_file' if tool == 'read_file' else 'of no tool: small events only'}),"
        " counted through Session.relay()"
    )
    print(f"machine: {machine_line()}")
    for agent, samples in rates.items():
        own = statistics.median(cpu_per_event[agent]) * 1e6
        print(
            f"  {agent:<7} {counts[agent]:6d} events: events/s min {min(samples):8.0f}"
            f"  median {statistics.median(samples):8.0f}  max {max(samples):8.0f}"
            f"  (goal >= {GOALS[agent]:,})"
            f"   cpu per event: orchestrator {own:6.1f} us"
            + (
                f", server {statistics.median(server_cpu_per_event) * 1e6:6.1f} us"
                if agent == "remote"
                else ""
            )
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of local then remote")
    parser.add_argument("--turns", type=int, default=10, help="model turns with tool calls")
    parser.add_argument("--calls", type=int, default=100, help="tool calls per turn")
    parser.add_argument(
        "--tool",
        choices=("read_file", "none"),
        default="read_file",
        help="the tool called: read_file, or none (small events, no tool work)",
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds of 2x10 calls: smoke test")
    args = parser.parse_args()
    sizes = (3, 2, 10) if args.quick else (args.rounds, args.turns, args.calls)
    rounds, turns, calls = sizes
    anyio.run(main, rounds, turns, calls, args.tool)
