"""A caller's quotas across role server replicas, behind a real HAProxy.

Three `a2a-orchestrator serve coder --db postgresql+asyncpg://... --callers F`
processes (a scripted model, the only fake) share a throwaway PostgreSQL
(`postgres.py`), HAProxy (deploy/haproxy.cfg) in front. The caller may run
two tasks at once: with two running, a third is refused by every replica,
however the balancer spread the first two; a replica SIGKILLed while holding
a slot gives it back within a lease.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
from support.deploy import REPLICAS, haproxy, local_config, needs_haproxy, wait_for_states
from support.ports import free_port
from support.postgres import Postgres
from support.replicas import role_replicas

pytestmark = [pytest.mark.anyio, needs_haproxy]

LEASE_SECONDS = 3
TOKEN = "quota-test-token"
WAIT_FOR_GO = "echo ran >> ran.log; while [ ! -e go ]; do sleep 0.05; done; echo went"
SCRIPT = [
    {
        "text": "Waiting.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": WAIT_FOR_GO}}],
    },
    {"text": "Went.\nTASK_DONE"},
]


async def send(url: str, text: str) -> dict[str, Any]:
    """SendMessage (returning at once) as the caller; the JSON-RPC reply."""
    message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}]}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": message, "configuration": {"returnImmediately": True}},
    }
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(url + "/", json=body, headers=headers)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


async def state_of(url: str, task_id: str) -> str:
    body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(url + "/", json=body, headers=headers)
    return str(response.json()["result"]["status"]["state"])


def refused(reply: dict[str, Any]) -> bool:
    error = reply.get("error")
    if error is None:
        assert "result" in reply, reply
        return False
    assert "quota exceeded: concurrent_tasks is 2" in error["message"], error
    return True


async def holder_of(database: str, context_id: str) -> str | None:
    conn = await asyncpg.connect(database)
    try:
        return await conn.fetchval(  # type: ignore[no-any-return]
            "SELECT holder FROM a2a_leases WHERE kind = 'conversation' AND key = $1",
            context_id,
        )
    finally:
        await conn.close()


RUNNING = {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}


def ran(work: Path) -> int:
    log = work / "ran.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


async def test_concurrent_tasks_hold_across_replicas_and_a_killed_replicas_slot_returns(
    postgres: Postgres, tmp_path: Path
) -> None:
    database = postgres.database("quotas")
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    callers = tmp_path / "callers.toml"
    callers.write_text("[limits]\nconcurrent_tasks = 2\n")
    db_url = postgres.url(database, "postgresql+asyncpg")
    with (
        anyio.fail_after(55),
        role_replicas(
            REPLICAS,
            db_url,
            work,
            script,
            lease=LEASE_SECONDS,
            args=("--callers", str(callers)),
            env={"A2A_AUTH_TOKEN": TOKEN},
        ) as started,
    ):
        served = {r.name: (r.process, r.url) for r in started}
        port = free_port()
        stats = tmp_path / "stats.sock"
        config = tmp_path / "haproxy.cfg"
        ports = {name: int(url.rsplit(":", 1)[1]) for name, (_, url) in served.items()}
        config.write_text(local_config(port, ports, stats))
        with haproxy(config, tmp_path / "haproxy.log"):
            await wait_for_states(stats, dict.fromkeys(REPLICAS, "UP"))
            balancer = f"http://127.0.0.1:{port}"
            first = await send(balancer, "wait for go 1")
            second = await send(balancer, "wait for go 2")
            while ran(work) < 2:  # both commands started: two turns running
                await anyio.sleep(0.1)
            # A third, through the balancer and on each replica directly:
            # refused everywhere, wherever the first two run.
            third = await send(balancer, "wait for go 3")
            direct = [await send(url, "wait for go 3") for _, url in served.values()]

            tasks = [first["result"]["task"], second["result"]["task"]]
            holders = [await holder_of(postgres.url(database), t["contextId"]) for t in tasks]
            assert holders[0] is not None
            (victim,) = [name for name in REPLICAS if holders[0].startswith(name + "-")]
            process, _ = served[victim]
            process.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(process.wait)
            survivor = next(url for name, (_, url) in served.items() if name != victim)
            # The victim's slot stops counting once its lease runs out; until
            # then the caller is still at its limit.
            started = anyio.current_time()
            with anyio.fail_after(LEASE_SECONDS + 10):
                while refused(reply := await send(survivor, "wait for go 4")):
                    await anyio.sleep(0.25)
            waited = anyio.current_time() - started
            # The victim's turn is adopted and ends (counted while it runs).
            with anyio.fail_after(LEASE_SECONDS + 10):
                while (adopted := await state_of(survivor, tasks[0]["id"])) in RUNNING:
                    await anyio.sleep(0.25)
            (work / "go").touch()
    assert "result" in first and "result" in second
    assert refused(third)
    assert [refused(reply) for reply in direct] == [True, True, True]
    assert reply["result"]["task"]["status"]["state"] in RUNNING
    assert adopted == "TASK_STATE_COMPLETED"
    # Not at once: the slot came back with the lease's expiry, not before.
    assert waited > 1, waited
