"""CLI start-up: `a2a-orchestrator --help` and `status`, each a fresh process.

    python bench/startup.py [--runs 20] [--quick]

Runs the installed console script as a user would, interleaved (one of each
command per round, so load on the machine falls on both alike), and prints
wall and CPU time (user + system of the child) per command, min and median.
`status` reads a store with one session in it, made here first, so it does
the work it does for a user (open SQLite, list sessions, their children).
Also prints `python -c pass` on the same machine, the interpreter's own floor.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
from benchkit import machine_line

from a2a_orchestrator.storage.store import Store


def _command() -> list[str]:
    """The console script beside this interpreter, else `python -m` the CLI."""
    script = Path(sys.executable).with_name("a2a-orchestrator")
    if script.exists():
        return [str(script)]
    found = shutil.which("a2a-orchestrator")
    return [found] if found else [sys.executable, "-m", "a2a_orchestrator.cli"]


async def _make_store(path: Path) -> None:
    store = Store(path)
    try:
        await store.create_session("bench", title="a start-up bench session")
    finally:
        store.close()


def _timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one run of `argv` (which must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        store = where / "orchestrator.db"
        anyio.run(_make_store, store)
        cli = _command()
        variants = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "--help": [*cli, "--help"],
            "status": [*cli, "status", "--store", str(store)],
        }
        walls: dict[str, list[float]] = {name: [] for name in variants}
        cpus: dict[str, list[float]] = {name: [] for name in variants}
        os.environ.pop("PYTHONPROFILEIMPORTTIME", None)
        for _ in range(runs):
            for name, argv in variants.items():
                wall, cpu = _timed(argv, where)
                walls[name].append(wall)
                cpus[name].append(cpu)
    print(f"CLI start-up, {runs} runs each, interleaved (goal: <= 0.40 s)")
    print(f"machine: {machine_line()}")
    for name in variants:
        w, c = walls[name], cpus[name]
        print(
            f"{name:<15} wall min {min(w):6.3f} s  median {statistics.median(w):6.3f} s"
            f"   cpu min {min(c):6.3f} s  median {statistics.median(c):6.3f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command (20)")
    parser.add_argument("--quick", action="store_true", help="3 runs: a smoke test")
    args = parser.parse_args()
    main(3 if args.quick else args.runs)
