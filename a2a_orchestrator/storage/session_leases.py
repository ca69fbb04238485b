"""Session leases: which orchestrator replica runs each session, and takeover.

Orchestrator replicas sharing a PostgreSQL store (`store_pg.PgStore`) run
each session on one replica at a time. The replica that opens a session
claims its lease (owner id, its URL, an expiry by the database's clock; the
store's `leases`, the one leases table and mechanism, `leases.py`) and
renews every lease it holds every `seconds / 3`. A replica that dies stops
renewing: once the lease expires, another replica claims it and takes the
session over (`on_takeover`: open it and run crash recovery, `Session.recover`).

Contract:
- `claim(session_id)` before a session is opened here: it raises
  `SessionOwnedElsewhere` (naming the owner and its URL) while another
  replica holds a live lease. `elsewhere(session_id)` tells that URL
  before a request is handled, so the server forwards the request there
  (`orchestrator/forwarding.py`).
- `release(session_id, hand_off=...)` when it closes: an idle session's
  lease is dropped (nothing to take over); a session closed with work left
  (the server stopping) is handed off: its lease expires at once.
- A lease this replica failed to renew in time may have been taken over:
  `on_lost` is told, and the session must stop running here. That includes
  a replica cut off from the database (renewals failing or hanging): once
  a lease's last successful renewal is older than the lease less
  `margin(seconds)`, the session is stopped here without asking the
  database, before another replica can take it over.
- `run()` renews and takes over until cancelled (the server's lifespan).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid as uuidlib
from collections.abc import Awaitable, Callable

import anyio

from ..errors import OrchestratorError
from .store_pg import PgStore

__all__ = ["LEASE_SECONDS", "Leases", "SessionOwnedElsewhere", "margin", "replica_id"]

logger = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
"""How long a lease lasts unrenewed: a dead replica's sessions move within this."""


def margin(seconds: float) -> float:
    """How long before a lease could expire an unrenewed session stops here:
    time for it to stop before another replica may claim it."""
    return seconds / 5


def replica_id() -> str:
    """A new id for this process as a replica (host, pid, and a random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"


class SessionOwnedElsewhere(OrchestratorError):
    """The session runs on another live replica; send its requests there."""

    def __init__(self, session_id: str, owner: str, url: str, expires_in: float) -> None:
        super().__init__(
            f"session {session_id} is run by orchestrator replica {owner} at {url} "
            f"(its lease is renewed; it expires in {expires_in:.1f}s if that replica dies); "
            "send requests for this session there"
        )
        self.session_id = session_id
        self.owner = owner
        self.url = url


class Leases:
    """One replica's leases (see the module docstring)."""

    def __init__(
        self,
        store: PgStore,
        *,
        url: str,
        seconds: float = LEASE_SECONDS,
        owner: str | None = None,
        on_takeover: Callable[[str], Awaitable[None]],
        on_lost: Callable[[str], None],
    ) -> None:
        self.store = store
        self.url = url
        self.seconds = seconds
        self.owner = owner or replica_id()
        self.held: set[str] = set()
        self._on_takeover = on_takeover
        self._on_lost = on_lost
        self._taking: set[str] = set()
        self._renewed: dict[str, float] = {}
        """Held session -> when its last successful claim or renewal was
        sent (this process's clock): its lease lasts `seconds` from after then."""

    async def claim(self, session_id: str) -> None:
        sent = anyio.current_time()
        lease = await self.store.leases.claim(session_id, self.owner, self.seconds, url=self.url)
        if lease.holder != self.owner:
            raise SessionOwnedElsewhere(
                session_id, lease.holder or "", lease.url, lease.expires_in or 0.0
            )
        self.held.add(session_id)
        self._renewed[session_id] = sent

    async def elsewhere(self, session_id: str) -> str | None:
        """The URL of the other replica holding a live lease of the session
        (None: free, expired, or held here)."""
        if session_id in self.held:
            return None
        lease = await self.store.leases.get(session_id)
        if lease is None or not lease.live or lease.holder == self.owner or not lease.url:
            return None
        return lease.url if lease.url.rstrip("/") != self.url.rstrip("/") else None

    async def release(self, session_id: str, *, hand_off: bool) -> None:
        self.held.discard(session_id)
        self._renewed.pop(session_id, None)
        with anyio.CancelScope(shield=True):
            await self.store.leases.give_back(session_id, self.owner, hand_off=hand_off)

    async def run(self) -> None:
        """Renew held leases and take over expired ones, every third of a
        lease; stop the sessions whose leases ran down meanwhile."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_deadlines)
            while True:
                try:
                    # A database that hangs is as down as one that refuses.
                    with anyio.fail_after(self.seconds / 3):
                        await self._renew()
                        for lease in await self.store.leases.expired(self.owner):
                            if lease.key not in self._taking:
                                self._taking.add(lease.key)
                                tg.start_soon(self._take_over, lease.key)
                except (OrchestratorError, TimeoutError):
                    # The database is unreachable for now: our leases run
                    # down (`_watch_deadlines` stops their sessions in time),
                    # and the next round (or another replica) acts.
                    logger.exception("renewing session leases failed")
                await anyio.sleep(self.seconds / 3)

    async def _renew(self) -> None:
        held = set(self.held)
        sent = anyio.current_time()
        renewed = await self.store.leases.renew(self.owner, held, self.seconds)
        for session_id in renewed & self.held:
            self._renewed[session_id] = sent
        for session_id in held - renewed:
            if session_id in self.held:  # not released meanwhile
                self._lose(session_id, "lost the lease of session %s: it stops here")

    async def _watch_deadlines(self) -> None:
        """Stop each held session once its lease may run out within `margin`:
        another replica may take it over at expiry, reachable database or not."""
        while True:
            deadline = self.seconds - margin(self.seconds)
            now = anyio.current_time()
            for session_id, sent in list(self._renewed.items()):
                if session_id in self.held and now - sent >= deadline:
                    self._lose(
                        session_id,
                        "session %s: its lease was not renewed in time (the database is "
                        "unreachable); it stops here before another replica takes it over",
                    )
            earliest = min(self._renewed.values(), default=now)
            await anyio.sleep(max(earliest + deadline - now, 0.0) or self.seconds / 10)

    def _lose(self, session_id: str, why: str) -> None:
        self.held.discard(session_id)
        self._renewed.pop(session_id, None)
        logger.warning(why, session_id)
        self._on_lost(session_id)

    async def _take_over(self, session_id: str) -> None:
        try:
            logger.info("taking over session %s (its replica's lease expired)", session_id)
            await self._on_takeover(session_id)
        except SessionOwnedElsewhere:
            pass  # another replica took it first
        except Exception:
            logger.exception("taking over session %s failed", session_id)
        finally:
            self._taking.discard(session_id)
