"""Leases: which replica runs a session or a conversation, in PostgreSQL.

One table (`a2a_leases`, `TABLE`) and one mechanism (`LeaseTable`) for both
kinds of replica: orchestrator replicas lease sessions (`kind` "session",
keyed by session id, with the URL the holder serves at; the renewal loop
and takeover are `session_leases.py`), role server replicas lease
conversations (`ConversationLeases`: "conversation", keyed by A2A context
id, with the task running in it and that task's owner). Through asyncpg,
the stores' one PostgreSQL driver (`database/postgres.py`).

Contract:
- A replica claims a lease before it runs the session or turn, renews the
  leases it holds every few seconds, and gives them back when done. A lease
  not renewed for its seconds belongs to a replica that died (or lost the
  database for longer than a lease): another replica takes it over,
  atomically (one statement: one replica wins).
- Expiry is judged by the database's clock (`clock_timestamp()`), so
  replicas on machines whose clocks differ still agree on it.
- `turns` counts the times the lease was taken (claimed free, or taken
  over): a replica that still holds a conversation in memory learns from it
  whether another replica ran a turn since (its copy is stale).
- Given back, a lease either frees the row (`holder` NULL: nothing to take
  over; the row keeps its count of turns) or is handed off (expired at
  once, still naming its holder: another replica takes it over now).
- A database error is a `StoreError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .database import Table
from .database.postgres import PgConnection, PgDatabase, Tx

__all__ = [
    "TABLE",
    "Claim",
    "ConversationLeases",
    "Lease",
    "LeaseTable",
    "StaleLease",
    "give_back_sql",
]

TABLE = Table(
    name="a2a_leases",
    columns=(
        "kind TEXT NOT NULL, key TEXT NOT NULL, holder TEXT, url TEXT NOT NULL DEFAULT '', "
        "task_id TEXT NOT NULL DEFAULT '', owner TEXT NOT NULL DEFAULT '', "
        "turns BIGINT NOT NULL DEFAULT 0, expires_at DOUBLE PRECISION, "
        "PRIMARY KEY (kind, key)"
    ),
    indexes=("CREATE INDEX IF NOT EXISTS a2a_leases_expiry ON a2a_leases (kind, expires_at)",),
)
"""The one leases table."""

_NOW = "extract(epoch from clock_timestamp())::float8"

_SELECT = (
    "SELECT key, holder, url, task_id, owner, turns, "
    f"expires_at - {_NOW} AS expires_in FROM a2a_leases"
)


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A lease as it stands."""

    key: str
    """The session id, or the A2A context id."""
    holder: str | None
    """The replica holding it; None: given back, free."""
    url: str = ""
    """Where the holder serves (a session's requests go there)."""
    task_id: str = ""
    owner: str = ""
    """The task's owner (the caller scope it is stored under)."""
    turns: int = 0
    expires_in: float | None = None
    """Seconds until it expires by the database's clock (negative: expired)."""

    @property
    def live(self) -> bool:
        return self.holder is not None and (self.expires_in or 0) > 0


def _lease(row: Any) -> Lease:
    return Lease(
        key=row["key"],
        holder=row["holder"],
        url=row["url"],
        task_id=row["task_id"],
        owner=row["owner"],
        turns=int(row["turns"]),
        expires_in=row["expires_in"],
    )


class LeaseTable:
    """The leases of one `kind` in `a2a_leases`, on one asyncpg connection."""

    def __init__(self, connection: PgConnection, kind: str) -> None:
        self.connection = connection
        self.kind = kind

    async def create(self) -> None:
        """Create the table (idempotent)."""
        await PgDatabase(self.connection).create(TABLE)

    async def claim(
        self,
        key: str,
        holder: str,
        seconds: float,
        *,
        url: str = "",
        task_id: str = "",
        owner: str = "",
        expired: bool = True,
    ) -> Lease:
        """Take the lease of `key` for `holder` (free, expired, or already
        its own: renewed) unless another holds a live one; the lease as it
        stands after (its holder says who won). Not `expired`: another
        holder's expired lease is not taken either (it awaits adoption)."""
        taken_when = f"l.holder IS NULL OR l.holder = excluded.holder OR l.expires_at < {_NOW}"
        if not expired:
            taken_when = "l.holder IS NULL OR l.holder = excluded.holder"

        async def claim(tx: Tx) -> Lease:
            await tx.execute(
                "INSERT INTO a2a_leases AS l (kind, key, holder, url, task_id, owner, turns, "
                f"expires_at) VALUES (?, ?, ?, ?, ?, ?, 1, {_NOW} + ?::float8) "
                "ON CONFLICT (kind, key) DO UPDATE SET holder = excluded.holder, "
                "url = excluded.url, task_id = excluded.task_id, owner = excluded.owner, "
                f"expires_at = excluded.expires_at, turns = l.turns + 1 WHERE {taken_when}",
                (self.kind, key, holder, url, task_id, owner, seconds),
            )
            row = await tx.fetchrow(_SELECT + " WHERE kind = ? AND key = ?", (self.kind, key))
            assert row is not None  # inserted or kept just now, in this transaction
            return _lease(row)

        return await self.connection.run(lambda tx: _in_transaction(tx, claim))

    async def take_over(self, stale: Lease, holder: str, seconds: float) -> Lease | None:
        """Take over `stale`, another holder's expired lease; None if it was
        renewed, given back or taken by a third replica meanwhile."""
        row = await self.connection.run(
            lambda tx: tx.fetchrow(
                f"UPDATE a2a_leases SET holder = ?, expires_at = {_NOW} + ?::float8, "
                "turns = turns + 1 WHERE kind = ? AND key = ? AND holder = ? "
                f"AND expires_at < {_NOW} RETURNING key, holder, url, task_id, owner, turns, "
                f"expires_at - {_NOW} AS expires_in",
                (holder, seconds, self.kind, stale.key, stale.holder),
            )
        )
        return _lease(row) if row is not None else None

    async def renew(self, holder: str, keys: Iterable[str], seconds: float) -> set[str]:
        """Extend `holder`'s leases of `keys`; the ones it still holds."""
        wanted = sorted(keys)
        if not wanted:
            return set()
        rows = await self.connection.run(
            lambda tx: tx.fetch(
                f"UPDATE a2a_leases SET expires_at = {_NOW} + ?::float8 "
                "WHERE kind = ? AND holder = ? AND key = ANY(?::text[]) RETURNING key",
                (seconds, self.kind, holder, wanted),
            )
        )
        return {row["key"] for row in rows}

    async def give_back(self, key: str, holder: str, *, hand_off: bool = False) -> None:
        """Give `holder`'s lease of `key` back: free it, or `hand_off`
        (expire it now: another replica takes it over at once). A no-op if
        another replica holds it."""
        if hand_off:
            sql = "UPDATE a2a_leases SET expires_at = 0 WHERE kind = ? AND key = ? AND holder = ?"
        else:
            sql = give_back_sql("?", "?", "?")
        await self.connection.run(lambda tx: tx.execute(sql, (self.kind, key, holder)))

    async def get(self, key: str) -> Lease | None:
        """The lease of `key` (None: never taken)."""
        row = await self.connection.run(
            lambda tx: tx.fetchrow(_SELECT + " WHERE kind = ? AND key = ?", (self.kind, key))
        )
        return _lease(row) if row is not None else None

    async def expired(self, holder: str, limit: int | None = None) -> list[Lease]:
        """Other holders' leases past their expiry (they need a new holder), oldest first."""
        sql = (
            _SELECT + " WHERE kind = ? AND holder IS NOT NULL AND holder <> ? "
            f"AND expires_at < {_NOW} ORDER BY expires_at"
        )
        params: list[Any] = [self.kind, holder]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        rows = await self.connection.run(lambda tx: tx.fetch(sql, params))
        return [_lease(row) for row in rows]


def give_back_sql(kind: str, key: str, holder: str) -> str:
    """The statement freeing `holder`'s lease of `key`, given the markers of
    its parameters: a task store gives a turn's lease back with the turn's
    end in one statement (`tasks/postgres.py`)."""
    return (
        "UPDATE a2a_leases SET holder = NULL, expires_at = NULL "
        f"WHERE kind = {kind} AND key = {key} AND holder = {holder}"
    )


async def _in_transaction(tx: Tx, fn: Any) -> Any:
    async with tx.conn.transaction():
        return await fn(tx)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A conversation's lease taken: the turn count it gave (this turn included)."""

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


class ConversationLeases:
    """A role server replica's conversation leases (`replicas.py`): one
    lease per A2A context, held by `replica` for `seconds` at a time."""

    def __init__(self, connection: PgConnection, replica: str, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("a lease lasts a positive number of seconds")
        self.table = LeaseTable(connection, "conversation")
        self.replica = replica
        self.seconds = seconds

    async def create(self) -> None:
        await self.table.create()

    async def acquire(self, context_id: str, task_id: str, owner: str) -> Claim | None:
        """Take the context's lease for `task_id` (free or already this
        replica's); None while another replica holds it, even expired: a dead
        replica's turn is adopted first (`adopt`), else taking its lease
        would leave that task working with nobody to adopt it."""
        lease = await self.table.claim(
            context_id, self.replica, self.seconds, task_id=task_id, owner=owner, expired=False
        )
        return Claim(turns=lease.turns) if lease.holder == self.replica else None

    async def adopt(self, stale: StaleLease) -> Claim | None:
        """Take over an expired lease of another replica; None if it was
        renewed, released or taken by a third replica meanwhile."""
        lease = Lease(key=stale.context_id, holder=stale.replica, task_id=stale.task_id)
        taken = await self.table.take_over(lease, self.replica, self.seconds)
        if taken is None or taken.task_id != stale.task_id:
            return None
        return Claim(turns=taken.turns)

    async def renew(self, context_ids: set[str]) -> set[str]:
        """Extend this replica's leases of `context_ids`; the ones still held."""
        return await self.table.renew(self.replica, context_ids, self.seconds)

    async def release(self, context_id: str) -> None:
        """Give the context's lease back (a no-op if another replica took it)."""
        await self.table.give_back(context_id, self.replica)

    async def expired(self, limit: int = 32) -> list[StaleLease]:
        """Leases other replicas hold past their expiry, oldest first."""
        return [
            StaleLease(
                context_id=lease.key,
                task_id=lease.task_id,
                owner=lease.owner,
                replica=lease.holder or "",
            )
            for lease in await self.table.expired(self.replica, limit)
        ]

    async def holder(self, context_id: str) -> str | None:
        """The replica holding the context's lease now (None: nobody, or a lease expired)."""
        lease = await self.table.get(context_id)
        return lease.holder if lease is not None and lease.live else None

    async def held_elsewhere(self, context_id: str) -> str | None:
        """The other replica holding the context's lease, live or expired
        (an expired one awaits adoption: its turn is not over); None when
        it is free or this replica's."""
        lease = await self.table.get(context_id)
        if lease is None or lease.holder in (None, self.replica):
            return None
        return lease.holder

    def close(self) -> None:
        self.table.connection.close()
