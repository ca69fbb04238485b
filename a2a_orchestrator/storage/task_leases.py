"""`Leases`: which replica runs each conversation of a role, in PostgreSQL.

Replicas of one role share a database (`replicas.py`). A replica takes a
conversation's lease (one row per A2A context: the task running in it, that
task's owner, the replica, when the lease expires) before a turn of it runs,
renews it every few seconds while the turn runs, and lets it go when the turn
ends. A row whose lease expired belongs to a replica that died (or lost the
database for longer than a lease): another replica takes it over, atomically,
and continues the task.

Expiry is judged by the database's clock (`now()`), so replicas on machines
whose clocks differ still agree on it. `turns` counts the turns taken in a
context by any replica: a replica that still holds a conversation in memory
learns from it whether another replica ran a turn since (its copy is stale).

Only PostgreSQL: the statements use its `ON CONFLICT`, `RETURNING` and
interval arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import bindparam, text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Claim", "Leases", "StaleLease"]

TABLE = "a2a_task_leases"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    context_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    replica TEXT,
    expires_at TIMESTAMPTZ,
    turns BIGINT NOT NULL DEFAULT 0
)
"""

_EXPIRES = "now() + :seconds * interval '1 second'"

_ACQUIRE = text(
    f"INSERT INTO {TABLE} AS l (context_id, task_id, owner, replica, expires_at, turns) "
    f"VALUES (:context_id, :task_id, :owner, :replica, {_EXPIRES}, 1) "
    "ON CONFLICT (context_id) DO UPDATE SET task_id = excluded.task_id, "
    "owner = excluded.owner, replica = excluded.replica, expires_at = excluded.expires_at, "
    "turns = l.turns + 1 "
    "WHERE l.replica IS NULL OR l.replica = :replica OR l.expires_at < now() "
    "RETURNING turns"
)

_ADOPT = text(
    f"UPDATE {TABLE} SET replica = :replica, expires_at = {_EXPIRES}, turns = turns + 1 "
    "WHERE context_id = :context_id AND replica IS NOT NULL AND replica <> :replica "
    "AND expires_at < now() RETURNING task_id, owner, turns"
)

_RENEW = text(
    f"UPDATE {TABLE} SET expires_at = {_EXPIRES} "
    "WHERE replica = :replica AND context_id IN :contexts RETURNING context_id"
).bindparams(bindparam("contexts", expanding=True))

_RELEASE = text(
    f"UPDATE {TABLE} SET replica = NULL, expires_at = NULL "
    "WHERE context_id = :context_id AND replica = :replica"
)

_EXPIRED = text(
    f"SELECT context_id, task_id, owner, replica FROM {TABLE} "
    "WHERE replica IS NOT NULL AND replica <> :replica AND expires_at < now() "
    "ORDER BY expires_at LIMIT :limit"
)

_HOLDER = text(
    f"SELECT replica FROM {TABLE} WHERE context_id = :context_id AND replica IS NOT NULL "
    "AND expires_at >= now()"
)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A lease taken: the turn count it gave (this turn included)."""

    turns: int
    """Turns taken in the context so far by any replica, this one included."""


@dataclass(frozen=True, kw_only=True)
class StaleLease:
    """An expired lease of another replica: its task needs an owner."""

    context_id: str
    task_id: str
    owner: str
    """The task's owner (the caller scope it is stored under)."""
    replica: str
    """The replica that held it."""


class Leases:
    """The lease table on `engine`, as replica `replica` takes and keeps leases."""

    def __init__(self, engine: AsyncEngine, replica: str, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("a lease lasts a positive number of seconds")
        self.engine = engine
        self.replica = replica
        self.seconds = seconds

    async def create(self) -> None:
        """Create the table (idempotent)."""
        async with self.engine.begin() as conn:
            await conn.execute(text(_SCHEMA))

    async def acquire(self, context_id: str, task_id: str, owner: str) -> Claim | None:
        """Take the context's lease for `task_id` (free, expired, or already
        this replica's); None while another replica holds it."""
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    _ACQUIRE,
                    {
                        "context_id": context_id,
                        "task_id": task_id,
                        "owner": owner,
                        "replica": self.replica,
                        "seconds": self.seconds,
                    },
                )
            ).first()
        return Claim(turns=int(row[0])) if row is not None else None

    async def adopt(self, lease: StaleLease) -> Claim | None:
        """Take over an expired lease of another replica; None if it was
        renewed, released or taken by a third replica meanwhile."""
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    _ADOPT,
                    {
                        "context_id": lease.context_id,
                        "replica": self.replica,
                        "seconds": self.seconds,
                    },
                )
            ).first()
        if row is None or row[0] != lease.task_id:
            return None
        return Claim(turns=int(row[2]))

    async def renew(self, context_ids: set[str]) -> set[str]:
        """Extend this replica's leases of `context_ids`; the ones still held."""
        if not context_ids:
            return set()
        async with self.engine.begin() as conn:
            rows = await conn.execute(
                _RENEW,
                {"replica": self.replica, "contexts": sorted(context_ids), "seconds": self.seconds},
            )
            return {str(row[0]) for row in rows}

    async def release(self, context_id: str) -> None:
        """Give the context's lease back (a no-op if another replica took it)."""
        async with self.engine.begin() as conn:
            await conn.execute(_RELEASE, {"context_id": context_id, "replica": self.replica})

    async def expired(self, limit: int = 32) -> list[StaleLease]:
        """Leases other replicas hold past their expiry, oldest first."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(_EXPIRED, {"replica": self.replica, "limit": limit})
            return [
                StaleLease(context_id=r[0], task_id=r[1], owner=r[2], replica=r[3]) for r in rows
            ]

    async def holder(self, context_id: str) -> str | None:
        """The replica holding the context's lease now (None: nobody, or a lease expired)."""
        async with self.engine.connect() as conn:
            row = (await conn.execute(_HOLDER, {"context_id": context_id})).first()
        return None if row is None or row[0] is None else str(row[0])
