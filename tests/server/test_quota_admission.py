"""An admission that fails after taking its slot gives the slot back.

A real PostgreSQL (`postgres.py`) holds the slots (`QuotaSlots`) and the
usage log (`PgUsageLog`), as on role server replicas. The usage log's write
that follows the slot's take is made to fail for real: its table is
dropped under it (a database error, as on a failover or a full disk).
"""

from __future__ import annotations

import anyio
import asyncpg
import pytest
from a2a.server.context import ServerCallContext
from support.postgres import Postgres

from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.server.auth.callers import Limits
from a2a_orchestrator.server.auth.quotas import Quotas
from a2a_orchestrator.server.auth.usage import PgUsageLog
from a2a_orchestrator.storage.database.postgres import PgConnection
from a2a_orchestrator.storage.quota_slots import QuotaSlots
from a2a_orchestrator.storage.tasks.sqlite import TaskOwner

pytestmark = pytest.mark.anyio


async def test_an_admission_whose_usage_write_fails_leaves_no_slot(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("admission"))
    slots = QuotaSlots(PgConnection(url, "quota slots"), "replica-a", 30.0)
    usage = PgUsageLog(url)
    quotas = Quotas(lambda _owner: Limits(concurrent_tasks=1), usage, slots=slots)
    context = ServerCallContext(user=TaskOwner("alice"))
    try:
        with anyio.fail_after(30):
            await slots.create()
            await usage.rows()  # its table, created
            conn = await asyncpg.connect(url)
            try:
                await conn.execute("DROP TABLE caller_usage")
            finally:
                await conn.close()
            with pytest.raises(StoreError):
                async with quotas.admitted(context):
                    pytest.fail("admitted though its usage could not be written")
            live = await slots.live("alice")
            # Renewed with this replica's others, a leaked slot would count forever.
            await slots.renew()
            renewed = await slots.live("alice")
    finally:
        usage.close()
        slots.close()
    assert (live, renewed) == (0, 0)
    assert quotas.running("alice") == 0
