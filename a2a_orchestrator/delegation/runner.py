"""The process that runs a session: its record in the store, its heartbeat, stop requests.

A session's *runner* is the process holding it open (`run`, `resume`,
`serve orchestrator`, or any program using `Session`). While the session is
open, its row in the store's `runners` table names that process (pid, host,
boot id, and start time in clock ticks since boot, so a reused pid never
matches) and carries a heartbeat refreshed every `HEARTBEAT` seconds; closing
the session marks the row ended. `a2a-orchestrator stop` reads the row to
tell a live runner, which must stop its own children, from a dead one, whose
children nobody runs (recording them aborted is then the truth).

Stopping a live runner (the store carries the request; the signal only wakes):

1. `stop` writes a fresh request id into the row, then sends `STOP_SIGNAL`
   when the row says the runner listens for it.
2. The runner's heartbeat task, woken by the signal or at its next beat, runs
   the session's stop (a cascading stop: its children end `aborted` through
   the normal path, recorded by the runner itself) and writes the request id
   back as confirmed.
3. `stop` waits, bounded, for the confirmation (or the runner's end) and for
   the children to settle, then reports what the store says.

`STOP_SIGNAL` is SIGUSR1, not SIGTERM: SIGTERM already means "shut down and
leave the children to be resumed" for `serve`, and SIGINT is Ctrl-C. It is
sent only to a process whose row says it listens (`stop_signal_listener()`
was active when the session opened), because SIGUSR1's default action would
kill any other process.

Contract: the heartbeat task runs in the session's task group (the session
owns and cancels it). The signal listener is owned by whoever enters
`stop_signal_listener()` (the CLI); it only wakes the runners registered
inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import logging
import os
import signal
import socket
import threading
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio

from ..storage.store import RunnerRecord, Store
from ..tools.procs import start_ticks

__all__ = [
    "HEARTBEAT",
    "STALE_AFTER",
    "STOP_SIGNAL",
    "Liveness",
    "Runner",
    "boot_id",
    "liveness",
    "stop_signal_listener",
]

logger = logging.getLogger(__name__)

HEARTBEAT = 2.0
"""Seconds between a runner's heartbeats (and its checks for a stop request)."""
STALE_AFTER = 10.0
"""A heartbeat older than this (five missed beats) no longer shows a live runner."""
STOP_SIGNAL = signal.SIGUSR1
"""What `stop` sends a runner that listens (see the module docstring)."""

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

# The wake-up callbacks of the runners opened inside `stop_signal_listener()`;
# None outside it (the process does not handle STOP_SIGNAL).
_wakers: contextvars.ContextVar[set[Callable[[], None]] | None] = contextvars.ContextVar(
    "a2a_orchestrator_stop_wakers", default=None
)


class Liveness(enum.StrEnum):
    """What a runner row says about its process, as seen from this process."""

    LIVE = "live"
    """This host, same boot, the pid with its recorded start time, heartbeat fresh."""
    ELSEWHERE = "elsewhere"
    """Another host (or container) with a fresh heartbeat: it cannot be checked or signalled."""
    HUNG = "hung"
    """This host and the process exists, but its heartbeat is stale (stopped or blocked)."""
    ENDED = "ended"
    """The process closed the session."""
    DEAD = "dead"
    """Gone: the pid is dead or reused, the host rebooted, or a remote heartbeat went stale."""


def boot_id() -> str:
    """This boot's id (a reboot changes it, and with it every start time); "" if unknown."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _alive(pid: int, ticks: int) -> bool:
    """Process `pid` runs (not a zombie) and started at `ticks`."""
    if pid <= 0 or not ticks or start_ticks(pid) != ticks:
        return False
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    state = raw[raw.rfind(b")") + 2 :][:1]
    return state not in (b"Z", b"X")


def liveness(record: RunnerRecord, now: float | None = None) -> Liveness:
    """Judge a runner row (see `Liveness`)."""
    if record.ended_at is not None:
        return Liveness.ENDED
    fresh = (time.time() if now is None else now) - record.heartbeat_at <= STALE_AFTER
    if record.host != socket.gethostname():
        return Liveness.ELSEWHERE if fresh else Liveness.DEAD
    if record.boot_id != boot_id() or not _alive(record.pid, record.start_ticks):
        return Liveness.DEAD
    return Liveness.LIVE if fresh else Liveness.HUNG


@contextlib.asynccontextmanager
async def stop_signal_listener() -> AsyncIterator[None]:
    """Handle `STOP_SIGNAL` while the block runs: it wakes every runner
    registered inside, which then reads its stop request.

    The handler is a plain callback on the event loop (the package runs on
    asyncio), so no task is needed and the block's exceptions pass through
    unwrapped.
    """
    if threading.current_thread() is not threading.main_thread():
        # Signals reach only the main thread's loop; runners opened here
        # record no signal and `stop` reaches them at their next heartbeat.
        yield
        return
    wakers: set[Callable[[], None]] = set()

    def wake_all() -> None:
        for wake in list(wakers):
            wake()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(STOP_SIGNAL, wake_all)
    token = _wakers.set(wakers)
    try:
        yield
    finally:
        _wakers.reset(token)
        loop.remove_signal_handler(STOP_SIGNAL)


class Runner:
    """This process's claim on one session: its row, heartbeat and stop requests.

    `on_stop` runs when a stop request arrives and returns how many children
    it stopped; the runner then confirms the request in the store.
    """

    def __init__(
        self, store: Store, session_id: str, on_stop: Callable[[], Awaitable[int]]
    ) -> None:
        self.store = store
        self.session_id = session_id
        self.token = uuidlib.uuid4().hex
        self._on_stop = on_stop
        self._wake = anyio.Event()
        self._handled: set[str] = set()
        self._wakers: set[Callable[[], None]] | None = None

    def wake(self) -> None:
        self._wake.set()

    async def register(self) -> None:
        """Record this process as the session's runner (replacing any earlier one)."""
        self._wakers = _wakers.get()
        now = time.time()
        await self.store.put_runner(
            RunnerRecord(
                session_id=self.session_id,
                token=self.token,
                pid=os.getpid(),
                host=socket.gethostname(),
                boot_id=boot_id(),
                start_ticks=start_ticks(os.getpid()),
                stop_signal=int(STOP_SIGNAL) if self._wakers is not None else 0,
                started_at=now,
                heartbeat_at=now,
            )
        )
        if self._wakers is not None:
            self._wakers.add(self.wake)

    async def beat(self) -> None:
        """Refresh the heartbeat and act on stop requests until cancelled."""
        while True:
            record = await self.store.update_runner(
                self.session_id, self.token, heartbeat_at=time.time()
            )
            if record is None:
                # Another process registered as this session's runner: its
                # row is not ours to refresh (and its requests not ours).
                return
            request = record.stop_request
            if request and request != record.stop_confirmed and request not in self._handled:
                self._handled.add(request)
                await self._stop(request)
            with anyio.move_on_after(HEARTBEAT):
                await self._wake.wait()
            self._wake = anyio.Event()

    async def _stop(self, request: str) -> None:
        try:
            stopped = await self._on_stop()
        except Exception:
            # Unconfirmed, `stop` reports that the runner did not confirm.
            logger.exception("stopping session %s failed", self.session_id)
            return
        # Shielded: the stop may end the session (a cancelled pipeline), and
        # the confirmation is what `stop` is waiting for.
        with anyio.CancelScope(shield=True):
            await self.store.update_runner(
                self.session_id, self.token, stop_confirmed=request, stopped=stopped
            )

    async def end(self) -> None:
        """Mark the row ended (the session closed); shielded, as it runs on the way out."""
        if self._wakers is not None:
            self._wakers.discard(self.wake)
        with anyio.CancelScope(shield=True):
            await self.store.update_runner(self.session_id, self.token, ended_at=time.time())
