"""`Session`: a parent's children, over the one delegation interface.

A session resolves each child through the network (remote or in-process),
opens it on the delegate of the agent's transport (`Delegate.open`, the
same call for every transport), records it in the store, and runs its
pump in the session's task group. Every child event is stored (with the
child's new status, in one transaction) before the handle publishes it.

Contract:
- `async with Session(...)` owns a task group; leaving it stops the pumps.
  Children still running stay `running` in the store: local ones resume from
  their transcripts and remote ones are re-attached by `recover()` in a later
  session of the same id (after a crash, the same holds).
- While open, the session records this process as its runner (`runner.py`)
  and keeps a heartbeat task in its task group; a stop request from
  `a2a-orchestrator stop` runs the stop listeners, then a cascading stop of
  every child (each ends `aborted`, recorded here).
- Watchers (`add_listener`, `relay`) hear each child event once it is
  stored, each from its own bounded stream read by a task of the session
  (`watchers.py`): the child waits for the store, never for a watcher.
- `spawn(config)` returns a `ChildHandle` at once; `spawn_child(config)` is
  the agentik shape: an async iterator of that child's events. Dropping the
  iterator does not cancel the child.
- Before a child exists its config is narrowed: by the spawn policy
  (`policy.py`; a denial raises `SpawnRefusedError`), then its budget by
  what is left of its parent's (a local parent's budget covers its subtree).
  The narrowed config is the one stored and sent, on either transport.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import math
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream

from ..errors import ConfigError, StoreError
from ..models.base import Model
from ..models.config import ModelSettings, resolve_model
from ..observe import tracing
from ..runtime.budgets import Budget, PriceTable, Spend
from ..runtime.conversation import Conversation
from ..runtime.events import (
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    MessageDelta,
    event_to_dict,
)
from ..runtime.factory import RoleRuntime
from ..runtime.records import RecordKind, transcript_entries
from ..storage.store import ChildRecord, Store
from ..tools import Sandbox, Tool, Workspace
from ..tools.sandbox import store_paths
from .base import (
    ChildConfig,
    ChildHandle,
    ChildRun,
    ChildStatus,
    Delegate,
    IdentityListener,
    Input,
    Listener,
    Resume,
)
from .network import AgentSpec, Network
from .policy import Policy, SpawnPolicy, SpawnRequest
from .questions import Questions
from .runner import Runner
from .transports import LocalDelegate, RemoteDelegate
from .transports.local import check_sandbox
from .watchers import Watchers

__all__ = ["RelayedEvent", "Session", "keep_out_of_git"]

logger = logging.getLogger(__name__)


class _State(enum.Enum):
    UNOPENED = "unopened"
    OPENED = "opened"
    CLOSED = "closed"


class Session:
    """A parent's run: its children, their transcripts, and their pumps."""

    def __init__(
        self,
        store: Store,
        *,
        workdir: str | Path = ".",
        network: Network | None = None,
        models: Callable[[str], Model] | None = None,
        session_id: str | None = None,
        parent_model: str | None = None,
        title: str = "",
        remote: RemoteDelegate | Callable[[], RemoteDelegate] = RemoteDelegate,
        delegates: Mapping[str, Delegate] | None = None,
        sandbox: Sandbox | None = None,
        policy: SpawnPolicy | Policy | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        """The session is given its transports, as an httpx client is given
        its transport, configured by whoever makes them: `remote`, the A2A
        one, is a `RemoteDelegate(lost_after=..., idle_probe=..., push=...)`
        its owner keeps (and closes), or a function that makes one for this
        session alone, called when the session opens and closed with it
        (default: `RemoteDelegate`, its defaults).
        `delegates`: transports by the agent transport they serve (`local`:
        agents without a URL, `remote`: agents with one), in place of the
        session's own; `{"local": MemoryDelegate(handler)}` plays every
        in-process agent with a function.
        `sandbox`: where local children's commands run (default:
        `Sandbox.from_env()`); the store is hidden from them. `policy`: the
        spawn policy (a `SpawnPolicy`, or one rule). `prices`: the price
        table local children's cost is computed with (default: `A2A_PRICES`)."""
        self.store = store
        self.network = network or Network.load()
        self.workspace = Workspace(Path(workdir))
        settings = ModelSettings.from_env() if models is None else None
        self.models = models or (lambda name: resolve_model(name, settings))  # type: ignore[arg-type]
        self.id = session_id or uuidlib.uuid4().hex
        self.title = title
        self.trace_id = uuidlib.uuid4().hex
        self.sandbox = (sandbox if sandbox is not None else Sandbox.from_env()).hiding(
            *(store_paths(store.path) if store.path is not None else ())
        )
        self.prices = prices if prices is not None else PriceTable.from_env()
        self.policy = policy if isinstance(policy, SpawnPolicy | None) else SpawnPolicy([policy])
        """The spawn policy every child goes through (None: as asked)."""
        self.local = LocalDelegate(
            self.workspace,
            models=self.models,
            parent_model=parent_model,
            runtime=RoleRuntime(
                sandbox=self.sandbox, prices=self.prices, spans=tracing.CONVERSATION_SPANS
            ),
            journal=store.journal,
            child_tools=self._child_tools,
            spent_below=self._spent_below,
            on_conversation=self._bind_nested,
        )
        self._remote: RemoteDelegate | None = None
        self._make_remote: Callable[[], RemoteDelegate] | None = None
        if isinstance(remote, RemoteDelegate):
            self._remote = remote  # its owner's: kept open after the session
        else:
            self._make_remote = remote
        self._delegates: dict[str, Delegate] = {"local": self.local}
        if self._remote is not None:
            self._delegates["remote"] = self._remote
        self._delegates.update(delegates or {})
        self._children: dict[str, ChildHandle] = {}
        self._watchers = Watchers()
        self._settle_listeners: list[Callable[[ChildHandle], None]] = []
        self._reopening: dict[str, anyio.Event] = {}
        self.nested_planes: dict[str, Any] = {}
        """Control planes of children that are parents themselves (depth > 1),
        by child id; their inbox is the child's conversation."""
        self.child_tools: ChildTools | None = None
        """Tools a local child gets besides its role's (its control plane's,
        when the nesting depth allows); set by the control plane."""
        self._state = _State.UNOPENED
        self._stack = contextlib.AsyncExitStack()
        self._tg: TaskGroup | None = None
        self._runner = Runner(store, self.id, self._stop_requested)
        self._stop_listeners: list[Callable[[], Coroutine[Any, Any, Any]]] = []
        self._trace_context: Any = None
        self.stop_requested = False
        """Whether `a2a-orchestrator stop` stopped this session."""
        self.questions = Questions()
        """Questions its root asks a person (`questions.py`), waiting for answers."""

    # -- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Session:
        if self._state is not _State.UNOPENED:
            raise RuntimeError(f"a session can be opened once (it is {self._state.value})")
        # No session starts that could not run its in-process agents' commands
        # (a subprocess probe, once per process, hence off the event loop).
        await anyio.to_thread.run_sync(check_sandbox, self.network.agents.values(), self.sandbox)
        await anyio.to_thread.run_sync(keep_out_of_git, self.workspace.root / ".a2a")
        if self.store.path is not None and self.store.path.parent.name == ".a2a":
            await anyio.to_thread.run_sync(keep_out_of_git, self.store.path.parent)
        await self.store.create_session(self.id, title=self.title)
        if "remote" not in self._delegates and self._make_remote is not None:
            self._remote = await self._stack.enter_async_context(self._make_remote())
            self._delegates["remote"] = self._remote
        await self._runner.register()
        # Current from here to the close: the owner's spans and the children's are under it.
        self._trace_context = self._stack.enter_context(tracing.session_span(self.id, self.title))
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._state = _State.OPENED
        self._tg.start_soon(self._runner.beat, name=f"session {self.id} heartbeat")
        self._watchers.start(self._tg)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state = _State.CLOSED
        for handle in self._children.values():
            handle.close()
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        try:
            await self._stack.__aexit__(exc_type, exc, tb)
        finally:
            await self._runner.end()

    def _opened(self) -> TaskGroup:
        if self._state is not _State.OPENED or self._tg is None:
            raise RuntimeError(f"the session is {self._state.value}; use it inside `async with`")
        return self._tg

    def start_soon(self, fn: Callable[[], Coroutine[Any, Any, Any]], name: str = "") -> None:
        """Run `fn` in the session's task group (it ends with the session)."""
        self._opened().start_soon(fn, name=name or None)

    @property
    def remote(self) -> RemoteDelegate:
        """The A2A transport: the one given, or the session's own once open."""
        if self._remote is None:
            raise RuntimeError(
                "the session has no RemoteDelegate (it is not open, or was given another)"
            )
        return self._remote

    @property
    def delegates(self) -> Mapping[str, Delegate]:
        """The transports children are opened on, by agent transport."""
        return dict(self._delegates)

    # -- stopping -------------------------------------------------------------------

    def add_stop_listener(self, listener: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Await `listener` when a stop request arrives, before the children
        are stopped (a pipeline stops starting passes, a parent its turn)."""
        self._stop_listeners.append(listener)

    async def stop_children(self) -> int:
        """Cancel every running child, deepest first (a cascading stop): each
        ends `aborted`. How many were stopped."""
        stopped = 0
        for handle in sorted(self._children.values(), key=lambda h: -h.depth):
            if await handle.cancel():
                stopped += 1
        return stopped

    async def _stop_requested(self) -> int:
        self.stop_requested = True
        running = {h.child_id for h in self._children.values() if h.running}
        for listener in list(self._stop_listeners):
            await listener()
        await self.stop_children()
        # Children a listener already cancelled count too: the request stopped them.
        return sum(1 for child_id in running if not self._children[child_id].running)

    # -- children -----------------------------------------------------------------

    @property
    def children(self) -> dict[str, ChildHandle]:
        """The children this session holds in memory, by child id."""
        return dict(self._children)

    async def spawn(
        self,
        config: ChildConfig,
        *,
        parent_id: str = "",
        task_id: str = "",
        child_id: str | None = None,
        depth: int = 1,
    ) -> ChildHandle:
        """Start a child and return its handle at once."""
        tg = self._opened()
        spec = self.network.resolve(config.role)
        child_id = child_id or uuidlib.uuid4().hex[:12]
        if child_id in self._children:
            raise ConfigError(f"child id {child_id!r} is taken")
        config = await self._narrowed(config, spec, parent_id)
        run = await self._delegate(spec).open(spec, config, child_id=child_id, depth=depth)
        # Identity before I/O: a remote task's context id and opening message
        # id, chosen when the run was opened, are stored with the row before
        # the first turn sends anything, so a crash at any point after leaves
        # what recovery needs to find the task again.
        record = ChildRecord(
            child_id=child_id,
            session_id=self.id,
            parent_id=parent_id,
            task_id=task_id,
            agent=spec.name,
            role=spec.role,
            model=config.model or "",
            status="running",
            transport=spec.transport,
            url=spec.url or "",
            trace_id=self.trace_id,
            config=config.to_dict(),
            depth=depth,
            created_at=time.time(),
            a2a_context_id=run.context_id,
            a2a_message_id=run.message_id,
        )
        refused: StoreError | None = None
        try:
            # The row and its first input in one transaction.
            first = (self.id, child_id, RecordKind.INPUT, {"text": config.prompt}, None)
            await self.store.append_events([first], new_child=record)
        except StoreError as exc:
            # Maybe only the input was refused (the child's own writes
            # fail): the row alone, and the child ends failed while its
            # spawner and its siblings go on. A row that cannot be written
            # either raises here, as it did before anything was stored.
            await self.store.add_child(record)
            refused = exc
        handle = self._hold(record, spec, run)
        if refused is not None:
            await handle.fail(refused)
        else:
            handle.given(config.prompt)
        handle.start(tg)
        return handle

    async def spawn_child(self, config: ChildConfig, **kwargs: Any) -> AsyncIterator[ChildEvent]:
        """The child's events as they come (agentik's `spawnChild`)."""
        handle = await self.spawn(config, **kwargs)
        async for event in handle.events():
            yield event

    async def child(self, child_id: str) -> ChildHandle:
        """A child of this session, reopened from the store if needed (one
        the store says is running has lost its runner: it resumes)."""
        handle = self._children.get(child_id)
        if handle is not None:
            return handle
        record = await self.store.get_child(child_id)
        if record is None or record.session_id != self.id:
            raise KeyError(child_id)
        return await self._reopen(record, resume=record.status == "running")

    async def recover(self, *, parent_id: str | None = None) -> list[ChildHandle]:
        """Resume or re-attach every child the store says is still running
        (only `parent_id`'s children, when given)."""
        self._opened()
        handles = []
        records = await self.store.list_children(
            session_id=self.id, parent_id=parent_id, statuses=["running"]
        )
        for record in records:
            if record.child_id not in self._children:
                handles.append(await self._reopen(record, resume=True))
        return handles

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` with every child's every event, once stored, from
        a task of its own (`watchers.py`); returns a function that removes it."""
        return self._watchers.add(listener)

    @contextlib.asynccontextmanager
    async def relay(self) -> AsyncIterator[MemoryObjectReceiveStream[RelayedEvent]]:
        """Every child event, tagged with its child, as a stream (what a UI shows)."""
        send, receive = anyio.create_memory_object_stream[RelayedEvent](math.inf)

        def forward(handle: ChildHandle, event: ChildEvent) -> None:
            send.send_nowait(RelayedEvent.of(handle, event))

        # A tap: the stream is the relay's own, read by whoever relays.
        remove = self._watchers.tap(forward)
        try:
            async with receive:
                yield receive
        finally:
            remove()
            send.close()

    def add_settle_listener(self, listener: Callable[[ChildHandle], None]) -> Callable[[], None]:
        """Call `listener` (synchronously) whenever a child's turn has ended."""
        self._settle_listeners.append(listener)
        return lambda: self._settle_listeners.remove(listener)

    def _settled(self, handle: ChildHandle) -> None:
        for listener in list(self._settle_listeners):
            listener(handle)

    def _child_tools(self, child_id: str, depth: int) -> Mapping[str, Tool]:
        return self.child_tools(child_id, depth) if self.child_tools is not None else {}

    def _bind_nested(self, child_id: str, conversation: Conversation) -> None:
        plane = self.nested_planes.get(child_id)
        if plane is not None:
            plane.inbox = conversation

    async def _relay(
        self,
        handle: ChildHandle,
        event: ChildEvent,
        after: Callable[[], Awaitable[None]] | None,
    ) -> None:
        await self._watchers.publish(handle, event, after)

    async def wait_all(self) -> dict[str, ChildEvent]:
        """Wait until every child is settled and the watchers have dealt with
        their events; their last turn's outcomes."""
        results: dict[str, ChildEvent] = {}
        for child_id, handle in list(self._children.items()):
            results[child_id] = await handle.wait()
        await self.drain()
        return results

    async def drain(self) -> None:
        """Wait until every watcher (listeners, supervisors, reactions, the
        delivery to parents) has dealt with every event stored so far: they
        run beside the children, so a child's result can be in before they
        have reacted to it."""
        await self._watchers.drained()

    # -- budgets and policy ---------------------------------------------------------

    async def _narrowed(self, config: ChildConfig, spec: AgentSpec, parent_id: str) -> ChildConfig:
        """The config the child gets: the policy's narrowing, then its budget
        capped by what is left of its parent's."""
        parent = self._children.get(parent_id) if parent_id else None
        if self.policy is not None:
            request = SpawnRequest(
                session_id=self.id,
                parent_id=parent_id,
                parent_role=parent.role if parent is not None else "",
                agent=spec,
                config=config,
            )
            config = await self.policy.apply(request)
        left = await self.budget_left(parent_id) if parent_id else None
        if left is not None:
            config = dataclasses.replace(config, budget=(config.budget or Budget()).narrow(left))
        return config

    async def budget_left(self, child_id: str) -> Budget | None:
        """What is left of a local child's budget for its own children (None:
        it has none, or is not a local child held here)."""
        handle = self._children.get(child_id)
        return await handle.run.budget_left() if handle is not None else None

    async def _spent_below(self, child_id: str) -> Spend:
        """What a child's own children (its whole subtree below it) spent."""
        return await self.store.descendants_usage(self.id, child_id)

    # -- internals ----------------------------------------------------------------

    def _delegate(self, spec: AgentSpec) -> Delegate:
        return self._delegates[spec.transport]

    def _spec_for(self, record: ChildRecord) -> AgentSpec:
        """The agent a stored child was opened on, as its row says (its
        token's variable from the network's agent of that name)."""
        known = self.network.agents.get(record.agent)
        return AgentSpec(
            name=record.agent or record.role,
            role=record.role,
            url=record.url or None,
            token_env=known.token_env if known is not None else None,
            push=known.push if known is not None else False,
        )

    async def _reopen(self, record: ChildRecord, *, resume: bool) -> ChildHandle:
        # Reopening awaits (the store, a remote card): callers racing for the
        # same child share the one handle instead of opening two runs.
        opening = self._reopening.get(record.child_id)
        if opening is not None:
            await opening.wait()
        existing = self._children.get(record.child_id)
        if existing is not None:
            return existing
        done = self._reopening[record.child_id] = anyio.Event()
        try:
            return await self._open_again(record, resume=resume)
        finally:
            del self._reopening[record.child_id]
            done.set()

    async def _open_again(self, record: ChildRecord, *, resume: bool) -> ChildHandle:
        tg = self._opened()
        stored = await self.store.events(self.id, child_id=record.child_id)
        entries = transcript_entries(stored)
        history = [entry for entry in entries if not isinstance(entry, str)]
        terminated = False
        last_input = None
        for item in stored:
            if item.kind == RecordKind.INPUT:
                last_input = item
            elif item.kind == RecordKind.CONTROL and item.payload.get("action") in _FINALITY:
                # A stop is final across restarts: the last terminate or
                # reinstate recorded decides whether the child takes input.
                terminated = item.payload["action"] == "terminate"
        kept = Resume(
            entries=entries,
            # The last input opened the turn a crash interrupted: sent again
            # if a remote agent never got it, and its time starts the turn's
            # deadline.
            last_input=str(last_input.payload.get("text", "")) if last_input else None,
            turn_started=last_input.created_at if last_input else record.created_at,
            task_id=record.a2a_task_id,
            context_id=record.a2a_context_id,
            message_id=record.a2a_message_id,
            # A child that is not resuming is answered from the store (its
            # result, its status): a remote agent is contacted only when it
            # is given work, so a finished child stays readable while its
            # server is down.
            running=resume,
            finished=record.status in ("completed", "failed"),
        )
        config = ChildConfig.from_dict(record.config)
        spec = self._spec_for(record)
        run = await self._delegate(spec).open(
            spec, config, child_id=record.child_id, depth=record.depth, resume=kept
        )
        handle = self._hold(record, spec, run, history)
        handle.terminated = terminated
        if resume and not handle.settled:
            handle.continue_turn()
        elif resume and history:
            # The last event ended a turn but the status did not follow (a
            # crash between the two is impossible in one transaction, but a
            # store written by an older version may show it): settle it now.
            await self.store.update_child(record.child_id, **_changes(history[-1]))
        handle.start(tg)
        return handle

    def _hold(
        self,
        record: ChildRecord,
        spec: AgentSpec,
        run: ChildRun,
        history: list[ChildEvent] | None = None,
    ) -> ChildHandle:
        """The handle of a child this session now holds (new or reopened)."""
        status: ChildStatus = record.status if record.status in _STATUSES else "running"  # type: ignore[assignment]
        handle = ChildHandle(
            child_id=record.child_id,
            agent=spec.name,
            role=spec.role,
            run=run,
            sink=self._sink,
            sink_many=self._sink_many,
            history=history or (),
            status=status,
            parent_id=record.parent_id,
            depth=record.depth,
            on_event=self._relay,
            on_settled=self._settled,
            trace_context=self._trace_context,
        )
        run.on_identity = self._identified(record.child_id, run)
        self._children[record.child_id] = handle
        return handle

    def _identified(self, child_id: str, run: ChildRun) -> IdentityListener:
        async def identified() -> None:
            # Stored before anything depends on it: a follow-up that opens a
            # new task in the child's context has its message id stored (and
            # the old task's id cleared) before it is sent, so recovery looks
            # for the new task, not the old one; a task's id once it is named.
            await self.store.update_child(
                child_id,
                a2a_task_id=run.task_id,
                a2a_context_id=run.context_id,
                a2a_message_id=run.message_id,
            )

        return identified

    async def _sink(self, handle: ChildHandle, item: ChildEvent | Input) -> bool:
        if isinstance(item, Input):
            # A new turn: the row says running again, so a crash during it is
            # recovered like the first turn's would be.
            running = {"status": "running", "completed_at": None}
            if item.recorded:
                await self.store.update_child(handle.child_id, **running)
            else:
                await self.store.append_event(
                    self.id,
                    item.kind,
                    {"text": item.text},
                    child_id=handle.child_id,
                    child_changes=running if item.kind == "input" else None,
                )
            return True
        # An event: its handle writes events behind it, so they come here
        # only when one is stored alone.
        [fresh] = await self._sink_many(handle, [item])
        return fresh

    async def _sink_many(self, handle: ChildHandle, events: Sequence[ChildEvent]) -> list[bool]:
        """Several events of one child in one transaction (`outbox.py`)."""
        entries = []
        changes: dict[str, Any] = {}
        for item in events:
            if isinstance(item, MessageDelta):
                continue  # live only: the whole message is stored with its `message` event
            entries.append((self.id, handle.child_id, item.kind, event_to_dict(item), item.uuid))
            changes.update(_changes(item))
        if changes and handle.run.model:
            changes["model"] = handle.run.model
        written = iter(
            await self.store.append_events(entries, child_changes=changes or None)
            if entries
            else ()
        )
        return [isinstance(item, MessageDelta) or next(written) is not None for item in events]


def keep_out_of_git(state: Path) -> None:
    """Make `state` (a `.a2a` directory) if missing, with a `.gitignore` of
    `*`, so the user's git repository never shows the stores, transcripts and
    artifacts in it. A directory that cannot be written is left as it is."""
    try:
        state.mkdir(mode=0o700, exist_ok=True)
        ignore = state / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
    except OSError:
        pass  # a read-only work directory: nothing is written there either


_STATUSES = ("running", "input_required", "completed", "failed")
# Control rows that make a child's stop final, or lift it.
_FINALITY = ("terminate", "reinstate")

ChildTools = Callable[[str, int], Mapping[str, Tool]]


@dataclass(frozen=True, kw_only=True)
class RelayedEvent:
    """A child event as the parent's stream carries it."""

    child_id: str
    parent_id: str
    agent: str
    role: str
    transport: str
    event: ChildEvent

    @classmethod
    def of(cls, handle: ChildHandle, event: ChildEvent) -> RelayedEvent:
        return cls(
            child_id=handle.child_id,
            parent_id=handle.parent_id,
            agent=handle.agent,
            role=handle.role,
            transport=handle.transport,
            event=event,
        )


def _changes(event: ChildEvent) -> dict[str, Any]:
    """The child row's new fields after an event that ends a turn."""
    if isinstance(event, Done):
        return {
            "status": "completed",
            "result": event.text,
            "reason": "",
            "completed_at": time.time(),
        }
    if isinstance(event, Failed):
        return {
            "status": "failed",
            "result": event.message,
            "reason": event.reason,
            "completed_at": time.time(),
        }
    if isinstance(event, InputRequired):
        return {"status": "input_required", "result": event.question}
    return {}
