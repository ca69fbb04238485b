"""Fan-out: many concurrent children spread over several role servers.

    python bench/fanout.py [--servers 3] [--sizes 10 100 1000]

Starts the role servers as real processes (`a2a-orchestrator serve coder`,
instant scripted model), then for each size spawns that many children at
once through one Session (remote transport, round robin over the servers)
and waits for all. Prints wall time, children per second, child events per
second (as stored by the orchestrator) and the orchestrator's peak memory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from a2a_orchestrator.delegation import ChildConfig
from a2a_orchestrator.events import Done
from a2a_orchestrator.network import AgentSpec, Network
from a2a_orchestrator.session import Session
from a2a_orchestrator.store import Store


def start_servers(count: int, work: Path) -> tuple[list[subprocess.Popen[str]], list[str]]:
    script = work / "instant.json"
    script.write_text(json.dumps([{"text": "ok"}]))
    env = {
        **os.environ,
        "A2A_MODEL_SCRIPT": str(script),
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
    }
    processes, urls = [], []
    for index in range(count):
        db = work / f"role-{index}.db"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "a2a_orchestrator.cli",
                "serve",
                "coder",
                "--port",
                "0",
                "--db",
                str(db),
                "--workdir",
                str(work),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert process.stdout is not None
        match = re.search(r"serving A2A at (http://\S+)", process.stdout.readline())
        if not match:
            raise SystemExit("a role server did not start")
        processes.append(process)
        urls.append(match.group(1))
    return processes, urls


async def run(size: int, urls: list[str], work: Path) -> dict[str, float]:
    network = Network.of(
        *(AgentSpec(name=f"coder-{i}", role="coder", url=url) for i, url in enumerate(urls))
    )
    store = Store(work / f"orchestrator-{size}.db")
    async with Session(store, workdir=work, network=network) as session:
        # One child first, so connections and cards are warm.
        await (await session.spawn(ChildConfig(role="coder-0", prompt="warm up"))).wait()
        started = time.perf_counter()
        handles = []
        for index in range(size):
            agent = f"coder-{index % len(urls)}"
            handles.append(await session.spawn(ChildConfig(role=agent, prompt=f"child {index}")))
        results = [await handle.result() for handle in handles]
        wall = time.perf_counter() - started
    events = len(await store.events(session.id)) - 4  # less the warm-up child's
    store.close()
    done = sum(isinstance(r, Done) for r in results)
    if done != size:
        failures = {getattr(r, "message", "") for r in results if not isinstance(r, Done)}
        raise SystemExit(f"{size - done} of {size} children did not finish: {failures}")
    return {"wall": wall, "events": events}


async def main(servers: int, sizes: list[int]) -> None:
    work = Path(tempfile.mkdtemp(prefix="a2a-fanout-"))
    processes, urls = start_servers(servers, work)
    try:
        print(f"fan-out over {servers} role servers (processes), instant scripted model")
        for size in sizes:
            figures = await run(size, urls, work)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"  {size:5d} children: wall {figures['wall']:6.2f} s, "
                f"{size / figures['wall']:7.1f} children/s, "
                f"{figures['events'] / figures['wall']:7.1f} events/s, "
                f"orchestrator peak RSS {peak:6.1f} MiB"
            )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=3, help="role server processes")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[10, 100, 1000], help="fan-out sizes"
    )
    args = parser.parse_args()
    anyio.run(main, args.servers, args.sizes)
