"""What a role server's Prometheus metrics cost a delegation: on vs off.

    python bench/metrics_cost.py [--rounds 20] [-n 20]

Two role servers in this process on 127.0.0.1, the same role and scripted
model (one tool call, then an answer: two model calls, a tool call, a
turn), one with metrics (the default) and one with `metrics=False`. A
session delegates to them over our remote transport in interleaved rounds
(`-n` delegations to one, then to the other, the order alternating each
round), so drift in the machine's load falls on both alike. Prints the
median per delegation for each, their difference, and what one scrape of
`/metrics` takes after the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import anyio
import httpx
from benchkit import scratch

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store


def script(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if not any(m["role"] == "assistant" for m in messages):
        return {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}
    return {"text": "ok"}


async def main(rounds: int, n: int) -> None:
    work = scratch("a2a-bench-metrics-")
    (work / "notes.txt").write_text("a note\n")
    model = ScriptedModel(script)
    role = find_role("architect")
    samples: dict[str, list[float]] = {"off": [], "on": []}
    async with (
        run_role_server(role, model, work, db=str(work / "off.db"), metrics=False) as off,
        run_role_server(role, model, work, db=str(work / "on.db")) as on,
    ):
        network = Network.of(
            AgentSpec(name="off", role="architect", url=off.url),
            AgentSpec(name="on", role="architect", url=on.url),
        )
        async with Session(Store(work / "o.db"), workdir=work, network=network) as session:

            async def delegate(agent: str) -> float:
                started = time.perf_counter()
                handle = await session.spawn(ChildConfig(role=agent, prompt="hi"))
                await handle.wait()
                return time.perf_counter() - started

            for agent in ("off", "on"):  # warm up connections and caches
                for _ in range(5):
                    await delegate(agent)
            for index in range(rounds):
                order = ("off", "on") if index % 2 == 0 else ("on", "off")
                for agent in order:
                    samples[agent].extend([await delegate(agent) for _ in range(n)])
        async with httpx.AsyncClient() as http:
            scrapes = []
            for _ in range(50):
                started = time.perf_counter()
                reply = await http.get(f"{on.url}/metrics")
                scrapes.append(time.perf_counter() - started)
            size = len(reply.content)

    medians = {agent: statistics.median(values) for agent, values in samples.items()}
    print(f"{rounds} interleaved rounds of {n} delegations each (remote, two model calls,")
    print("one tool call per delegation), 127.0.0.1")
    for agent, median in medians.items():
        p90 = statistics.quantiles(samples[agent], n=10)[-1]
        print(f"  metrics {agent:<3}  median {median * 1000:7.2f} ms   p90 {p90 * 1000:7.2f} ms")
    difference = medians["on"] - medians["off"]
    print(f"  on - off: {difference * 1000:+.2f} ms ({difference / medians['off'] * 100:+.1f} %)")
    print(f"  one scrape of /metrics: median {statistics.median(scrapes) * 1000:.2f} ms, {size} B")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("-n", type=int, default=20, help="delegations per server per round")
    arguments = parser.parse_args()
    anyio.run(main, arguments.rounds, arguments.n)
