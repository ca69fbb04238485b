"""`QuotaSlots`: the turns each caller runs across a role's replicas, in PostgreSQL.

A caller's `concurrent_tasks` holds across replicas only if they count in
one place: one table (`a2a_quota_slots`), a row per running turn (`key`: an
admission until its task is saved running, then the task's id), naming the
replica that admitted it and expiring unless that replica renews it.

Contract:
- `take` admits in one transaction: under a per-caller advisory lock, one
  conditional INSERT (`... WHERE live count < limit RETURNING`) takes a
  slot or answers how many are taken. Two replicas admitting the same caller
  at once are serialised by the lock, so a limit of 2 gives 2, never 3.
- A slot ends when its turn does (`free`, from whichever replica stores the
  end, the one running the turn or the one a cancel reached). The replica
  renews its slots every few seconds (`renew`); a replica that dies
  (SIGKILL) stops renewing, and its slots stop counting once `seconds` pass,
  judged by the database's clock, like the leases (`leases.py`).
- A database error is a `StoreError`.
"""

from __future__ import annotations

from .database import Table
from .database.postgres import PgConnection, PgDatabase, Tx

__all__ = ["TABLE", "QuotaSlots"]

TABLE = Table(
    name="a2a_quota_slots",
    columns=(
        "owner TEXT NOT NULL, key TEXT NOT NULL, replica TEXT NOT NULL, "
        "expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (owner, key)"
    ),
    indexes=("CREATE INDEX IF NOT EXISTS a2a_quota_slots_replica ON a2a_quota_slots (replica)",),
)

_NOW = "extract(epoch from clock_timestamp())::float8"

# The first key of the per-caller advisory locks (the second: the caller's
# hash), apart from the migrations' one-key lock.
_LOCK_SPACE = 0x0A2A


class QuotaSlots:
    """One replica's view of the callers' slots (see the module docstring)."""

    def __init__(self, connection: PgConnection, replica: str, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("a slot lasts a positive number of seconds")
        self.connection = connection
        self.replica = replica
        self.seconds = seconds

    async def create(self) -> None:
        """Create the table (idempotent)."""
        await PgDatabase(self.connection).create(TABLE)

    async def take(self, owner: str, key: str, limit: int) -> int | None:
        """Take a slot of `owner` under `key` if fewer than `limit` are live:
        None when taken, else how many are live (the refusal's count)."""

        async def take(tx: Tx) -> int | None:
            async with tx.conn.transaction():
                await tx.execute(
                    "SELECT pg_advisory_xact_lock(?::int4, hashtext(?))", (_LOCK_SPACE, owner)
                )
                # Read after the lock: this statement's snapshot sees every
                # admission committed before it.
                row = await tx.fetchrow(
                    "INSERT INTO a2a_quota_slots AS s (owner, key, replica, expires_at) "
                    f"SELECT ?, ?, ?, {_NOW} + ?::float8 WHERE (SELECT count(*) FROM "
                    f"a2a_quota_slots WHERE owner = ? AND key <> ? AND expires_at > {_NOW}) < ? "
                    "ON CONFLICT (owner, key) DO UPDATE SET replica = excluded.replica, "
                    "expires_at = excluded.expires_at RETURNING key",
                    (owner, key, self.replica, self.seconds, owner, key, limit),
                )
                if row is not None:
                    return None
                live = await tx.fetchrow(
                    "SELECT count(*) AS n FROM a2a_quota_slots "
                    f"WHERE owner = ? AND expires_at > {_NOW}",
                    (owner,),
                )
                # Dead replicas' slots go while the lock is held anyway.
                await tx.execute(
                    f"DELETE FROM a2a_quota_slots WHERE owner = ? AND expires_at <= {_NOW}",
                    (owner,),
                )
                return int(live["n"]) if live is not None else limit

        return await self.connection.run(take)

    async def hold(self, owner: str, key: str) -> None:
        """Count a turn that runs whatever the limit (one adopted from a dead
        replica: it was admitted once already)."""
        await self.connection.run(
            lambda tx: tx.execute(
                "INSERT INTO a2a_quota_slots (owner, key, replica, expires_at) "
                f"VALUES (?, ?, ?, {_NOW} + ?::float8) ON CONFLICT (owner, key) DO UPDATE "
                "SET replica = excluded.replica, expires_at = excluded.expires_at",
                (owner, key, self.replica, self.seconds),
            )
        )

    async def move(self, owner: str, key: str, to: str) -> None:
        """Rename `owner`'s slot `key` to `to` (an admission becomes its
        task's slot); a no-op if there is no such slot."""

        async def move(tx: Tx) -> None:
            await tx.execute(
                "WITH gone AS (DELETE FROM a2a_quota_slots WHERE owner = ? AND key = ? "
                "RETURNING replica, expires_at) INSERT INTO a2a_quota_slots "
                "(owner, key, replica, expires_at) SELECT ?, ?, replica, expires_at FROM gone "
                "ON CONFLICT (owner, key) DO NOTHING",
                (owner, key, owner, to),
            )

        await self.connection.run(move)

    async def free(self, owner: str, key: str) -> None:
        """End `owner`'s slot `key` (a no-op if there is none)."""
        await self.connection.run(
            lambda tx: tx.execute(
                "DELETE FROM a2a_quota_slots WHERE owner = ? AND key = ?", (owner, key)
            )
        )

    async def renew(self) -> int:
        """Extend this replica's slots; how many it holds."""
        rows = await self.connection.run(
            lambda tx: tx.fetch(
                f"UPDATE a2a_quota_slots SET expires_at = {_NOW} + ?::float8 "
                "WHERE replica = ? RETURNING key",
                (self.seconds, self.replica),
            )
        )
        return len(rows)

    async def live(self, owner: str) -> int:
        """How many slots of `owner` count now (any replica's)."""
        row = await self.connection.run(
            lambda tx: tx.fetchrow(
                "SELECT count(*) AS n FROM a2a_quota_slots "
                f"WHERE owner = ? AND expires_at > {_NOW}",
                (owner,),
            )
        )
        return int(row["n"]) if row is not None else 0

    def close(self) -> None:
        self.connection.close()
