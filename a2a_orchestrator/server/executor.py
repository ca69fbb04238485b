"""`RoleExecutor`: a role's conversations behind a2a-sdk's request handler.

One conversation per A2A context: the first message of a context starts it
(isolated: it sees no other context), a follow-up on the same task or a new
task in the same context continues it. The conversation is kept in memory
while it lives and is rebuilt from the stored tasks of its context when the
server restarted meanwhile.

Pause rules: a turn's message (`PAUSE_ON_KEY` metadata) and later `pause_on`
control messages give the task's pause rules, event selectors its caller
would pause the child on. The moment the turn emits a matching event, before
publishing it, the conversation is held (`Conversation.hold`), so it takes
no step after the match however long the event takes to reach the caller;
the caller confirms with `pause` or releases with `resume`, a rules update
that drops the rule releases it, and nobody deciding within `HOLD_LIMIT`
seconds releases it too. Rules live as long as the task's running turn.

Frames: a turn's events go out as `wire.publish` sends them, one status
update each; a request that activates the batch extension
(`wire.BATCH_EXTENSION`, or its v1) gets its turn's WORKING events batched,
the turn's end with the last batch under v2 (`frames.FrameBatcher`), and an
event a pause rule holds the turn at is sent before the turn takes its next
step.

A child's configuration (system prompt, a subset of the role's tools, model,
limits, a budget, the network turned off, an explicitly shared context)
travels in the first message's
metadata under `CONFIG_KEY`. The request handler refuses a bad one before a
task exists (`check_config`); `conversations.apply_child_config` applies a
good one here and in the local transport alike.

Budgets: a context's conversation gets the role's budget narrowed by the
caller's (`overrides.py` refuses a wider one) and is stopped by the same
runtime code as an in-process child; what it spent before is read back from
its stored tasks when it is rebuilt. Each turn of a conversation kept to a
budget is also capped by the caller's own limit on this server
(`tokens_left`: what its `tokens_per_day` leaves today), so a budget never
reaches past the operator's per-caller limits.

Memory contract: the conversations held here are bounded by the size of
their messages (`max_memory` bytes, about one byte a character) and by
count (`MAX_CONVERSATIONS`). When a turn ends and a bound is passed, the
least recently used idle conversations are dropped; a running one, or one
waiting in input-required, is never dropped. A dropped conversation is
rebuilt from its context's stored tasks when its caller comes back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import anyio
from a2a.helpers import get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskStore, TaskUpdater
from a2a.types import Task, TaskState, TaskStatus

from ..errors import ConfigError
from ..models.base import ChatMessage, Model
from ..observe import tracing
from ..protocol.decoding import history_entries
from ..protocol.frames import FrameBatcher
from ..protocol.wire import (
    BATCH_VERSIONS,
    CONFIG_KEY,
    metadata_of,
    publish,
    started_message,
)
from ..runtime.budgets import Budget
from ..runtime.conversation import Conversation
from ..runtime.events import ChildEvent, Failed, InputRequired, Started
from ..runtime.factory import HOLD_LIMIT, RoleRuntime, control, role_conversation, spent_in
from ..runtime.overrides import Overrides, check_wire_overrides, offered_models
from ..runtime.roles import Role
from ..runtime.selectors import Selector
from ..runtime.transcript import rebuild_transcript
from ..storage.journal import JournalRow, ToolJournal, lost_announcements, unanswered
from ..storage.tasks.observed import observed
from ..storage.tasks.sqlite import context_tasks
from ..tools import Workspace
from .requests import turn_request

if TYPE_CHECKING:
    from a2a.server.cluster import VersionedTaskStore
    from a2a.server.request_handlers import DefaultRequestHandlerV2

    from .auth.quotas import Quotas

__all__ = [
    "DEFAULT_MAX_MEMORY",
    "HOLD_LIMIT",
    "MAX_CONVERSATIONS",
    "NEW_CONTEXT",
    "RoleExecutor",
    "conversation_size",
]

logger = logging.getLogger(__name__)

MAX_CONVERSATIONS = 256
"""Idle conversations kept in memory; older ones are rebuilt from the store."""

DEFAULT_MAX_MEMORY = 256 * 1024 * 1024
"""Total size of the conversations kept in memory (bytes, see `conversation_size`)."""

NEW_CONTEXT = "a2aOrchestrator.newContext"
"""Call-context state: the context id a request opens a task in when the
request handler found no task in that context, or made the context itself
for a message that named none (`handler.py`), so opening its conversation
reads no earlier tasks and no tool journal."""


# How long cancel and shutdown wait for a turn to publish its terminal state.
_STOP_GRACE = 10.0

# How long a new task's turn waits for the request handler to store the task
# before giving up on the turn (no tool runs on a task that is not stored).
_SAVE_LIMIT = 30.0


def conversation_size(conversation: Conversation) -> int:
    """About how many bytes a conversation's messages hold: the length of
    their text and of their tool calls' names and arguments."""
    return sum(_message_size(message) for message in conversation.messages)


def _message_size(message: ChatMessage) -> int:
    content = message.get("content")
    if isinstance(content, str):
        size = len(content)
    elif isinstance(content, list):
        size = sum(len(str(part.get("text") or "")) for part in content if isinstance(part, dict))
    else:
        size = 0
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            size += len(str(function.get("name") or ""))
            size += len(str(function.get("arguments") or ""))
    return size


def _restore_lost_calls(
    per_task: list[list[str | ChildEvent]], calls: Sequence[JournalRow]
) -> None:
    """Put back the interrupted calls whose announcement a crash kept from the
    task store (a call's start is journaled before the task's frames are
    saved), so the model is told they were interrupted instead of playing
    the step again. Each goes into the task the crash ended (`lost`), just
    before that end, in the order the calls started; with no such task, at
    the end."""
    restored = lost_announcements((e for entries in per_task for e in entries), calls)
    if not restored:
        return
    for entries in per_task:
        if entries and isinstance(entries[-1], Failed) and entries[-1].reason == "lost":
            entries[-1:-1] = restored
            return
    per_task[-1].extend(restored)


class RoleExecutor(AgentExecutor):
    """Runs one role's conversations for a2a-sdk's request handler."""

    def __init__(
        self,
        role: Role,
        model: Model,
        workspace: Workspace,
        *,
        task_store: TaskStore | VersionedTaskStore | None = None,
        models: Callable[[str], Model] | None = None,
        model_names: Collection[str] = (),
        max_memory: int = DEFAULT_MAX_MEMORY,
        journal: ToolJournal | None = None,
        runtime: RoleRuntime | None = None,
    ) -> None:
        """`runtime`: where `run_command` runs commands, the operator's
        price table (cost budgets need the model's price) and the spans its
        conversations open (`factory.RoleRuntime`; default: no sandbox
        given, no prices, the tracer's spans). `models` resolves a model
        name a caller picks (None: callers get `model` only); callers may
        pick `default`, `mini`, the role's `models` and `model_names`.
        `max_memory` bounds the conversations held in memory (bytes).
        `journal` records each tool call's start before it runs (scope: the
        A2A context id), so a crash never makes a call run twice."""
        if max_memory <= 0:
            raise ConfigError("max_memory must be a positive number of bytes")
        self.role = role
        self.journal = journal
        self.model = model
        self.workspace = workspace
        self.task_store = task_store
        self.max_memory = max_memory
        self._models = models
        self.runtime = runtime or RoleRuntime(spans=tracing.CONVERSATION_SPANS)
        self.tokens_left: Callable[[ServerCallContext], Awaitable[int | None]] | None = None
        """How many tokens a request's caller may still use today, which
        caps each turn (wired from the server's quotas, `served_by`); None:
        no per-caller cap."""
        # Checked at start-up: a script in the operator's list is refused here.
        offered = offered_models(role, model_names)
        self.model_names: frozenset[str] = offered if models is not None else frozenset()
        """The model names a caller may choose (empty: none, the server's model only)."""
        # Fail at start-up, not at the first request, on a bad tool list or
        # a sandbox this machine cannot provide.
        role_conversation(role, model, workspace, runtime=self.runtime)
        self._conversations: dict[str, Conversation] = {}
        self._sizes: dict[str, int] = {}
        """Context id -> `conversation_size` measured when its last turn ended."""
        self._sized = 0
        """The sum of `_sizes`, kept as they change: eviction runs at every
        turn's end and must not walk every held conversation to add it up."""
        self._context_of: dict[str, str] = {}
        self._turn_ended: dict[str, anyio.Event] = {}
        self._waiting: dict[str, str] = {}
        """Context id -> the task parked in input-required there."""
        self._pause_rules: dict[str, dict[str, Selector]] = {}
        """Task id -> its caller's pause rules, while a turn of it runs."""
        self._unsaved: dict[str, anyio.Event] = {}
        """New task id -> set once the request handler has stored the task."""
        self._hears_saves = False

    def served_by(
        self,
        handler: DefaultRequestHandlerV2,
        store: TaskStore | VersionedTaskStore,
        quotas: Quotas | None,
    ) -> TaskStore | VersionedTaskStore:
        """Wired to the request `handler` that drives it (by the handler's
        constructor, `handler.py`): a context's earlier tasks are read
        through the handler's `store`, and with `quotas` each turn of a
        conversation kept to a budget is capped by what the caller's
        tokens_per_day leaves (a budget never lifts a caller's limits here).
        Returns the store the handler saves through (`saves_through`)."""
        self.task_store = store
        if quotas is not None:
            self.tokens_left = quotas.tokens_left
        return self.saves_through(store)

    def saves_through(
        self, store: TaskStore | VersionedTaskStore
    ) -> TaskStore | VersionedTaskStore:
        """`store`, telling this executor of each task it saves: the store to
        give the request handler. A new task's turn then waits, before its
        first event goes on, until a2a-sdk has stored the task (so a crash
        cannot lose a task whose tools ran) and the executor never writes a
        task the SDK writes too."""
        self._hears_saves = True
        # Of the same kind: the replicas' versioned store (tasks/cluster.py)
        # stays versioned, so the request handler still streams across replicas.
        return observed(store, self._saved)

    async def _saved(self, task: Task, context: ServerCallContext) -> None:
        stored = self._unsaved.get(task.id)
        if stored is not None:
            stored.set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """For the server's lifetime: first end what a crashed predecessor's
        tool calls left running (before its tasks are marked lost), and close
        the journal at the end."""
        if self.journal is not None:
            ended = await self.journal.recover()
            if ended:
                logger.warning(
                    "%d tool call(s) were interrupted by the previous server's stop; "
                    "their processes were ended and they will not be run again",
                    len(ended),
                )
        try:
            yield
        finally:
            if self.journal is not None:
                self.journal.close()

    def check_config(self, data: object) -> Overrides:
        """A caller's child configuration, narrowed to what this server allows
        (`check_wire_overrides`); `ConfigError` names the field."""
        overrides = check_wire_overrides(data, self.role, self.model_names)
        budget = overrides.budget
        if budget is not None and budget.cost is not None:
            model = self.model
            if overrides.model is not None and self._models is not None:
                model = self._models(overrides.model)
            prices = self.runtime.prices
            if prices is None or prices.price(model.name) is None:
                raise ConfigError(
                    "child config field 'budget.cost': this server has no price for its "
                    f"model {model.name!r}, so it cannot keep a cost budget"
                )
        return overrides

    @property
    def held_bytes(self) -> int:
        """The size of the conversations held in memory now (`conversation_size`)."""
        return sum(conversation_size(c) for c in self._conversations.values())

    @property
    def held_contexts(self) -> frozenset[str]:
        """The contexts whose conversations are held in memory now."""
        return frozenset(self._conversations)

    def conversation(self, task_id: str) -> Conversation | None:
        """The conversation a task belongs to, while this server holds it."""
        context_id = self._context_of.get(task_id)
        return self._conversations.get(context_id) if context_id else None

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id = context.task_id or ""
        # Taken before the task's first event goes out: a `pause_on` sent on
        # hearing of the task replaces them, never the other way round.
        rules = self._pause_rules[task_id] = dict(turn_request(context.call_context).rules)
        try:
            await self._execute(context, event_queue, task_id)
        finally:
            if self._pause_rules.get(task_id) is rules:
                del self._pause_rules[task_id]

    async def _execute(
        self, context: RequestContext, event_queue: EventQueue, task_id: str
    ) -> None:
        task = context.current_task
        # A follow-up that names only the task gets a fresh context id from the
        # SDK; the task's own context id is the one that isolates it.
        context_id = task.context_id if task is not None else (context.context_id or "")
        updater = TaskUpdater(event_queue, task_id, context_id)
        opening: Task | None = None
        if task is None:
            # A new task: its Task frame goes out with the turn's first event.
            task = opening = Task(
                id=task_id,
                context_id=context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message] if context.message else [],
            )

        # The caller reads batched frames (`frames.py`): only then are they sent.
        requested = context.requested_extensions
        batching = next((uri for uri in BATCH_VERSIONS if uri in requested), None)
        frames = FrameBatcher(updater, extension=batching) if batching else None

        conversation: Conversation | None = None

        async def emit(event: ChildEvent) -> None:
            nonlocal opening
            held = conversation is not None and conversation.holds_at(event)
            if opening is not None:
                first, opening = opening, None
                if frames is not None and isinstance(event, Started):
                    # A caller that reads batches gets the turn's start in
                    # the task's own frame (WORKING, the started message):
                    # one frame fewer per turn, each costing a2a-sdk about
                    # a millisecond both ends. Others get it as before.
                    first.status.state = TaskState.TASK_STATE_WORKING
                    first.status.message.CopyFrom(
                        started_message(event, updater.new_agent_message([]))
                    )
                    first.status.timestamp.GetCurrentTime()
                    await self._open_task(first, event_queue)
                    return
                await self._open_task(first, event_queue)
            if frames is None:
                await publish(updater, event)
            else:
                # A held event reaches the caller before the turn waits.
                await frames.publish(event, now=held)

        refused = self._refusal(task_id)
        if refused:
            await emit(Failed(reason="error", message=refused))
            return
        conversation = self._conversations.get(context_id)
        if conversation is None:
            try:
                opened = await self._open(context, task)
            except ConfigError as exc:
                await emit(Failed(reason="error", message=str(exc)))
                return
            # Another request for this context may have opened it meanwhile:
            # there is one conversation per context, the first one installed.
            conversation = self._conversations.get(context_id) or opened
        # Most recently used last: the oldest idle ones are evicted first.
        self._conversations.pop(context_id, None)
        self._conversations[context_id] = conversation
        busy = self._busy(context_id, task_id, conversation)
        if busy:
            await emit(Failed(reason="error", message=busy))
            return
        self._context_of[task_id] = context_id
        # The conversation holds the task at an event its rules select.
        conversation.pause_on(self._pause_rules.get(task_id, {}))
        # No message: a replica adopting a dead one's turn continues it (`replicas.py`).
        text = get_message_text(context.message) if context.message else None
        ended = self._turn_ended[task_id] = anyio.Event()
        cap = await self._cap(context, conversation)
        try:
            # The caller's turn goes on here: its span is this one's parent.
            with tracing.served_turn(
                context.call_context, role=self.role.name, task_id=task_id, context_id=context_id
            ) as traced:
                async with frames.flushing() if frames else contextlib.nullcontext():
                    terminal = traced.ended(await conversation.run(text, emit, cap=cap))
        finally:
            ended.set()
            if self._turn_ended.get(task_id) is ended:
                del self._turn_ended[task_id]
        if isinstance(terminal, InputRequired):
            self._waiting[context_id] = task_id
        else:
            self._waiting.pop(context_id, None)
            # The task is over; its conversation stays for a follow-up task
            # in the same context, or is rebuilt from the store when evicted.
            self._context_of.pop(task_id, None)
        if self._conversations.get(context_id) is conversation:
            size = conversation_size(conversation)
            self._sized += size - self._sizes.get(context_id, 0)
            self._sizes[context_id] = size
        self._evict()

    async def _open_task(self, task: Task, event_queue: EventQueue) -> None:
        """Send a new task's first frame, the Task (the handler wants it before
        any status update), and wait until a2a-sdk has stored it: on disk
        before any tool can run, so after a crash it is found again (and
        marked lost), never sent and run a second time."""
        stored = self._unsaved[task.id] = anyio.Event()
        try:
            await event_queue.enqueue_event(task)
            if self._hears_saves:
                with anyio.fail_after(_SAVE_LIMIT):
                    await stored.wait()
        finally:
            if self._unsaved.get(task.id) is stored:
                del self._unsaved[task.id]

    async def _cap(self, context: RequestContext, conversation: Conversation) -> Budget | None:
        """This turn's cap, for a conversation kept to a budget: what the
        caller's `tokens_per_day` leaves today. (Without a budget, the quota
        alone applies: a turn that crosses it finishes, the next is refused.)"""
        if self.tokens_left is None or context.call_context is None:
            return None
        if conversation.budget is None:
            return None
        left = await self.tokens_left(context.call_context)
        return None if left is None else Budget(tokens=max(left, 0))

    def _busy(self, context_id: str, task_id: str, conversation: Conversation) -> str:
        """Why this context cannot take a turn for `task_id` now ("" if it can)."""
        if conversation.running:
            running = next((t for t, c in self._context_of.items() if c == context_id), "?")
            return (
                f"context {context_id} is busy: task {running} is running in it; "
                "wait for it to end, or use another context"
            )
        waiting = self._waiting.get(context_id)
        if waiting and waiting != task_id:
            return (
                f"context {context_id} is waiting for input on task {waiting}; "
                "answer that task, or cancel it first"
            )
        return ""

    def _refusal(self, task_id: str) -> str:
        """Why a turn of `task_id` may not run here ("" if it may); replicas
        refuse a new task in a context another replica runs."""
        return ""

    def _forget(self, context_id: str) -> None:
        """Drop a context's conversation from memory (it is rebuilt from the
        store when next used), e.g. once another replica took a turn in it."""
        self._conversations.pop(context_id, None)
        self._sized -= self._sizes.pop(context_id, 0)
        waiting = self._waiting.pop(context_id, None)
        if waiting is not None:
            self._context_of.pop(waiting, None)

    def _evict(self) -> None:
        """Drop the least recently used idle conversations while over a bound.

        Oldest first, and only as far as the bounds need, against the total
        kept in `_sized`: a server holding `MAX_CONVERSATIONS` drops one per
        new context without adding up every held conversation."""
        surplus = len(self._conversations) - MAX_CONVERSATIONS
        if self._sized <= self.max_memory and surplus <= 0:
            return
        sized = self._sized
        evicted = []
        for context_id, conversation in self._conversations.items():
            if sized <= self.max_memory and surplus <= 0:
                break
            if conversation.running or context_id in self._waiting:
                continue
            evicted.append(context_id)
            sized -= self._sizes.get(context_id, 0)
            surplus -= 1
        for context_id in evicted:
            del self._conversations[context_id]
            self._sized -= self._sizes.pop(context_id, 0)

    async def _open(self, context: RequestContext, task: Task) -> Conversation:
        """A new conversation, or one rebuilt from the context's stored tasks."""
        current = context.message.message_id if context.message else ""
        call = context.call_context
        # The handler found the context without a task: nothing to rebuild,
        # and no call to recover (a task is stored before its tools run).
        new = call is not None and call.state.get(NEW_CONTEXT) == task.context_id
        earlier = [] if new else await self._earlier_tasks(task, call)
        tasks = [*earlier, task]
        per_task = [history_entries(t, exclude=current) for t in tasks]
        # The context's first message carries the child's configuration.
        first = next((t.history[0] for t in tasks if t.history), context.message)
        # Checked again though the handler checked it on the way in: a stored
        # message may predate this server's current allow-list.
        overrides = self.check_config(metadata_of(first).get(CONFIG_KEY))
        role = overrides.apply(self.role)
        model = self.model
        if overrides.model is not None and self._models is not None:
            model = self._models(overrides.model)
        journal = self.journal
        interrupted = None
        if journal is not None:
            # Every call that started without a stored result, also one
            # whose row was closed before its result frame was saved.
            started = [] if new else await journal.started_calls(task.context_id)
            calls = unanswered(started, (e for entries in per_task for e in entries))
            interrupted = {row.call_id for row in calls}
            _restore_lost_calls(per_task, calls)
        entries = [e for task_entries in per_task for e in task_entries]
        messages = rebuild_transcript(
            role.prompt, entries, shared_context=overrides.shared_context, interrupted=interrupted
        )
        # A budget covers the child's whole life: a rebuilt conversation
        # starts from what its earlier turns spent.
        spent, _ = spent_in(entries)
        return role_conversation(
            role,
            model,
            self.workspace,
            messages=messages,
            runtime=self.runtime,
            journal=journal.scoped(task.context_id) if journal else None,
            spent=spent,
        )

    async def _earlier_tasks(
        self, task: Task, call_context: ServerCallContext | None
    ) -> list[Task]:
        if self.task_store is None or call_context is None:
            return []
        tasks = [
            t
            async for t in context_tasks(self.task_store, task.context_id, call_context)
            if t.id != task.id
        ]
        tasks.sort(key=lambda t: t.status.timestamp.ToNanoseconds())
        return tasks

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Abort the running turn and let it publish CANCELED itself.

        The handler cancels `execute()` right after this returns, so wait
        (bounded) for the turn to end; a task parked in input-required has no
        running turn and the handler marks it CANCELED on its own.
        """
        task_id = context.task_id or ""
        conversation = self.conversation(task_id)
        ended = self._turn_ended.get(task_id)
        context_id = self._context_of.get(task_id, "")
        if conversation is not None and self._waiting.get(context_id) == task_id:
            # A canceled question gets no answer: the next task starts afresh.
            conversation.withdraw_question("(the question was canceled)")
            del self._waiting[context_id]
            self._context_of.pop(task_id, None)
        if conversation is None or ended is None:
            return
        conversation.abort("aborted", "canceled by request")
        with anyio.move_on_after(_STOP_GRACE):
            await ended.wait()

    def _replace_rules(self, task_id: str, rules: Mapping[str, Selector]) -> bool:
        current = self._pause_rules.get(task_id)
        if current is None:
            return False  # between turns: the next turn's message brings its rules
        # Changed in place: `execute` drops its own dict, known by identity.
        current.clear()
        current.update(rules)
        conversation = self.conversation(task_id)
        if conversation is not None:
            # Released if its caller dropped the rule before it heard of the match.
            conversation.pause_on(rules)
        return True

    def control(
        self,
        task_id: str,
        action: str,
        text: str = "",
        rules: Mapping[str, Selector] | None = None,
    ) -> bool:
        """Pause, resume, interrupt or steer a task's conversation, or replace
        its pause rules (`pause_on`, while a turn runs); False if not held
        here, or (steer) if its turn has passed its last step boundary: the
        caller then sends the text as a turn of its own, so it is read once,
        never taken by a turn that no longer reads it."""
        if action == "pause_on":
            return self._replace_rules(task_id, rules or {})
        conversation = self.conversation(task_id)
        if conversation is None:
            return False
        return control(conversation, action, text)

    async def control_anywhere(
        self,
        task_id: str,
        context_id: str,
        action: str,
        text: str = "",
        rules: Mapping[str, Selector] | None = None,
    ) -> bool:
        """`control` wherever the task's turn runs: here, one server
        (replicas carry it to the replica running it, `replicas.py`)."""
        del context_id
        return self.control(task_id, action, text, rules=rules)

    async def shutdown(self) -> None:
        """End every running turn as failed (reason `lost`) before the server stops."""
        running = [(tid, self.conversation(tid)) for tid in list(self._turn_ended)]
        for _task_id, conversation in running:
            if conversation is not None:
                conversation.abort("lost", "the role server shut down while this task ran")
        with anyio.move_on_after(_STOP_GRACE):
            for task_id, _conversation in running:
                ended = self._turn_ended.get(task_id)
                if ended is not None:
                    await ended.wait()
