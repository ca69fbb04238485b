"""The delegation interface: one way to hand work to a child, remote or local.

    Delegate (a transport)           ChildRun (one child, transport side)
    ├── LocalDelegate   in-process   ├── LocalRun    a Conversation here
    ├── RemoteDelegate  A2A/HTTP     ├── RemoteRun   an A2A task there
    └── MemoryDelegate  a function   └── MemoryRun   a handler's replies

Every transport implements exactly `Delegate.open(spec, config, *, child_id,
depth, resume)`; what differs between them (a local child's tools and
journal, a remote agent's client settings) is given to the transport when
it is made, and what only some runs have (an A2A task's identity, a budget
kept here) is read from `ChildRun`, whose members every run has. A
transport only knows how to play one turn of a child (`ChildRun.turn`),
emitting child events, and how to cancel, pause and resume it. Everything a
parent sees is in `ChildHandle`, written once for every transport: the event
log and its iterators, queued follow-ups, the status, the result, and the
sink that stores each event before anyone in memory hears of it.

Contract of `ChildHandle`:
- Its pump runs in a task group the owner (a `Session`) holds; dropping an
  events iterator never cancels the child.
- `events(start)` replays the log from `start`, then follows it live, and
  ends once the child is settled: its last event ends a turn and no turn is
  running or queued.
- `send(text)` continues the same conversation: now if the child is idle,
  after the running turn otherwise.
- `steer(text)` delivers exactly once, with no window: the running turn reads
  it if the transport says the turn still can (decided where the turn runs),
  otherwise it opens a turn of its own, right after the running one; steering
  a turn took but never read (it ended first) opens the next turn too.
- Input rows are stored before `send`/`steer` return when the child is idle
  or the text was steered; a follow-up queued behind a running turn is stored
  when its turn starts, so the store keeps the conversation's order. Each
  input is stored once, as `steer` or `input`.
- `cancel()` ends a running or waiting child as `Failed(reason="aborted")`;
  a finished child is left as it is. `terminate()` also makes the stop final:
  input is refused (`ControlError`) until `reinstate()`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeAlias

import anyio
from anyio.abc import TaskGroup

from ..errors import ControlError
from ..models.base import ChatMessage
from ..observe.tracing import ChildSpans
from ..runtime.budgets import Budget
from ..runtime.events import TERMINAL_KINDS, ChildEvent, Done, Failed, InputRequired
from ..runtime.pausing import selecting_rule
from ..runtime.records import RecordKind
from ..runtime.render import CANCELED_TEXT, INTERRUPTED_TEXT, NO_TERMINAL_TEXT
from .outbox import Outbox

if TYPE_CHECKING:
    from opentelemetry.context import Context

    from ..runtime.selectors import Selector  # selectors imports this module
    from .network import AgentSpec

__all__ = [
    "ChildConfig",
    "ChildHandle",
    "ChildRun",
    "ChildStatus",
    "Delegate",
    "Emit",
    "EventBatchSink",
    "EventSink",
    "IdentityListener",
    "Input",
    "Listener",
    "Publish",
    "Resume",
]

logger = logging.getLogger(__name__)

ChildStatus: TypeAlias = Literal["running", "input_required", "completed", "failed"]
Emit = Callable[[ChildEvent], Awaitable[None]]
Listener = Callable[["ChildHandle", ChildEvent], Awaitable[None]]
"""Called with each new event once it is stored (relay, delivery to the parent)."""
IdentityListener = Callable[[], Awaitable[None]]
"""Awaited when a run's A2A identity (`task_id`, `context_id`, `message_id`) changed."""
Publish = Callable[
    ["ChildHandle", ChildEvent, "Callable[[], Awaitable[None]] | None"], Awaitable[None]
]
"""Hands a stored event to the owner's watchers without waiting for them to
deal with it; the third argument, when given, is awaited once every watcher
has (a hold the run took at the event is released there, unless decided)."""
EventSink = Callable[["ChildHandle", "ChildEvent | Input"], Awaitable[bool]]
"""Called with each event, and each input given to the child, before the
handle publishes or acts on it; the session stores it there. False means the
event's uuid was recorded already (a replay), and it is dropped."""
EventBatchSink = Callable[["ChildHandle", Sequence[ChildEvent]], Awaitable[Sequence[bool]]]
"""Stores several events of one child in one transaction, in order; per
event, False when its uuid was recorded already. Given, the handle writes
its events behind the child (`outbox.py`)."""


@dataclass(frozen=True, kw_only=True)
class Input:
    """Input given to a child, as its handle hands it to the sink."""

    text: str
    kind: Literal[RecordKind.INPUT, RecordKind.STEER] = RecordKind.INPUT
    """`input` opens a turn (the child runs again); `steer` was taken by the
    running turn."""
    recorded: bool = False
    """Stored already when it was given; now it opens a turn, so only the
    child's status changes (running again)."""


class _Queued(NamedTuple):
    text: str | None
    """None continues an interrupted turn (crash recovery)."""
    recorded: bool
    """Its row is stored already (given while idle, or steering handed back)."""
    marked_running: bool = False
    """Its row also set the child's status running, and no turn can end
    before this one starts (it was given while idle, nothing queued): the
    turn need not write that status again."""


_CANCEL_GRACE = 15.0  # how long cancel() waits for the turn to end


@dataclass(frozen=True, kw_only=True)
class ChildConfig:
    """What a parent asks of a child (the agentik `SubAgentConfig`)."""

    role: str
    """Agent name or role; the network decides remote or in-process."""
    prompt: str
    """The task, the child's first user message."""
    system_prompt: str | None = None
    """Replaces the role's system prompt."""
    tools: tuple[str, ...] | None = None
    """A subset of the role's tools; None keeps the role's list."""
    model: str | None = None
    """Model name; None inherits the parent's model (local children)."""
    max_turns: int | None = None
    """Model calls per turn; None keeps the role's (10 unless the role says)."""
    timeout: float | None = None
    """Seconds per turn; None keeps the role's (60 unless the role says).
    0 means no time limit of the caller's own (cloop's zero timeout): an
    in-process child then runs without one, while a remote child keeps its
    role server's, since a caller over A2A may lower that limit, never lift it."""
    shared_context: tuple[ChatMessage, ...] = ()
    """Messages the child starts with. Empty: an isolated context (the default)."""
    budget: Budget | None = None
    """What the child and its own children may spend, over its whole life
    (`budgets.py`); it only narrows the role's, and is capped by what is left
    of the parent's. None: the role's (and the parent's remainder)."""
    network: bool | None = None
    """False: the child's commands get no network. Only ever narrows: True
    is refused (the network is the operator's to allow)."""
    workdir: str | None = None
    """A subdirectory of the session's work directory the child is confined
    to (relative, existing); in-process children only."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Free-form, stored with the child."""

    def overrides(self) -> dict[str, Any]:
        """The parts that change the role, as sent to a role server.

        Values are not checked here (`overrides.parse_overrides` does, for
        both transports); a value of the wrong kind is passed on as it is,
        so the check names it instead of seeing it mangled.
        """
        data: dict[str, Any] = {}
        if self.system_prompt is not None:
            data["system_prompt"] = self.system_prompt
        if self.tools is not None:
            # list("read_file") would be its letters.
            data["tools"] = self.tools if isinstance(self.tools, str) else list(self.tools)
        if self.model is not None:
            data["model"] = self.model
        if self.max_turns is not None:
            data["max_turns"] = self.max_turns
        # No limit is not sent: a role server refuses to have its own lifted.
        if self.timeout is not None and not self.unlimited:
            data["timeout"] = self.timeout
        if self.budget is not None:
            budget = self.budget
            data["budget"] = budget.as_dict() if isinstance(budget, Budget) else budget
        if self.network is not None:
            data["network"] = self.network
        if self.shared_context:
            context = self.shared_context
            data["shared_context"] = (
                [dict(m) if isinstance(m, dict) else m for m in context]
                if isinstance(context, list | tuple)
                else context
            )
        return data

    @property
    def unlimited(self) -> bool:
        """`timeout=0`: the caller sets no time limit (see `timeout`)."""
        value = self.timeout
        return isinstance(value, int | float) and not isinstance(value, bool) and value == 0

    def to_dict(self) -> dict[str, Any]:
        # Field by field, copying only what is mutable: every spawn stores
        # its config, and `asdict` deep-copied all of it.
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["metadata"] = copy.deepcopy(self.metadata) if self.metadata else {}
        if isinstance(self.budget, dict):
            data["budget"] = copy.deepcopy(self.budget)
        data["tools"] = list(self.tools) if self.tools is not None else None
        data["shared_context"] = [dict(m) for m in self.shared_context]
        if isinstance(self.budget, Budget):
            data["budget"] = self.budget.as_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChildConfig:
        data = dict(data)
        if data.get("tools") is not None:
            data["tools"] = tuple(data["tools"])
        data["shared_context"] = tuple(data.get("shared_context") or ())
        if isinstance(data.get("budget"), dict):
            data["budget"] = Budget.from_dict(data["budget"])
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class ChildRun(Protocol):
    """One child as a transport runs it."""

    @property
    def transport(self) -> str:
        """`local` or `remote`."""
        ...

    @property
    def model(self) -> str:
        """The model name, when the transport knows it."""
        ...

    @property
    def task_id(self) -> str:
        """The A2A task id (remote), or "" before the first turn / for local runs."""
        ...

    @property
    def context_id(self) -> str:
        """The A2A context id (remote; chosen when the child is opened), or ""."""
        ...

    @property
    def message_id(self) -> str:
        """The id of the message that opens (or opened) the child's newest A2A
        task (remote), or ""."""
        ...

    on_identity: IdentityListener | None
    """Set by the run's owner: awaited whenever the three ids above change
    (a message that opens a new task, before it is sent; the task's id, once
    the agent names it), so the owner stores them before anything depends on
    them. A run without an A2A identity never calls it."""

    async def turn(self, text: str | None, emit: Emit) -> Sequence[str]:
        """Play one turn, emitting its events; the last one ends the turn.

        `text=None` continues the turn in progress (after a restart: a
        local child resumes from its transcript, a remote one re-attaches).
        Returns the steering this turn accepted (`steer` said True) but never
        read because it ended first: the handle makes it the next turn's input.
        """
        ...

    async def cancel(self) -> None:
        """Stop the running turn; it then ends as `Failed(reason="aborted")`."""
        ...

    async def pause(self) -> None: ...

    async def resume(self) -> None: ...

    async def pause_on(self, rules: Mapping[str, Selector]) -> bool:
        """Replace the child's pause rules: from the event a rule selects
        until `pause()` confirms or `resume()` releases it, the child takes
        no step. False when the transport takes no rules (a peer without
        the action): it gets a plain pause, a step late."""
        ...

    async def steer(self, text: str) -> bool:
        """Offer input to the running turn, absorbed at its next step boundary.

        True when the turn takes it (it reads it, or hands it back from
        `turn`); False when the turn has already passed its last step
        boundary, so the text must become a turn of its own. Raises
        `DelegationError` when the child cannot be steered at all.
        """
        ...

    async def interrupt(self) -> None:
        """End the running turn (as aborted) but keep the conversation for more turns."""
        ...

    async def history(self) -> list[ChatMessage]:
        """The child's conversation as chat messages (its live context)."""
        ...

    async def budget_left(self) -> Budget | None:
        """What is left of the child's budget for its own children, its
        subtree's spend counted; None when no budget is kept here (none was
        set, or the child runs elsewhere and its own server keeps it)."""
        ...

    async def aclose(self) -> None:
        """Release what the run holds (connections); the child itself lives on."""
        ...


@dataclass(frozen=True, kw_only=True)
class Resume:
    """What the store kept of a child that is opened again (in a later
    session, or after a crash), as `Delegate.open` gets it."""

    entries: Sequence[str | ChildEvent] = ()
    """Its transcript (`records.transcript_entries`): the inputs it read, and its events."""
    last_input: str | None = None
    """The input that opened its last turn; None when none was stored."""
    turn_started: float | None = None
    """When that turn started (wall clock): a continued turn keeps its deadline."""
    task_id: str = ""
    context_id: str = ""
    message_id: str = ""
    """The child's stored A2A identity (see `ChildRun`)."""
    running: bool = True
    """The store says a turn may still run: the transport gets ready to go on
    with it now. False: the child is opened to be read (its result, its
    status); its agent is contacted only once it is given work."""
    finished: bool = False
    """Its last turn ended done or failed."""


class Delegate(Protocol):
    """A transport: opens child runs (the one method every transport has)."""

    async def open(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        depth: int = 1,
        resume: Resume | None = None,
    ) -> ChildRun:
        """Prepare the run of child `child_id`, playing agent `spec` as
        `config` asks; `depth` is how deep it is in the session's tree (1: a
        child of the top parent). A new child's first turn starts with
        `config.prompt`; with `resume`, the child goes on from what was
        stored (its conversation, its A2A task)."""
        ...


class ChildHandle:
    """What a parent holds for one child, the same for every transport."""

    def __init__(
        self,
        *,
        child_id: str,
        agent: str,
        role: str,
        run: ChildRun,
        sink: EventSink | None = None,
        sink_many: EventBatchSink | None = None,
        history: Sequence[ChildEvent] = (),
        status: ChildStatus = "running",
        parent_id: str = "",
        depth: int = 1,
        on_event: Publish | None = None,
        on_settled: Callable[[ChildHandle], None] | None = None,
        trace_context: Context | None = None,
    ) -> None:
        """`on_event` is handed each new event once stored (it must not wait
        for the watchers it passes it to); `on_settled` is told,
        synchronously, each time a turn has ended and the handle is idle.
        `trace_context`: where the child's span goes when it is spawned
        outside any span (its session's; `tracing.ChildSpans`)."""
        self.child_id = child_id
        self.agent = agent
        self.role = role
        self.run = run
        self.parent_id = parent_id
        self.depth = depth
        self._sink = sink
        self._outbox: Outbox | None = None
        if sink_many is not None:
            self._outbox = Outbox(
                lambda events: sink_many(self, events), self._deliver, self._notify
            )
        self._on_event = on_event
        self._on_settled = on_settled
        self._log: list[ChildEvent] = list(history)
        self._uuids = {event.uuid for event in history}
        self._changed = anyio.Event()
        self._pending: list[_Queued] = []
        # Held while an input is decided on and stored, and by the pump while
        # it takes the next input and stores it: rows are stored in the order
        # the conversation reads them, and a turn never starts on an input
        # whose row is still being written.
        self._inputs = anyio.Lock()
        self._active = False
        self._status: ChildStatus = status
        self._wake = anyio.Event()
        self._closed = False
        self._cancelling = False
        self._turn = 0
        self._interrupted_turn = -1
        self.paused = False
        """Held at its next step boundary by `pause()` until `resume()`."""
        self._pause_rules: dict[str, Selector] = {}
        self._rules_armed = False
        """The run took the pause rules: it holds itself at a matching event."""
        self._decisions = 0
        """How many times `pause()` or `resume()` was called: a hold taken at
        an event is released after its watchers only if none was called since."""
        self.error: Exception | None = None
        """What failed the child's last failed turn, when it was an exception
        (a `StoreError` when its events could not be stored)."""
        self.terminated = False
        """Stopped for good by `terminate()`: input is refused until `reinstate()`."""
        self.spans = ChildSpans(self, trace_context)

    # -- what the parent reads --------------------------------------------------

    @property
    def status(self) -> ChildStatus:
        return self._status

    @property
    def transport(self) -> str:
        return self.run.transport

    @property
    def settled(self) -> bool:
        """No turn running or queued, and the log ends a turn."""
        return not self._active and not self._pending and self._ends_turn()

    @property
    def log(self) -> Sequence[ChildEvent]:
        """Every event so far (a snapshot)."""
        return tuple(self._log)

    @property
    def last_terminal(self) -> ChildEvent | None:
        for event in reversed(self._log):
            if event.kind in TERMINAL_KINDS:
                return event
        return None

    def _ended_since(self, start: int) -> bool:
        """A turn-ending event was logged at or after `start` (this turn's)."""
        return any(e.kind in TERMINAL_KINDS for e in self._log[start:])

    def _ends_turn(self) -> bool:
        return bool(self._log) and self._log[-1].kind in TERMINAL_KINDS

    async def events(self, start: int = 0) -> AsyncIterator[ChildEvent]:
        """Replay from `start`, then follow live until the child is settled."""
        index = start
        while True:
            while index < len(self._log):
                yield self._log[index]
                index += 1
            if self.settled or self._closed:
                return
            changed = self._changed
            await changed.wait()

    async def wait(self) -> ChildEvent:
        """Wait until the child is settled; return the event that ended its last turn."""
        while not self.settled and not self._closed:
            await self._changed.wait()
        terminal = self.last_terminal
        if terminal is None:
            raise RuntimeError(f"child {self.child_id} closed before its first turn ended")
        return terminal

    async def result(self) -> Done | Failed | InputRequired:
        """The outcome of the child's last turn (waits for it)."""
        terminal = await self.wait()
        assert isinstance(terminal, Done | Failed | InputRequired)
        return terminal

    async def moved_on(self, outcome: ChildEvent) -> None:
        """Wait until `outcome` (an event of its log) is no longer the
        child's last event: a turn ended after it (a stop ends a waiting
        turn aborted), a new one started, or the handle closed."""
        while self._log[-1:] and self._log[-1] is outcome and not self._closed:
            await self._changed.wait()

    # -- what the parent does -----------------------------------------------------

    async def send(self, text: str) -> None:
        """A follow-up in the same conversation: a turn now if the child is
        idle (its input stored before this returns), else queued behind the
        running turn (stored when it starts)."""
        self._accepting_input()
        async with self._inputs:
            self._accepting_input()
            recorded = not self._active
            if recorded:
                await self._store(Input(text=text))
            # Idle with nothing queued: the turn this opens is the next one,
            # so the row says running from the input's own write until then.
            marked = recorded and not self._pending
            self._queue(_Queued(text, recorded, marked_running=marked))

    def given(self, text: str) -> None:
        """The child's first input, stored with its row by the spawner: its
        first turn, now."""
        self._accepting_input()
        self._queue(_Queued(text, recorded=True, marked_running=True))

    async def steer(self, text: str) -> Literal["steer", "turn"]:
        """Give the child `text` exactly once, and store it before returning:
        `steer` when the running turn takes it, `turn` when it opens a turn
        (the child is idle, or its turn has passed its last step boundary:
        then right after that turn)."""
        self._accepting_input()
        async with self._inputs:
            self._accepting_input()
            running = self._active
            if running and await self.run.steer(text):
                await self._store(Input(text=text, kind=RecordKind.STEER))
                return "steer"
            # A turn of its own. Refused by the running turn, it goes ahead
            # of follow-ups queued behind that turn (their rows are stored
            # when they start, so the store keeps this order too); given to
            # an idle child, behind inputs queued (and stored) before it.
            await self._store(Input(text=text))
            self._queue(_Queued(text, recorded=True), first=running)
            return "turn"

    def _accepting_input(self) -> None:
        if self._closed:
            raise RuntimeError(f"child {self.child_id} is closed")
        if self.terminated:
            raise ControlError(
                f"child {self.child_id} was terminated; it takes no messages until it is resumed"
            )

    async def _store(self, item: Input) -> None:
        if self._sink is not None:
            if self._outbox is not None:
                # Stored after what the child emitted before it, as it is read.
                await self._outbox.drain()
            await self._sink(self, item)

    def _queue(self, item: _Queued, *, first: bool = False) -> None:
        if first:
            self._pending.insert(0, item)
        else:
            self._pending.append(item)
        self._set_status("running")
        self._notify()

    def continue_turn(self) -> None:
        """Queue the continuation of an interrupted turn (crash recovery)."""
        self._queue(_Queued(None, recorded=False))

    async def cancel(self) -> bool:
        """Cancel a running or waiting child and wait (bounded) until it has
        ended; False when it had finished or is being cancelled already."""
        if self._cancelling:
            return False
        self.paused = False  # a cancelled turn is released from the pause gate too
        if self._active:
            self._cancelling = True
            self._pending.clear()
            try:
                await self.run.cancel()
                with anyio.move_on_after(_CANCEL_GRACE):
                    while self._active:
                        await self._changed.wait()
            finally:
                self._cancelling = False
            return True
        if self._pending or self._status == "input_required":
            self._pending.clear()
            await self.run.cancel()
            await self._fail(Failed(reason="aborted", message=CANCELED_TEXT))
            return True
        return False

    async def terminate(self) -> bool:
        """Stop the child for good: a running or waiting turn ends aborted
        (`cancel`), an idle one keeps its last result; from now on input is
        refused until `reinstate()`. True when a turn was stopped."""
        # First, so a message racing with the stop is refused, not run.
        self.terminated = True
        return await self.cancel()

    def reinstate(self) -> bool:
        """Take input again after `terminate()`; False when it was not terminated."""
        was, self.terminated = self.terminated, False
        return was

    async def pause(self) -> None:
        await self._decide(self.run.pause, paused=True)

    async def resume(self) -> None:
        await self._decide(self.run.resume, paused=False)

    async def _decide(self, send: Callable[[], Awaitable[None]], *, paused: bool) -> None:
        self._decisions += 1
        decision = self._decisions
        await send()
        # A decision taken while this one was answered came after it (a
        # pause at the match the resumed child ran to): the later one stands.
        if self._decisions == decision:
            self.paused = paused

    async def pause_on(self, rule_id: str, selector: Selector | None) -> None:
        """Set (None: drop) a pause rule: the child holds itself right after
        an event `selector` selects, before its next step, however long the
        event takes to reach the parent. A listener of that event confirms
        with `pause()` or releases with `resume()`; when none does, the
        handle releases it once the listeners are done (a supervisor's
        `pause_child` is the listener that confirms)."""
        if selector is None:
            if self._pause_rules.pop(rule_id, None) is None:
                return
        elif self._pause_rules.get(rule_id) == selector:
            return
        else:
            self._pause_rules[rule_id] = selector
        self._rules_armed = await self.run.pause_on(dict(self._pause_rules))

    def _held_by_rule(self, event: ChildEvent) -> bool:
        """The run may hold itself at `event` (a rule selects it; a turn's
        last event has no next step to hold)."""
        return self._rules_armed and selecting_rule(self._pause_rules, event) is not None

    async def interrupt(self) -> bool:
        """Stop the running turn, keep the conversation; False when no turn ran."""
        if not self._active:
            return False
        turn = self._turn
        self._interrupted_turn = turn  # this turn only; a queued one still runs
        self.paused = False  # the run resumes to end its turn
        await self.run.interrupt()
        with anyio.move_on_after(_CANCEL_GRACE):
            while self._active and self._turn == turn:
                await self._changed.wait()
        return True

    @property
    def running(self) -> bool:
        """A turn is in progress or queued."""
        return self._active or bool(self._pending)

    # -- the pump -----------------------------------------------------------------

    def start(self, task_group: TaskGroup) -> None:
        """Run the pump in the owner's task group (and write its events
        behind it there)."""
        if self._outbox is not None:
            self._outbox.attach(task_group)
        task_group.start_soon(self._pump, name=f"child {self.child_id}")

    async def _pump(self) -> None:
        try:
            while True:
                while not self._pending:
                    wake = self._wake
                    await wake.wait()
                await self._inputs.acquire()
                if not self._pending:
                    self._inputs.release()
                    continue  # cancelled while an input was being stored
                text, recorded, marked_running = self._pending.pop(0)
                self._active = True
                self._set_status("running")
                self._turn += 1
                self.error = None
                start = len(self._log)
                try:
                    try:
                        # Under the lock: no input given meanwhile is stored
                        # ahead of the one this turn reads first.
                        if text is not None and not marked_running:
                            await self._store(Input(text=text, recorded=recorded))
                    finally:
                        self._inputs.release()
                    interrupted = self._interrupted_turn == self._turn
                    if self._cancelling or interrupted:
                        # Stopped between taking the input and starting the
                        # turn, when the run had nothing yet to stop.
                        message = CANCELED_TEXT if self._cancelling else INTERRUPTED_TEXT
                        await self._fail(Failed(reason="aborted", message=message))
                        continue
                    with self.spans.turn(self._turn):
                        unread = await self.run.turn(text, self._emit)
                    if unread and not self._cancelling and not self.terminated:
                        # Steering the turn took but ended before reading:
                        # the next turn's input, ahead of queued follow-ups
                        # (its rows were stored during this turn).
                        self._pending[:0] = [_Queued(t, recorded=True) for t in unread]
                    if not self._ended_since(start):
                        await self._fail(Failed(reason="error", message=NO_TERMINAL_TEXT))
                except Exception as exc:  # contained: one child's failure is its own
                    logger.exception("child %s failed", self.child_id)
                    if not self._ended_since(start):
                        # One terminal event per turn: a failure after the
                        # turn's end does not unmake its result.
                        self.error = exc
                        message = f"{type(exc).__name__}: {exc}"
                        await self._fail(Failed(reason="error", message=message))
                finally:
                    self._active = False
                    self._notify()
                    if self.settled:
                        self.spans.settled()
                    if self._on_settled is not None and self.settled:
                        self._on_settled(self)
        finally:
            with anyio.CancelScope(shield=True):
                if self._outbox is not None:
                    await self._outbox.drain()
                await self.run.aclose()

    async def _emit(self, event: ChildEvent) -> None:
        # A replayed event (re-attach after a broken stream or a restart)
        # carries the uuid it had the first time.
        if event.uuid in self._uuids:
            return
        if self._outbox is not None:
            # Written behind the child, except what ends a turn or holds it:
            # those wait until they (and everything before them) are stored
            # and heard of, so a turn seen ended is seen whole.
            wait = event.kind in TERMINAL_KINDS or self._held_by_rule(event)
            await self._outbox.put(event, wait=wait)
            return
        # Shielded: an abort of the turn that emits this event must not tear
        # its recording apart (stored but not logged). Only the durable
        # append is: the watchers hear of the event from their own streams
        # (`on_event` does not wait for them), so a slow or failing watcher
        # never holds the child up.
        with anyio.CancelScope(shield=True):
            # Stored first: a crash after this line loses no result.
            fresh = self._sink is None or await self._sink(self, event)
            await self._deliver(event, fresh)
        if fresh:
            self._notify()

    async def _deliver(self, event: ChildEvent, fresh: bool) -> None:
        """An event once written (`fresh`), or found stored already (a replay)."""
        if not fresh:
            self._uuids.add(event.uuid)
            return
        self._record(event)
        if self._on_event is not None:
            await self._on_event(self, event, self._release_after(event))
        elif self._held_by_rule(event):
            await self.run.resume()  # nobody watches to decide on the hold

    def _record(self, event: ChildEvent) -> None:
        self._uuids.add(event.uuid)
        self._log.append(event)
        if isinstance(event, Done):
            self._set_status("completed")
        elif isinstance(event, Failed):
            self._set_status("failed")
        elif isinstance(event, InputRequired):
            self._set_status("input_required")

    def _release_after(self, event: ChildEvent) -> Callable[[], Awaitable[None]] | None:
        """What lets the run go on from a hold its pause rules put it in at
        `event`, once the watchers heard of it and none paused or resumed
        it (one failed, or its subscription went): it must not stay held."""
        if not self._held_by_rule(event):
            return None
        decisions = self._decisions

        async def release() -> None:
            if self._decisions == decisions and not self.paused and not self._closed:
                await self.run.resume()

        return release

    async def fail(self, exc: Exception) -> None:
        """End the child failed (reason `error`) because of `exc`, raised
        outside its turn (its first input could not be stored)."""
        self.error = exc
        await self._fail(Failed(reason="error", message=f"{type(exc).__name__}: {exc}"))

    async def _fail(self, event: Failed) -> None:
        """End the turn failed; when even that cannot be stored (its store
        fails), the handle still ends it failed here, in memory."""
        # Twice with an outbox: the failure may have shared its first
        # transaction with an event the store refused, and goes alone next.
        attempts = 2 if self._outbox is not None else 1
        for attempt in range(attempts):
            if self._outbox is not None and self._outbox.take_failure() is not None:
                # A batch of this turn's events was not written: the turn
                # fails all the same, and its failure is stored if it can be.
                logger.warning("child %s: some of its events could not be stored", self.child_id)
            try:
                await self._emit(event)
                return
            except Exception:
                if attempt + 1 < attempts:
                    continue
                logger.exception("child %s: its failure could not be stored", self.child_id)
                if event.uuid not in self._uuids:
                    self._record(event)
                    self._notify()

    def _set_status(self, status: ChildStatus) -> None:
        self._status = status

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()
        self._wake.set()
        self._wake = anyio.Event()

    def close(self) -> None:
        """Wake every waiter for good (the owner is shutting down)."""
        self._closed = True
        self.spans.close()
        self._notify()
