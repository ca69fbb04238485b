"""Randomized SIGKILL trials: side effects at most once, nothing lost, nothing left over.

    python bench/trials.py [--trials 100] [--seed N] [--kind orchestrator|role-server]
                           [--no-sandbox] [--races 3000] [--quick]

Each trial kills one process with SIGKILL at a random moment (before, during
or after a child's shell command) and recovers the way a user would:

- `orchestrator`: an orchestrator process (its own `python`, this file run
  as a worker) with two in-process children and two remote ones (one on
  each of two role servers, which stay up), each running a command; it is
  killed, then a new Session of the same id recovers the children from the
  store.
- `role-server`: `a2a-orchestrator serve coder` running a remote child's
  command is killed and started again on the same port and task file; the
  orchestrator re-attaches, then sends a follow-up in the same context.

The command appends `start` to a file (one per child), sleeps, then appends
`end`. Counted after each trial (and a wait past the command's own time):

- lost: a child did not reach an end (a result, `failed`, `lost`) or the
  store still says `running`;
- re-run: a child's command started more than once;
- orphaned: a process tagged with one of the trial's tool-call markers is
  still alive, or an `end` was written after the kill with no `start` since
  (the killed run's command outlived it);
- failed-done (orchestrator trials): a remote child ended `failed` while
  its task on the role server completed (GetTask reads it COMPLETED);
- twice: a child's store holds more than one result (`done` or `failed`)
  for its one turn (orchestrator trials).

`--races N` also runs bench/races.py's confinement races (N per tool) and
adds their escapes. `--no-sandbox` runs commands without bubblewrap (the
operator's opt-out) so the journal's own clean-up is what is measured.
"""

from __future__ import annotations

import argparse
import functools
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import GetTaskRequest, TaskState

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools.procs import marked_processes

COMMAND = "echo start >> runs.txt; sleep 1; echo end >> runs.txt"
SETTLE = 1.5
"""Seconds waited after recovery, past the command's own time."""
LOCAL = ("c1", "c2")
REMOTE = ("r1", "r2")
"""An orchestrator trial's children: in-process, and one on each role server."""


def script(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """An in-process child's model: its command writes the file named for
    the child (its prompt is `run ID`)."""
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        prompt = next(str(m["content"]) for m in messages if m["role"] == "user")
        command = COMMAND.replace("runs.txt", f"runs-{prompt.split()[-1]}.txt")
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]}
    return {"text": "done"}


def local_network(*remote_urls: str) -> Network:
    """The coder in process, and `r1`, `r2`... for the role servers at `remote_urls`."""
    remotes = [
        AgentSpec(name=name, role="coder", url=url)
        for name, url in zip(REMOTE, remote_urls, strict=False)
    ]
    return Network.of(AgentSpec(name="coder", role="coder"), *remotes)


async def worker(store_path: str, workdir: str, *remote_urls: str) -> None:
    """The orchestrator process a trial kills."""
    model = ScriptedModel(script)
    async with Session(
        Store(store_path),
        workdir=workdir,
        network=local_network(*remote_urls),
        models=lambda name: model,
        session_id="trial",
    ) as session:
        children = [
            await session.spawn(ChildConfig(role="coder", prompt=f"run {c}"), child_id=c)
            for c in LOCAL
        ]
        children += [
            await session.spawn(ChildConfig(role=r, prompt="run"), child_id=r) for r in REMOTE
        ]
        print("READY", flush=True)
        for child in children:
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
    outcome: Counter[str],
    runs: Mapping[str, Path],
    dbs: Sequence[Path],
    at_kill: Mapping[str, tuple[int, int]],
    unsettled: int,
) -> None:
    """Count a trial's children: `runs` is each child's command file,
    `at_kill` its (starts, ends) when the kill landed, for the children whose
    commands ran in the killed process (a remote child's command goes on
    when its orchestrator is killed: its role server lives)."""
    outlived = False
    for child, path in runs.items():
        starts, ends = _count(path)
        outcome["re-run"] += starts > 1
        if child not in at_kill:
            continue
        # An `end` written after the kill with no new `start` since came from
        # the killed run's command, which outlived it. (A run that first
        # started after the restart, the kill having come before the
        # command, ends legitimately.)
        started_at_kill, ended_at_kill = at_kill[child]
        outlived = outlived or (ends > ended_at_kill and starts == started_at_kill > 0)
    outcome["lost"] += unsettled
    survivors = [pid for db in dbs for m in _markers(db) for pid in marked_processes(m)]
    outcome["orphaned"] += bool(survivors) or outlived


async def _task_state(url: str, task_id: str) -> str:
    """The state of the task on the role server at `url`, by GetTask."""
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        try:
            task = await client.get_task(GetTaskRequest(id=task_id))
        finally:
            await client.close()
    return TaskState.Name(task.status.state)


async def _remote_ends(outcome: Counter[str], store: Store, urls: Mapping[str, str]) -> None:
    """Count the children that ended `failed` (and the remote ones among them
    whose task completed on their server) and those with two results."""
    for child in (*LOCAL, *urls):
        record = await store.get_child(child)
        ends = await store.events("trial", child_id=child, kinds=["done", "failed"])
        outcome["twice"] += len(ends) > 1
        if record is None or record.status != "failed":
            continue
        outcome["failed"] += 1
        url = urls.get(child)
        if url and record.a2a_task_id:
            state = await _task_state(url, record.a2a_task_id)
            outcome["failed-done"] += state == "TASK_STATE_COMPLETED"


async def orchestrator_trial(work: Path, delay: float, no_sandbox: bool) -> Counter[str]:
    outcome: Counter[str] = Counter()
    store_path = work / "o.db"
    runs = {c: work / f"runs-{c}.txt" for c in LOCAL} | {r: work / r / "runs.txt" for r in REMOTE}
    servers: list[subprocess.Popen[str]] = []
    urls: dict[str, str] = {}
    unsettled = len(runs)
    store: Store | None = None
    try:
        for name in REMOTE:
            (work / name).mkdir()
            db = work / name / "role.db"
            server, urls[name] = await anyio.to_thread.run_sync(
                _serve, work / name, 0, db, no_sandbox
            )
            servers.append(server)
        process = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(store_path), str(work), *urls.values()],
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
        at_kill = {child: _count(runs[child]) for child in LOCAL}
        store = Store(store_path)
        model = ScriptedModel(script)
        with anyio.move_on_after(40):
            async with Session(
                store,
                workdir=work,
                network=local_network(*urls.values()),
                models=lambda name: model,
                session_id="trial",
            ) as session:
                for handle in await session.recover():
                    await handle.result()
                records = await store.list_children(session_id="trial")
                unsettled = len(runs) - sum(
                    r.status in ("completed", "failed") for r in records if r.child_id in runs
                )
        await _remote_ends(outcome, store, urls)
        await anyio.sleep(SETTLE)
    finally:
        if store is not None:
            store.close()
        for server in servers:
            server.send_signal(signal.SIGTERM)
            server.wait()
    dbs = [store_path, *(work / r / "role.db" for r in REMOTE)]
    _tally(outcome, runs, dbs, at_kill, unsettled)
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
            async with Session(
                store,
                workdir=work,
                network=network,
                remote=functools.partial(RemoteDelegate, lost_after=20),
            ) as session:
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
    _tally(outcome, {"c1": runs}, [db], {"c1": at_kill}, 0 if settled else 1)
    return outcome


KINDS = ("orchestrator", "role-server")


async def run_trials(
    count: int, seed: int, no_sandbox: bool, kinds: Sequence[str] = KINDS
) -> Counter[str]:
    rng = random.Random(seed)
    totals: Counter[str] = Counter()
    for index in range(count):
        kind = rng.choice(list(KINDS))
        if kind not in kinds:
            # Drawn as in a run of both kinds (a seed gives the same kill
            # moments), played as the kind asked for.
            kind = kinds[0]
        # From before the command starts to after it ended (it sleeps 1 s).
        delay = rng.uniform(0.0, 1.6)
        with tempfile.TemporaryDirectory() as tmp:
            trial = orchestrator_trial if kind == "orchestrator" else role_server_trial
            outcome = await trial(Path(tmp), delay, no_sandbox)
        totals.update({k: v for k, v in outcome.items() if v})
        totals[kind] += 1
        totals["children"] += len(LOCAL) + len(REMOTE) if kind == "orchestrator" else 1
        flags = " ".join(k if v == 1 else f"{k} {v}" for k, v in outcome.items() if v) or "ok"
        print(f"trial {index + 1:3d} {kind:12s} kill at {delay:4.2f} s: {flags}", flush=True)
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kind", choices=KINDS, help="only trials of this kind (default: both)")
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--races", type=int, default=0, help="confinement races per tool")
    parser.add_argument(
        "--quick", action="store_true", help="2 trials (seed 2: one of each kind): a smoke test"
    )
    # STORE WORKDIR [ROLE_SERVER_URL...]
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        anyio.run(worker, *args.worker)
        return
    if args.quick:
        args.trials, args.seed = 2, 2
    kinds = (args.kind,) if args.kind else KINDS
    totals = anyio.run(run_trials, args.trials, args.seed, args.no_sandbox, kinds)
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
        f"{totals['role-server']} role server), {totals['children']} children, "
        f"sandbox {'off' if args.no_sandbox else 'on'}: "
        f"lost {totals['lost']}, re-run {totals['re-run']}, orphaned {totals['orphaned']}, "
        f"failed {totals['failed']} (while their task completed {totals['failed-done']}), "
        f"delivered twice {totals['twice']}" + (f", escaped {escaped}" if args.races else "")
    )


if __name__ == "__main__":
    main()
