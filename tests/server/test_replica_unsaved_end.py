"""A turn whose end could not be stored gives its context's lease back.

One `serve coder --db postgresql+asyncpg://...` replica (a scripted model,
the only fake) on a throwaway PostgreSQL (`postgres.py`); the caller may
run one task at a time (its slot in the replicas' database). A trigger
refuses every write of the task that is not submitted or working, so the
save of the turn's end fails for real (a database error, as on a failover
or a full disk) and the task stays stored as working. The replica must
still give the context's lease back, as one server frees the context when
the turn's execution returns: renewed forever, it would hold every
follow-up sent to another replica waiting for good; and the caller's slot
goes with it, else it counts against the caller until the replica stops."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
from support.postgres import Postgres
from support.replicas import lease_of, ran, role_replicas

pytestmark = pytest.mark.anyio

SCRIPT = [
    {
        "text": "Working.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": "echo ran >> ran.log"}}],
    },
    {"text": "Done.\nTASK_DONE"},
]

TOKEN = "unsaved-end-token"


async def rpc(url: str, method: str, params: dict[str, Any]) -> Any:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(url + "/", json=body, headers=headers)
    reply = response.json()
    assert "result" in reply, reply
    return reply["result"]


async def slots(database: str) -> int:
    conn = await asyncpg.connect(database)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM a2a_quota_slots"))
    finally:
        await conn.close()


REFUSE_ENDS = """
CREATE FUNCTION refuse_ends() RETURNS trigger AS $$
BEGIN
    IF NEW.state NOT IN (1, 2) THEN
        RAISE EXCEPTION 'the test refuses the turn''s end';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER refuse_ends BEFORE UPDATE ON a2a_tasks
    FOR EACH ROW EXECUTE FUNCTION refuse_ends();
"""


async def test_a_turn_whose_end_save_failed_gives_its_lease_and_slot_back(
    postgres: Postgres, tmp_path: Path
) -> None:
    database = postgres.database("unsaved")
    url = postgres.url(database)
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    callers = tmp_path / "callers.toml"
    callers.write_text("[limits]\nconcurrent_tasks = 1\n")
    with (
        anyio.fail_after(60),
        role_replicas(
            ["coder-1"],
            postgres.url(database, "postgresql+asyncpg"),
            work,
            script,
            lease=3,
            args=("--callers", str(callers)),
            env={"A2A_AUTH_TOKEN": TOKEN},
        ) as (one,),
    ):
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(REFUSE_ENDS)
        finally:
            await conn.close()
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": "go"}]}
        params = {"message": message, "configuration": {"returnImmediately": True}}
        task = (await rpc(one.url, "SendMessage", params))["task"]
        while ran(work) < 1:
            await anyio.sleep(0.1)
        held_while_ending = await lease_of(url, task["contextId"])
        slots_while_ending = await slots(url)
        # The end's save is refused; the lease goes back once the replica
        # gives up waiting for it (`_END_SAVE_LIMIT`, then one renewal).
        with anyio.move_on_after(25):
            while await lease_of(url, task["contextId"]) is not None:
                await anyio.sleep(0.2)
        holder = await lease_of(url, task["contextId"])
        slots_after = await slots(url)
        state = (await rpc(one.url, "GetTask", {"id": task["id"]}))["status"]["state"]
    assert held_while_ending is not None
    assert slots_while_ending == 1
    assert state == "TASK_STATE_WORKING"  # the end was refused, as meant
    assert holder is None
    assert slots_after == 0
