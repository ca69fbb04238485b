"""Randomized SIGKILL trials: side effects at most once, nothing lost, nothing left over.

    python bench/trials.py [--trials 100] [--seed N] [--no-sandbox] [--races 3000] [--quick]

Each trial kills one process with SIGKILL at a random moment (before, during
or after a child's shell command) and recovers the way a user would:

- `orchestrator`: an orchestrator process (its own `python`, this file run
  as a worker) whose in-process child runs a command; it is killed, then a
  new Session of the same id recovers the child from the store.
- `role-server`: `a2a-orchestrator serve coder` running a remote child's
  command is killed and started again on the same port and task file; the
  orchestrator re-attaches, then sends a follow-up in the same context.

The command appends `start` to a file, sleeps, then appends `end`. Counted
after each trial (and a wait past the command's own time):

- lost: the child did not reach an end (a result, `failed`, `lost`) or the
  store still says `running`;
- re-run: the command started more than once;
- orphaned: a process tagged with one of the trial's tool-call markers is
  still alive, or an `end` was written after the kill with no `start` since
  (the killed run's command outlived it).

`--races N` also runs bench/races.py's confinement races (N per tool) and
adds their escapes. `--no-sandbox` runs commands without bubblewrap (the
operator's opt-out) so the journal's own clean-up is what is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from a2a_orchestrator.delegation import ChildConfig
from a2a_orchestrator.events import Done, Failed
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.network import AgentSpec, Network
from a2a_orchestrator.procs import marked_processes
from a2a_orchestrator.session import Session
from a2a_orchestrator.store import Store

COMMAND = "echo start >> runs.txt; sleep 1; echo end >> runs.txt"
SETTLE = 1.5
"""Seconds waited after recovery, past the command's own time."""


def script(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": COMMAND}}]}
    return {"text": "done"}


def local_network() -> Network:
    return Network.of(AgentSpec(name="coder", role="coder"))


async def worker(store_path: str, workdir: str) -> None:
    """The orchestrator process a trial kills."""
    model = ScriptedModel(script)
    async with Session(
        Store(store_path),
        workdir=workdir,
        network=local_network(),
        models=lambda name: model,
        session_id="trial",
    ) as session:
        child = await session.spawn(ChildConfig(role="coder", prompt="run"), child_id="c1")
        print("READY", flush=True)
        await child.wait()
        print("DONE", flush=True)
        await anyio.sleep_forever()


def _env(no_sandbox: bool, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    for name in ("A2A_MODEL_BASE_URL", "A2A_MODEL_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        env[name] = ""
    if no_sandbox:
        env["A2A_SANDBOX"] = "off"
    return env


def _markers(db: Path) -> list[str]:
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT marker FROM tool_calls")]
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()


def _count(runs: Path) -> tuple[int, int]:
    lines = runs.read_text().split() if runs.exists() else []
    return lines.count("start"), lines.count("end")


def _tally(
    outcome: Counter[str], runs: Path, db: Path, at_kill: tuple[int, int], settled: bool
) -> None:
    starts, ends = _count(runs)
    outcome["re-run"] += starts > 1
    outcome["lost"] += not settled
    survivors = [pid for m in _markers(db) for pid in marked_processes(m)]
    # An `end` written after the kill came from a process that outlived it.
    # An `end` written after the kill with no new `start` since came from the
    # killed run's command, which outlived it. (A run that first started after
    # the restart, the kill having come before the command, ends legitimately.)
    started_at_kill, ended_at_kill = at_kill
    outlived = ends > ended_at_kill and starts == started_at_kill > 0
    outcome["orphaned"] += bool(survivors) or outlived


async def orchestrator_trial(work: Path, delay: float, no_sandbox: bool) -> Counter[str]:
    outcome: Counter[str] = Counter()
    store_path = work / "o.db"
    runs = work / "runs.txt"
    process = subprocess.Popen(
        [sys.executable, __file__, "--worker", str(store_path), str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(no_sandbox),
    )
    try:
        assert process.stdout is not None
        await anyio.to_thread.run_sync(process.stdout.readline)
        await anyio.sleep(delay)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    at_kill = _count(runs)
    store = Store(store_path)
    model = ScriptedModel(script)
    settled = False
    try:
        with anyio.move_on_after(30):
            async with Session(
                store,
                workdir=work,
                network=local_network(),
                models=lambda name: model,
                session_id="trial",
            ) as session:
                for handle in await session.recover():
                    await handle.result()
                record = await store.get_child("c1")
                settled = record is not None and record.status in ("completed", "failed")
        await anyio.sleep(SETTLE)
    finally:
        store.close()
    _tally(outcome, runs, store_path, at_kill, settled)
    return outcome


def _serve(work: Path, port: int, db: Path, no_sandbox: bool) -> tuple[subprocess.Popen[str], str]:
    script_file = work / "script.json"
    call = {"name": "run_command", "arguments": {"command": COMMAND}}
    script_file.write_text(json.dumps([{"tool_calls": [call]}, {"text": "done"}]))
    argv = ["serve", "coder", "--port", str(port), "--db", str(db), "--workdir", str(work)]
    process = subprocess.Popen(
        [sys.executable, "-m", "a2a_orchestrator.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(no_sandbox, A2A_MODEL_SCRIPT=str(script_file)),
    )
    assert process.stdout is not None
    # Start-up lines (the sandbox's, the model's) come before the address.
    for line in process.stdout:
        match = re.search(r"serving A2A at (http://\S+)", line)
        if match is not None:
            return process, match.group(1)
    process.kill()
    raise RuntimeError("the role server did not start")


async def role_server_trial(work: Path, delay: float, no_sandbox: bool) -> Counter[str]:
    outcome: Counter[str] = Counter()
    db = work / "role.db"
    runs = work / "runs.txt"
    process, url = await anyio.to_thread.run_sync(_serve, work, 0, db, no_sandbox)
    port = int(url.rsplit(":", 1)[1])
    store = Store(work / "o.db")
    network = Network.of(AgentSpec(name="remote", role="coder", url=url))
    settled = False
    at_kill = (0, 0)
    try:
        with anyio.move_on_after(40):
            async with Session(store, workdir=work, network=network, lost_after=20) as session:
                handle = await session.spawn(ChildConfig(role="remote", prompt="run"))
                await anyio.sleep(delay)
                process.send_signal(signal.SIGKILL)
                process.wait()
                at_kill = _count(runs)
                process, _ = await anyio.to_thread.run_sync(_serve, work, port, db, no_sandbox)
                first = await handle.result()
                if isinstance(first, Failed):
                    # The user's follow-up in the same conversation.
                    await handle.send("go on")
                    await handle.result()
                settled = isinstance(await handle.result(), Done | Failed)
        await anyio.sleep(SETTLE)
    finally:
        store.close()
        process.send_signal(signal.SIGTERM)
        process.wait()
    _tally(outcome, runs, db, at_kill, settled)
    return outcome


async def run_trials(count: int, seed: int, no_sandbox: bool) -> Counter[str]:
    rng = random.Random(seed)
    totals: Counter[str] = Counter()
    for index in range(count):
        kind = rng.choice(["orchestrator", "role-server"])
        # From before the command starts to after it ended (it sleeps 1 s).
        delay = rng.uniform(0.0, 1.6)
        with tempfile.TemporaryDirectory() as tmp:
            trial = orchestrator_trial if kind == "orchestrator" else role_server_trial
            outcome = await trial(Path(tmp), delay, no_sandbox)
        totals.update({k: v for k, v in outcome.items() if v})
        totals[kind] += 1
        flags = " ".join(f"{k}" for k, v in outcome.items() if v) or "ok"
        print(f"trial {index + 1:3d} {kind:12s} kill at {delay:4.2f} s: {flags}", flush=True)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--races", type=int, default=0, help="confinement races per tool")
    parser.add_argument(
        "--quick", action="store_true", help="2 trials (seed 2: one of each kind): a smoke test"
    )
    parser.add_argument("--worker", nargs=2, metavar=("STORE", "WORKDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        anyio.run(worker, *args.worker)
        return
    if args.quick:
        args.trials, args.seed = 2, 2
    totals = anyio.run(run_trials, args.trials, args.seed, args.no_sandbox)
    escaped = 0
    if args.races:
        races = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).with_name("races.py")),
                "--trials",
                str(args.races),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        print(races.stdout, end="")
        found = re.search(r"(\d+) escaped", races.stdout.splitlines()[-1])
        escaped = int(found.group(1)) if found else -1
    print(
        f"SIGKILL trials: {args.trials} ({totals['orchestrator']} orchestrator, "
        f"{totals['role-server']} role server), sandbox {'off' if args.no_sandbox else 'on'}: "
        f"lost {totals['lost']}, re-run {totals['re-run']}, orphaned {totals['orphaned']}"
        + (f", escaped {escaped}" if args.races else "")
    )


if __name__ == "__main__":
    main()
