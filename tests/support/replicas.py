"""Role server replicas on one PostgreSQL database, behind a real HAProxy:
`a2a-orchestrator serve coder --db postgresql+asyncpg://...` processes (a
scripted model, the only fake) sharing a throwaway PostgreSQL
(`postgres.py`); HAProxy runs deploy/haproxy.cfg in front of them
(`deploy.local_config`)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx

from support.deploy import REPLICAS, haproxy, local_config, wait_for_states
from support.ports import free_port
from support.postgres import Postgres

__all__ = [
    "LEASE_SECONDS",
    "Cluster",
    "Replica",
    "cluster",
    "lease_of",
    "ran",
    "role_replicas",
    "rpc",
    "served_at",
    "start_task",
    "state_on",
    "wait_for",
]

LEASE_SECONDS = 3
OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
}


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[str]
    url: str


@dataclass
class Cluster:
    balancer: str
    replicas: list[Replica]
    work: Path
    database: str

    def replica(self, holder: str) -> Replica:
        """The replica whose lease id is `holder` (ids start with the --replica-id)."""
        (found,) = [r for r in self.replicas if holder.startswith(r.name + "-")]
        return found

    def other_than(self, replica: Replica) -> Replica:
        return next(r for r in self.replicas if r is not replica)


@contextmanager
def replicas(
    db_url: str, work: Path, script: Path, env: Mapping[str, str] | None = None
) -> Iterator[list[Replica]]:
    """The deployment's replicas (`REPLICAS`), leased for `LEASE_SECONDS`."""
    with role_replicas(REPLICAS, db_url, work, script, lease=LEASE_SECONDS, env=env) as started:
        yield started


@asynccontextmanager
async def cluster(
    postgres: Postgres,
    tmp_path: Path,
    script: list[dict[str, Any]],
    env: Mapping[str, str] | None = None,
) -> AsyncIterator[Cluster]:
    """Three replicas on a new database behind HAProxy, sharing `work`."""
    database = postgres.database("replicas")
    work = tmp_path / "work"  # shared, like the compose file's `work` volume
    work.mkdir()
    script_file = tmp_path / "script.json"
    script_file.write_text(json.dumps(script))
    db_url = postgres.url(database, "postgresql+asyncpg")
    with replicas(db_url, work, script_file, env) as started:
        port = free_port()
        stats = tmp_path / "stats.sock"
        config = tmp_path / "haproxy.cfg"
        ports = {r.name: int(r.url.rsplit(":", 1)[1]) for r in started}
        config.write_text(local_config(port, ports, stats))
        with haproxy(config, tmp_path / "haproxy.log"):
            await wait_for_states(stats, dict.fromkeys(REPLICAS, "UP"))
            yield Cluster(
                balancer=f"http://127.0.0.1:{port}",
                replicas=started,
                work=work,
                database=postgres.url(database),
            )


async def rpc(url: str, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(url + "/", json=body, headers={"A2A-Version": "1.0"})
    assert response.status_code == 200, response.text
    reply = response.json()
    assert "result" in reply, reply
    return reply["result"]


async def start_task(url: str, text: str, context_id: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
    }
    if context_id:
        message["contextId"] = context_id
    result = await rpc(
        url, "SendMessage", {"message": message, "configuration": {"returnImmediately": True}}
    )
    task: dict[str, Any] = result["task"]
    return task


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not await predicate():
            await anyio.sleep(0.1)


async def lease_of(database: str, context_id: str) -> str | None:
    """The replica holding a context's lease (None: released)."""
    conn = await asyncpg.connect(database)
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT holder FROM a2a_leases WHERE kind = 'conversation' AND key = $1",
            context_id,
        )
    finally:
        await conn.close()


def ran(work: Path) -> int:
    log = work / "ran.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


async def state_on(url: str, task_id: str) -> str:
    task = await rpc(url, "GetTask", {"id": task_id})
    return str(task["status"]["state"])


def served_at(process: subprocess.Popen[str]) -> str:
    """The URL a starting server prints (its first lines); fails with its output."""
    assert process.stdout is not None
    seen = ""
    while line := process.stdout.readline():
        seen += line
        match = re.search(r"serving A2A at (http://\S+)", line)
        if match:
            return match.group(1)
    process.kill()
    raise AssertionError(seen + (process.stderr.read() if process.stderr else ""))


@contextmanager
def role_replicas(
    names: Sequence[str],
    db_url: str,
    work: Path,
    script: Path,
    *,
    lease: float,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[list[Replica]]:
    """Replicas of the coder role, started one after another (the first
    creates the tables: a2a-sdk's store does not guard creating them at
    once), stopped (SIGTERM, then SIGKILL) on the way out; `args` and `env`
    go to each."""
    environ = {**os.environ, **OFFLINE, "A2A_MODEL_SCRIPT": str(script), **(env or {})}
    started: list[subprocess.Popen[str]] = []
    replicas: list[Replica] = []
    try:
        for name in names:
            command = [
                *(sys.executable, "-m", "a2a_orchestrator.cli", "serve", "coder"),
                *("--port", "0", "--db", db_url, "--workdir", str(work)),
                *("--replica-id", name, "--lease-seconds", str(lease), *args),
            ]
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environ,
            )
            started.append(process)
            replicas.append(Replica(name=name, process=process, url=served_at(process)))
        yield replicas
    finally:
        for process in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
