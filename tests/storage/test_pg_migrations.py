"""`PgConnection`'s migrations on a real PostgreSQL (`tests/support/postgres.py`):
a connection whose migrations failed runs nothing on the unmigrated database."""

from __future__ import annotations

import anyio
import pytest
from support.postgres import Postgres

from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.storage.database.postgres import PgConnection, Tx

pytestmark = pytest.mark.anyio


async def test_a_failed_migration_is_tried_again_not_skipped(postgres: Postgres) -> None:
    # The second migration fails (its table's column type does not exist):
    # the first call fails with it, and so must the next, instead of running
    # on the connection opened for the first, whose migrations never applied.
    migrations = [
        ("1-ok", "CREATE TABLE fine (x BIGINT)"),
        ("2-broken", "CREATE TABLE broken (x NO_SUCH_TYPE)"),
    ]
    url = postgres.url(postgres.database("failed_migration"))
    connection = PgConnection(url, "store", migrations)

    async def tables(tx: Tx) -> list[str]:
        rows = await tx.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return sorted(r["tablename"] for r in rows)

    try:
        with anyio.fail_after(30):
            for _ in range(2):
                with pytest.raises(StoreError, match=r"(?i)no_such_type"):
                    await connection.run(tables)
    finally:
        connection.close()
