"""`PgConnection` and `PgDatabase` on a real PostgreSQL (`tests/support/postgres.py`):
a connection whose migrations failed runs nothing on the unmigrated
database, and a grouped write's driver error is a `StoreError` as a read's is."""

from __future__ import annotations

import anyio
import pytest
from support.postgres import Postgres

from a2a_orchestrator.errors import StoreError
from a2a_orchestrator.storage.database.postgres import PgConnection, PgDatabase, Tx

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


async def test_a_grouped_write_refused_by_the_driver_is_a_store_error(postgres: Postgres) -> None:
    # asyncpg refuses a statement given the wrong number of arguments
    # before the server sees it (an InterfaceError, not a PostgresError): a
    # read raised it as a StoreError, a grouped write raised it raw.
    db = PgDatabase.open(postgres.url(postgres.database("driver_errors")), "store")

    async def insert(tx: Tx) -> None:
        await tx.execute("INSERT INTO t (x) VALUES (?)", [1, 2])

    try:
        with anyio.fail_after(30):
            await db.execute("CREATE TABLE t (x BIGINT)")
            with pytest.raises(StoreError, match="expects 1 argument"):
                await db.read(insert)
            with pytest.raises(StoreError, match="expects 1 argument"):
                await db.write(insert)
            assert await db.fetch("SELECT x FROM t") == []
    finally:
        db.close()
