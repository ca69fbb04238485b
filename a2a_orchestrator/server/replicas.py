"""Replicas of one role sharing a PostgreSQL database.

`serve ROLE --db postgresql+asyncpg://...` serves a `ReplicaExecutor`: the
role's executor, plus what lets N processes serve one role together.

- Reads and streams: the tasks live in a versioned store and every applied
  event in a2a-sdk's log (`tasks/cluster.py`), so any replica answers
  GetTask and ListTasks, and SubscribeToTask on a replica that does not run
  the task hears of each new event by notify and reads it from the log (the
  live events of the replica that does; `storage/tasks/notified.py`). The
  process's one listening connection runs as long as the executor.
- Leases (`leases.py`): a turn runs only under its conversation's lease,
  taken before the turn's first write and renewed every `poll` seconds while
  it runs; it is given back by the save that stores the turn's end, in the
  same statement (`PgTaskStore.hand_back`): given back before, a crash in
  between would leave the task working with nobody to adopt it. That save
  may come before the turn's execution returns (what follows the end writes
  nothing to the task). An end another replica wrote (a cancel) gives it
  back at the next renewal, a turn whose end's save failed within
  `_END_SAVE_LIMIT` seconds of its execution's return. A follow-up
  message on a replica that does not hold the conversation in memory (or
  whose copy is stale: another replica took a turn since) rebuilds it from
  the stored history, as a restarted server does. A message for a task whose
  turn runs on another replica waits for that turn to end (its lease given
  back, its end stored), then runs, as it queues on one server; a new task
  in such a context fails
  with the reason, like a busy context on one server.
- Cancel: CancelTask on any replica records CANCELED in the shared store
  (the SDK); the replica running the turn sees it within `poll` seconds
  (or at its next write, whichever comes first) and aborts the turn.
- Adoption: a lease not renewed for `lease` seconds is a dead replica's.
  Another replica takes it over (one wins: the update is atomic), closes the
  dead turn's open tool calls as interrupted (`journal.py`, shared; nothing is
  run again silently), rebuilds the conversation from the stored history
  and continues the task's turn where the history ends, through the SDK's
  own task machinery, so its events are stored and streamed as any other.

- Control: a pause, resume, interrupt, steer or `pause_on` sent to a
  replica that does not run the task's turn goes to the replica holding the
  context's lease (`storage/controls.py`, by notify), which applies it and
  answers; the sender answers its caller with that outcome.

What is not covered: a replica that stays alive but cannot reach the
database for longer than a lease is taken over while its turn may still run
(it aborts the turn as soon as it learns its lease is gone, on its next
renewal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from a2a.server.agent_execution import RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.owner_resolver import resolve_user_scope
from a2a.types import TaskState, UnsupportedOperationError
from anyio.abc import TaskGroup

from ..errors import ConfigError, StoreError
from ..protocol.wire import pause_rules_from_wire, pause_rules_to_wire
from ..runtime.selectors import Selector
from ..storage.controls import ControlMessage, ControlRelay
from ..storage.database.postgres import PgConnection, PgDatabase
from ..storage.journal import ToolJournal
from ..storage.leases import Claim, ConversationLeases, StaleLease
from ..storage.tasks.cluster import ClusterStores
from ..storage.tasks.notified import POLL
from ..storage.tasks.postgres import HandBack
from ..storage.tasks.sqlite import TaskOwner
from .executor import RoleExecutor

if TYPE_CHECKING:
    from a2a.server.cluster import VersionedTaskStore
    from a2a.server.request_handlers import DefaultRequestHandlerV2
    from a2a.server.tasks import TaskStore

    from .auth.quotas import Quotas

__all__ = ["DEFAULT_LEASE", "ReplicaExecutor", "ReplicaSettings"]

logger = logging.getLogger(__name__)

DEFAULT_LEASE = 15.0
"""Seconds a replica's lease outlives its last renewal (`A2A_LEASE_SECONDS`)."""

# How long a turn whose execution returned may wait for its task's first
# write before its lease goes back (the SDK failed to store it).
_END_SAVE_LIMIT = 10.0

EVENT_POLL = POLL
"""Default `ReplicaSettings.event_poll`: the SDK's own stream's interval."""

# How often a follow-up waiting for another replica's turn looks at its lease.
_WAIT_STEP = 0.2

_ENDED_STATES = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
}
_ADOPTABLE = {TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING}


@dataclass(frozen=True, kw_only=True)
class ReplicaSettings:
    """How one replica identifies itself and keeps its leases."""

    replica_id: str
    """This process's name in the lease table (unique per process)."""
    lease: float = DEFAULT_LEASE
    """Seconds a lease lasts unrenewed: how long a dead replica's tasks wait."""
    event_poll: float = EVENT_POLL
    """Seconds between a remote subscription's reads of the event log while
    this replica's notifications are down (`$A2A_EVENT_POLL_SECONDS`)."""

    @property
    def poll(self) -> float:
        """Seconds between renewals (and looks for cancels and dead leases)."""
        return min(1.0, self.lease / 3)

    @classmethod
    def from_env(
        cls, *, replica_id: str | None = None, lease: float | None = None
    ) -> ReplicaSettings:
        """`replica_id` and `lease`, else `$A2A_REPLICA_ID` and
        `$A2A_LEASE_SECONDS`, and `$A2A_EVENT_POLL_SECONDS`; the id always
        ends in something unique to this process, so a restarted replica
        never mistakes a dead one's leases for its own."""
        raw = os.environ.get("A2A_LEASE_SECONDS", "").strip()
        if lease is None:
            try:
                lease = float(raw) if raw else DEFAULT_LEASE
            except ValueError:
                raise ConfigError(f"$A2A_LEASE_SECONDS must be a number, got {raw!r}") from None
        if not lease > 0:
            raise ConfigError(f"the lease must last a positive number of seconds, got {lease:g}")
        raw = os.environ.get("A2A_EVENT_POLL_SECONDS", "").strip()
        try:
            event_poll = float(raw) if raw else EVENT_POLL
        except ValueError:
            raise ConfigError(f"$A2A_EVENT_POLL_SECONDS must be a number, got {raw!r}") from None
        if not event_poll > 0:
            raise ConfigError(f"$A2A_EVENT_POLL_SECONDS must be positive, got {event_poll:g}")
        name = replica_id or os.environ.get("A2A_REPLICA_ID", "").strip() or socket.gethostname()
        return cls(
            replica_id=f"{name}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
            lease=lease,
            event_poll=event_poll,
        )


class ReplicaExecutor(RoleExecutor):
    """A role's executor in one of several replicas (module docstring)."""

    def __init__(
        self, *args: Any, cluster: ClusterStores, settings: ReplicaSettings, **kwargs: Any
    ) -> None:
        """`RoleExecutor`'s arguments (its journal is the shared one), the
        replicas' `cluster` stores and this replica's `settings`."""
        # The journal and the leases on asyncpg, connections of their own to
        # the cluster's database (the task store has its own).
        url = cluster.url
        journal = ToolJournal(PgDatabase.open(url, "tool-call journal"), shared=True)
        super().__init__(*args, journal=journal, task_store=cluster.tasks, **kwargs)
        self.shared_journal = journal
        self.cluster = cluster
        self.settings = settings
        cluster.events.poll = settings.event_poll
        self.leases = ConversationLeases(
            PgConnection(url, "conversation leases"), settings.replica_id, settings.lease
        )
        self.relay = ControlRelay(
            PgConnection(url, "control relay"),
            cluster.notifier,
            settings.replica_id,
            self._apply_control,
        )
        self.handler: DefaultRequestHandlerV2 | None = None
        """The request handler adopted turns run through (`served_by`)."""
        self.quotas: Quotas | None = None
        """The callers' quotas: an adopted turn counts again (`served_by`)."""
        self._leased: dict[str, str] = {}
        """Context id -> the task whose turn runs here under its lease."""
        self._giving: dict[str, HandBack] = {}
        """Context id -> how the turn running here gives its lease back."""
        self._ending: dict[str, tuple[str, HandBack, float, str]] = {}
        """Context id -> (task id, lease hand-back, when execution returned,
        the task's owner) of a turn over whose end is not stored yet."""
        self._turns_seen: dict[str, int] = {}
        """Context id -> the turn count when this replica last took its lease."""
        self._adopting: dict[str, Claim] = {}
        """Task id -> the lease taken over for it, until its turn starts."""
        self._refused: dict[str, str] = {}
        self._tg: TaskGroup | None = None

    def served_by(
        self,
        handler: DefaultRequestHandlerV2,
        store: TaskStore | VersionedTaskStore,
        quotas: Quotas | None,
    ) -> TaskStore | VersionedTaskStore:
        """As `RoleExecutor.served_by`; it also continues dead replicas'
        turns through the handler's tasks."""
        self.handler = handler
        self.quotas = quotas
        return super().served_by(handler, store, quotas)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        await self.cluster.initialize()
        await self.leases.create()
        await self.shared_journal.create()
        try:
            async with (
                self.cluster.notifier.running(),
                self.relay.running(),
                super().running(),
                anyio.create_task_group() as tg,
            ):
                self._tg = tg
                tg.start_soon(self._keep_leases)
                try:
                    yield
                finally:
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            self.leases.close()
            self.relay.connection.close()
            await self.cluster.close()

    # -- a turn under its lease ------------------------------------------------

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        task = context.current_task
        context_id = task.context_id if task is not None else (context.context_id or "")
        owner = resolve_user_scope(context.call_context) if context.call_context else ""
        adopted = self._adopting.pop(task_id, None)
        if adopted is not None:
            claim: Claim | None = adopted
        elif context_id in self._leased:
            # A turn runs in this context here: the executor says it is busy.
            await super().execute(context, event_queue)
            return
        else:
            claim = await self.leases.acquire(context_id, task_id, owner)
        if claim is None and task is not None:
            # A follow-up while its context's turn runs on another replica:
            # queued behind that turn, as on one server.
            claim = await self._after_turn_elsewhere(context_id, task_id, owner)
            # The task as that turn left it, not as it stood when this message came.
            stored = await self.cluster.tasks.get(task_id, context.call_context)
            if stored is not None:
                context.current_task = stored.task
        if claim is None:
            holder = await self.leases.holder(context_id)
            self._refused[task_id] = (
                f"context {context_id} is busy: a turn runs in it on replica {holder}; "
                "wait for it to end, or use another context"
            )
            await super().execute(context, event_queue)
            return
        if self._turns_seen.get(context_id) != claim.turns - 1:
            # Another replica took a turn since this one last did: the copy
            # held here is stale; the store has the conversation.
            self._forget(context_id)
        self._turns_seen[context_id] = claim.turns
        if context_id not in self.held_contexts:
            # Rebuilt from the store: a dead holder's open calls are closed
            # first, so the model is told they were interrupted.
            await self.shared_journal.recover(context_id)
        self._leased[context_id] = task_id
        earlier = self._ending.pop(context_id, None)
        if earlier is not None:
            # An earlier turn's end not written yet: the lease is this turn's now.
            self.cluster.tasks.keep(earlier[0])
        hand_back = self.cluster.tasks.hand_back(task_id, context_id, self.settings.replica_id)
        self._giving[context_id] = hand_back
        ended = False
        try:
            await super().execute(context, event_queue)
            ended = True
        finally:
            del self._leased[context_id]
            del self._giving[context_id]
            if not ended:
                with anyio.CancelScope(shield=True):
                    await self._release(context_id, task_id)
            elif not hand_back.given:
                # Its end is not written yet: the save that writes it gives
                # the lease back (else the renewal loop does).
                self._ending[context_id] = (task_id, hand_back, time.monotonic(), owner)

    async def _after_turn_elsewhere(self, context_id: str, task_id: str, owner: str) -> Claim:
        """The context's lease, taken once the turn another replica runs in
        it has ended (its end stored, the lease given back; a dead holder's
        turn adopted and ended first). Nothing is written to the task
        before: the SDK stores this message on top of that turn's end. A
        task that turn ended for good (or a cancel did) takes no message,
        as on one server."""
        logger.info("task %s: its message waits for the turn running on another replica", task_id)
        while True:
            if await self.leases.held_elsewhere(context_id) is None:
                claim = await self.leases.acquire(context_id, task_id, owner)
                if claim is not None:
                    break
            await anyio.sleep(_WAIT_STEP)
        state = (await self.cluster.tasks.states({task_id})).get(task_id)
        if state in _ENDED_STATES:
            await self._release(context_id, task_id)
            raise UnsupportedOperationError(
                message=f"Task {task_id} is in terminal state: {TaskState.Name(state)} (its "
                "turn on another "
                "replica ended it while this message waited)"
            )
        return claim

    async def running_elsewhere(self, context_id: str) -> str | None:
        """The replica whose turn runs in `context_id`, if not this one."""
        if context_id in self._leased:
            return None
        return await self.leases.held_elsewhere(context_id)

    async def control_anywhere(
        self,
        task_id: str,
        context_id: str,
        action: str,
        text: str = "",
        rules: Mapping[str, Selector] | None = None,
    ) -> bool:
        """As `control`, and when the turn runs on another replica, there."""
        if self.control(task_id, action, text, rules=rules):
            return True
        holder = await self.running_elsewhere(context_id)
        if holder is None:
            return False
        wire = pause_rules_to_wire(rules or {})
        return await self.relay.send(holder, task_id, action, text, wire)

    def _apply_control(self, message: ControlMessage) -> bool:
        """A control message another replica relayed here (`storage/controls.py`)."""
        rules = pause_rules_from_wire(message.rules)
        return self.control(message.task_id, message.action, message.text, rules=rules)

    def _refusal(self, task_id: str) -> str:
        return self._refused.pop(task_id, "")

    async def _release(self, context_id: str, task_id: str) -> None:
        self._ending.pop(context_id, None)
        self.cluster.tasks.keep(task_id)
        try:
            await self.leases.release(context_id)
        except StoreError as exc:
            # It expires by itself; the task is over, so nobody adopts it.
            logger.warning("could not give back the lease of context %s: %s", context_id, exc)

    # -- the lease loop ----------------------------------------------------------

    async def _keep_leases(self) -> None:
        while True:
            await anyio.sleep(self.settings.poll)
            try:
                await self._tend()
            except (StoreError, OSError) as exc:
                logger.warning("lease upkeep failed (retried in %g s): %s", self.settings.poll, exc)

    async def _tend(self) -> None:
        for context_id, (_task, hand_back, _returned, _owner) in list(self._ending.items()):
            if hand_back.given:
                del self._ending[context_id]
        # A turn whose end is written gave its lease back (its execution
        # may not have returned yet): not renewed, not lost.
        held = {
            context_id: task_id
            for context_id, task_id in self._leased.items()
            if context_id in self._giving and not self._giving[context_id].given
        }
        kept = await self.leases.renew(set(held) | set(self._ending))
        for context_id, task_id in held.items():
            if context_id not in kept:
                self._abort(task_id, "lost", "this replica lost the task's lease to another")
        states = await self.cluster.tasks.states(
            [*held.values(), *(ending[0] for ending in self._ending.values())]
        )
        for task_id in held.values():
            if states.get(task_id) == TaskState.TASK_STATE_CANCELED:
                self._abort(task_id, "aborted", "canceled by request")
        for context_id, (task_id, hand_back, returned, owner) in list(self._ending.items()):
            if hand_back.given or hand_back.giving:
                continue
            state = states.get(task_id)
            # Ended by another replica's write (a cancel), or its end's save
            # failed: nothing gives the lease back but this. A task not
            # stored yet, or stored still running (the SDK's writes lag its
            # execution), keeps it, unless its end was not stored for
            # `_END_SAVE_LIMIT` seconds: that save failed, and the context is
            # free again as on one server (renewed, the lease would keep a
            # follow-up on another replica waiting for good).
            abandoned = state is None or state in _ADOPTABLE
            if not abandoned or time.monotonic() - returned > _END_SAVE_LIMIT:
                await self._release(context_id, task_id)
                if abandoned and self.quotas is not None:
                    # Its end's save would have freed its caller's slot.
                    await self.quotas.abandoned(owner, task_id)
        for lease in await self.leases.expired():
            claim = await self.leases.adopt(lease)
            if claim is not None and self._tg is not None:
                self._tg.start_soon(self._adopt, lease, claim)

    def _abort(self, task_id: str, reason: Any, message: str) -> None:
        conversation = self.conversation(task_id)
        if conversation is not None and conversation.running:
            conversation.abort(reason, message)

    async def _adopt(self, lease: StaleLease, claim: Claim) -> None:
        """Continue the turn a dead replica left running (module docstring)."""
        call_context = ServerCallContext(user=TaskOwner(lease.owner))
        try:
            stored = await self.cluster.tasks.get(lease.task_id, call_context)
            if self.handler is None or stored is None or stored.task.status.state not in _ADOPTABLE:
                await self._release(lease.context_id, lease.task_id)
                return
            logger.warning(
                "adopting task %s (context %s) from replica %s, whose lease expired",
                lease.task_id,
                lease.context_id,
                lease.replica,
            )
            self._adopting[lease.task_id] = claim
            if self.quotas is not None:
                await self.quotas.adopted(lease.owner, lease.task_id)
            # The SDK's own task machinery runs the turn (its events are
            # stored and streamed like a request's); no public call starts a
            # turn without a message, hence the registry.
            registry = self.handler._active_task_registry
            active = await registry.get_or_create(
                lease.task_id, call_context=call_context, create_task_if_missing=False
            )
            await active.enqueue_request(
                RequestContext(
                    call_context=call_context,
                    task_id=lease.task_id,
                    context_id=lease.context_id,
                    task=stored.task,
                )
            )
        except Exception:
            # Contained: one task's adoption failing must not stop the loop;
            # the lease expires again and another try follows.
            logger.exception("adopting task %s failed", lease.task_id)
            self._adopting.pop(lease.task_id, None)
