"""A turn whose end could not be stored gives its context's lease back.

One `serve coder --db postgresql+asyncpg://...` replica (a scripted model,
the only fake) on a throwaway PostgreSQL (`postgres.py`). A trigger refuses
every write of the task that is not submitted or working, so the save of
the turn's end fails for real (a database error, as on a failover or a full
disk) and the task stays stored as working. The replica must still give the
context's lease back, as one server frees the context when the turn's
execution returns: renewed forever, it would hold every follow-up sent to
another replica waiting for good.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import asyncpg
import pytest
from support.postgres import Postgres
from support.replicas import lease_of, ran, role_replicas, start_task, state_on

pytestmark = pytest.mark.anyio

SCRIPT = [
    {
        "text": "Working.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": "echo ran >> ran.log"}}],
    },
    {"text": "Done.\nTASK_DONE"},
]

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


async def test_a_turn_whose_end_save_failed_gives_its_lease_back(
    postgres: Postgres, tmp_path: Path
) -> None:
    database = postgres.database("unsaved")
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    with (
        anyio.fail_after(60),
        role_replicas(
            ["coder-1"], postgres.url(database, "postgresql+asyncpg"), work, script, lease=3
        ) as (one,),
    ):
        conn = await asyncpg.connect(postgres.url(database))
        try:
            await conn.execute(REFUSE_ENDS)
        finally:
            await conn.close()
        task = await start_task(one.url, "do it")
        while ran(work) < 1:
            await anyio.sleep(0.1)
        held_while_ending = await lease_of(postgres.url(database), task["contextId"])
        # The end's save is refused; the lease goes back once the replica
        # gives up waiting for it (`_END_SAVE_LIMIT`, then one renewal).
        with anyio.move_on_after(25):
            while await lease_of(postgres.url(database), task["contextId"]) is not None:
                await anyio.sleep(0.2)
        holder = await lease_of(postgres.url(database), task["contextId"])
        state = await state_on(one.url, task["id"])
    assert held_while_ending is not None
    assert state == "TASK_STATE_WORKING"  # the end was refused, as meant
    assert holder is None
