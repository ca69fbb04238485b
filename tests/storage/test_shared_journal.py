"""The replicas' tool-call journal (`journal.py`, shared) on a real
PostgreSQL: the journal's statements through asyncpg, row for row, and
recovery by conversation only."""

from __future__ import annotations

import anyio
import pytest
from support.postgres import Postgres

from a2a_orchestrator.models.base import ToolCall
from a2a_orchestrator.storage.database.postgres import PgDatabase
from a2a_orchestrator.storage.journal import ToolJournal

pytestmark = pytest.mark.anyio


async def test_calls_round_trip_and_recovery_closes_one_conversation_only(
    postgres: Postgres,
) -> None:
    db = PgDatabase.open(postgres.url(postgres.database("journal")), "tool-call journal")
    journal = ToolJournal(db, shared=True)
    try:
        with anyio.fail_after(60):
            await journal.create()
            await journal.create()  # idempotent
            ctx = journal.scoped("ctx-1")
            done = await ctx.started(ToolCall(id="c1", name="read_file", arguments={"path": "a"}))
            await ctx.finished(done)
            running = await ctx.started(
                ToolCall(id="c2", name="run_command", arguments={"command": "sleep 1"})
            )
            # A group that cannot be running (its start time cannot match):
            # recovery looks for it and signals nothing.
            await ctx.process(running, pgid=4_000_000, ticks=1)
            other = await journal.scoped("ctx-2").started(ToolCall(id="c3", name="x", arguments={}))

            open_rows = await journal.unfinished()
            started = await journal.started_calls("ctx-1")
            before = await journal.interrupted_calls("ctx-1")
            # No scope (a replica starting): nobody else's calls are closed.
            assert await journal.recover() == []
            recovered = await journal.recover("ctx-1")
            after = await journal.interrupted_calls("ctx-1")
            still_open = await journal.unfinished()
    finally:
        journal.close()

    assert {row.marker for row in open_rows} == {running, other}
    assert [(row.call_id, row.tool, row.arguments) for row in started] == [
        ("c1", "read_file", {"path": "a"}),
        ("c2", "run_command", {"command": "sleep 1"}),
    ]
    assert [row.marker for row in before] == [running]
    assert before[0].pgid == 4_000_000 and before[0].pgid_ticks == 1
    assert [row.marker for row in recovered] == [running]
    # Closed as interrupted, so it stays among the conversation's interrupted calls.
    assert [row.marker for row in after] == [running]
    assert [row.marker for row in still_open] == [other]
