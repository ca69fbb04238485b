"""Session leases: which orchestrator replica runs each session, and takeover.

Orchestrator replicas sharing a PostgreSQL store (`store_pg.PgStore`) run
each session on one replica at a time. The replica that opens a session
claims its lease (owner id, its URL, an expiry by the database's clock) and
renews every lease it holds every `seconds / 3`. A replica that dies stops
renewing: once the lease expires, another replica claims it and takes the
session over (`on_takeover`: open it and run crash recovery, `Session.recover`).

Contract:
- `claim(session_id)` before a session is opened here: it raises
  `SessionOwnedElsewhere` (naming the owner and its URL) while another
  replica holds a live lease. Requests are not forwarded; the error says
  where to send them.
- `release(session_id, hand_off=...)` when it closes: an idle session's
  lease is dropped (nothing to take over); a session closed with work left
  (the server stopping) is handed off: its lease expires at once.
- A lease this replica failed to renew in time may have been taken over:
  `on_lost` is told, and the session must stop running here.
- `run()` renews and takes over until cancelled (the server's lifespan).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid as uuidlib
from collections.abc import Awaitable, Callable

import anyio

from .errors import OrchestratorError
from .store_pg import PgStore

__all__ = ["LEASE_SECONDS", "Leases", "SessionOwnedElsewhere", "replica_id"]

logger = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
"""How long a lease lasts unrenewed: a dead replica's sessions move within this."""


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

    async def claim(self, session_id: str) -> None:
        lease = await self.store.claim_lease(session_id, self.owner, self.url, self.seconds)
        if lease.owner != self.owner:
            raise SessionOwnedElsewhere(session_id, lease.owner, lease.url, lease.expires_in)
        self.held.add(session_id)

    async def release(self, session_id: str, *, hand_off: bool) -> None:
        self.held.discard(session_id)
        with anyio.CancelScope(shield=True):
            await self.store.release_lease(session_id, self.owner, hand_off=hand_off)

    async def run(self) -> None:
        """Renew held leases and take over expired ones, every third of a lease."""
        async with anyio.create_task_group() as tg:
            while True:
                try:
                    await self._renew()
                    for lease in await self.store.expired_leases(self.owner):
                        if lease.session_id not in self._taking:
                            self._taking.add(lease.session_id)
                            tg.start_soon(self._take_over, lease.session_id)
                except OrchestratorError:
                    # The database is unreachable for now: our leases run
                    # down, and the next round (or another replica) acts.
                    logger.exception("renewing session leases failed")
                await anyio.sleep(self.seconds / 3)

    async def _renew(self) -> None:
        held = set(self.held)
        renewed = await self.store.renew_leases(self.owner, held, self.seconds)
        for session_id in held - renewed:
            if session_id in self.held:  # not released meanwhile
                self.held.discard(session_id)
                logger.warning("lost the lease of session %s: it stops here", session_id)
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
