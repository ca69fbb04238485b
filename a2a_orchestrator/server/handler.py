"""`RoleRequestHandler`: a2a-sdk's request handler, plus the control extension,
the child-config check and one repair.

Child config: a message carrying `CONFIG_KEY` metadata is checked against
what the operator allowed (`RoleExecutor.check_config`) before the SDK sees
it, so a wrong type, an unknown field, a limit above the role's or a model
not offered is an invalid-params error (JSON-RPC -32602, HTTP 400 on the
REST binding) naming the field, and no task is created for it.

Control extension (`wire.CONTROL_EXTENSION`, declared in the card): a
message whose metadata holds `CONTROL_KEY` = pause, resume, interrupt,
steer or pause_on and names a task is applied to that task's running
conversation at once (with replicas, on the replica running its turn,
`replicas.py`; steer: the message's text joins its inbox, absorbed at the
next step boundary; pause_on: `PAUSE_ON_KEY` replaces the task's pause
rules, see `executor`) and answered with the task. It must not queue behind
the running turn the way an ordinary follow-up does, or a pause would arrive
after the work it meant to hold. Pause rules on an ordinary message (they
come with each turn's message) are checked here too: malformed ones are
invalid params before a task exists.

Repair: a follow-up message that names only its task (no context id) is
normal A2A. When that task is no longer active in the server's memory (after
a restart, or once the SDK released an idle input-required task), a2a-sdk 1.3
starts the new active task under a freshly generated context id and then
rejects the executor's events, which carry the task's real context id
("Context in event doesn't match TaskManager"). Filling the stored task's
context id into the message before the SDK sees it keeps such a task
continuable.

Callers (`access.py`): a2a-sdk scopes every task read to the request's
caller, so another caller's task id is "task not found" on every route, the
control extension's included (`_stored_task`). Context ids are not scoped
by the SDK, and a role server keeps one conversation per context: a message
opening a task in a context where another caller has tasks is refused
(invalid params), or it would continue that caller's conversation. A
message that would start work is admitted by the caller's quotas first
(`quotas.py`), and a stream (SendStreamingMessage, SubscribeToTask) takes
one of the server's stream slots for its life (`streams.py`).

Repeated messages: a caller that lost its stream before hearing a task's id
(a crash in the spawn window) may send the same opening message again, with
the same message id and context id. a2a-sdk would start a second task and
run the work twice; instead a message whose id is already in a task of its
context is answered with that task (and, streaming, that task's live
events). Messages of one id are handled one at a time until their task is
stored, so two copies in flight cannot both start one.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from a2a.helpers import get_message_text
from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.types import (
    InvalidParamsError,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from ..errors import ConfigError
from ..protocol.decoding import TURN_ENDING_STATES
from ..protocol.wire import (
    CONFIG_KEY,
)
from ..runtime.factory import CONTROL_ACTIONS
from ..storage.tasks.sqlite import context_owners, task_opened_by
from .auth.quotas import Quotas, refusal
from .executor import NEW_CONTEXT, RoleExecutor
from .requests import REQUEST_KEY, TurnRequest
from .streams import StreamSlots

if TYPE_CHECKING:
    from a2a.server.cluster import VersionedTaskStore
    from a2a.server.tasks import TaskStore

__all__ = ["RoleRequestHandler"]


class RoleRequestHandler(DefaultRequestHandler):
    _opening: dict[str, asyncio.Lock] | None = None
    """Locks of the task-opening messages being handled, by context/message id."""

    def __init__(
        self,
        agent_executor: Any,
        task_store: TaskStore | VersionedTaskStore,
        *args: Any,
        quotas: Quotas | None = None,
        streams: StreamSlots | None = None,
        **kwargs: Any,
    ) -> None:
        """a2a-sdk's arguments (`agent_executor`: an a2a-sdk executor, as
        `app.ServedExecutor` describes), the `quotas` that admit work (None: no
        limits) and the `streams` open streams hold a slot of (None: a
        `StreamSlots` with the default limits).

        The executor and its handler are wired here, once: an executor with
        a `served_by(handler, task_store, quotas)` method is told of this
        handler, the store it saves through and the quotas it admits work
        by, and answers with the store the handler is to save through (one
        that tells the executor of each save, `RoleExecutor.served_by`)."""
        served_by = getattr(agent_executor, "served_by", None)
        if served_by is not None:
            task_store = served_by(self, task_store, quotas)
        super().__init__(agent_executor, task_store, *args, **kwargs)
        self.quotas = quotas
        self.streams = streams if streams is not None else StreamSlots()

    @contextlib.contextmanager
    def _stream_slot(self, context: ServerCallContext) -> Iterator[None]:
        owner = resolve_user_scope(context)
        refused = self.streams.refused(owner)
        if refused is not None:
            raise refusal(context, refused.quota, refused.limit, refused.retry_after, str(refused))
        with self.streams.held(owner):
            yield

    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        with self._stream_slot(context):
            async with contextlib.aclosing(super().on_subscribe_to_task(params, context)) as events:
                async for event in events:
                    yield event

    def _admitted(self, context: ServerCallContext) -> AbstractAsyncContextManager[None]:
        if self.quotas is None:
            return contextlib.nullcontext()
        return self.quotas.admitted(context)

    async def _check_context(self, params: SendMessageRequest, context: ServerCallContext) -> bool:
        """Refuse to open a task in a context another caller's tasks are in;
        True when the store tells the context has no task at all (then the
        executor need not look for its earlier tasks: `NEW_CONTEXT`)."""
        message = params.message
        if message.task_id or not message.context_id:
            return False
        if context.state.get(NEW_CONTEXT) == message.context_id:
            return True  # made here for a message that named none
        owners = await context_owners(self.task_store, message.context_id)
        if owners is None:
            return False
        if owners - {resolve_user_scope(context)}:
            raise InvalidParamsError(
                message=f"context {message.context_id} cannot be used by this caller; "
                "open the task in a new context id"
            )
        if owners:
            return False
        context.state[NEW_CONTEXT] = message.context_id
        return True

    @contextlib.asynccontextmanager
    async def _one_at_a_time(self, params: SendMessageRequest) -> AsyncIterator[bool]:
        """Hold the lock of a task-opening message's id; yields whether it
        may open a task (False: no context to look in, nothing to guard)."""
        message = params.message
        if message.task_id or not message.context_id or not message.message_id:
            yield False
            return
        if self._opening is None:
            self._opening = {}
        locks = self._opening
        key = f"{message.context_id}/{message.message_id}"
        lock = locks.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                yield True
        finally:
            if not lock.locked() and locks.get(key) is lock:
                del locks[key]

    async def _repeated(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | None:
        """The task a repeated opening message started already, if any."""
        message = params.message
        return await task_opened_by(
            self.task_store, message.context_id, message.message_id, context
        )

    async def _stored_task(self, task_id: str, context: ServerCallContext) -> Task | None:
        stored = await self.task_store.get(task_id, context)
        # A versioned (cluster) store wraps the task in a StoredTask.
        return stored if isinstance(stored, Task) or stored is None else stored.task

    async def _fill_context_id(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> None:
        message = params.message
        if message.task_id and not message.context_id:
            task = await self._stored_task(message.task_id, context)
            if task is not None:
                message.context_id = task.context_id
        elif not message.task_id and not message.context_id:
            # A new context, as the SDK would make one (a UUID): no task can
            # be in it yet, so neither the owners check nor the executor
            # reads the store for it (`NEW_CONTEXT`).
            message.context_id = str(uuid.uuid4())
            context.state[NEW_CONTEXT] = message.context_id

    def _check_config(self, request: TurnRequest) -> None:
        executor = self.agent_executor
        if not isinstance(executor, RoleExecutor) or not request.has_config:
            return
        try:
            executor.check_config(request.config)
        except ConfigError as exc:
            raise InvalidParamsError(message=f"{CONFIG_KEY}: {exc}") from exc

    def _parsed(self, params: SendMessageRequest, context: ServerCallContext) -> TurnRequest:
        """The message's metadata, parsed once here: the executor reads it
        from the call context (`requests.turn_request`)."""
        request = context.state[REQUEST_KEY] = TurnRequest.of(params.message)
        return request

    async def _control(
        self, params: SendMessageRequest, context: ServerCallContext, request: TurnRequest
    ) -> Task | None:
        """Apply a control message; None when the message is an ordinary one."""
        message = params.message
        action, rules = request.action, request.rules
        if action is None:
            return None
        if action not in CONTROL_ACTIONS:
            raise InvalidParamsError(
                message=f"unknown control action {action!r}; expected one of {CONTROL_ACTIONS}"
            )
        if not message.task_id:
            raise InvalidParamsError(message="a control message must name its task")
        task = await self._stored_task(message.task_id, context)
        if task is None:
            raise TaskNotFoundError(message=f"task {message.task_id} not found")
        executor = self.agent_executor
        if not isinstance(executor, RoleExecutor):
            raise UnsupportedOperationError(
                message="this agent does not take control messages (no control extension)"
            )
        text = get_message_text(message)
        applied = await executor.control_anywhere(
            message.task_id, task.context_id, str(action), text, rules=rules
        )
        if not applied:
            raise InvalidParamsError(
                message=f"task {message.task_id} is not running on this server; nothing to {action}"
            )
        return task

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Any:
        request = self._parsed(params, context)
        controlled = await self._control(params, context, request)
        if controlled is not None:
            return controlled
        self._check_config(request)
        await self._fill_context_id(params, context)
        async with self._one_at_a_time(params) as opening:
            new = await self._check_context(params, context)
            repeated = await self._repeated(params, context) if opening and not new else None
            if repeated is not None:
                return repeated
            async with self._admitted(context):
                return await super().on_message_send(params, context)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        with self._stream_slot(context):
            async with contextlib.aclosing(self._send_stream(params, context)) as events:
                async for event in events:
                    yield event

    async def _send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Any, None]:
        request = self._parsed(params, context)
        controlled = await self._control(params, context, request)
        if controlled is not None:
            yield controlled
            return
        self._check_config(request)
        await self._fill_context_id(params, context)
        events: AsyncGenerator[Any, None] | None = None
        async with self._one_at_a_time(params) as opening:
            new = await self._check_context(params, context)
            repeated = await self._repeated(params, context) if opening and not new else None
            if repeated is None:
                # Admitted until its task is saved running, which the first
                # event follows (the quotas count the task from then on).
                async with self._admitted(context):
                    events = super().on_message_send_stream(params, context)
                    # The first event is the stored task: once it is out, a
                    # repeat of this message finds it.
                    first = await anext(events, None)
        if repeated is not None:
            async for event in self._follow(repeated, context):
                yield event
            return
        assert events is not None
        try:
            if first is None:
                return
            yield first
            async for event in events:
                yield event
        finally:
            # A caller gone mid-stream: the SDK then finishes the task in
            # the background (it hears GeneratorExit here).
            await events.aclose()

    async def _follow(self, task: Task, context: ServerCallContext) -> AsyncIterator[Any]:
        """The answer to a repeated message: its task, then its live events."""
        if task.status.state in TURN_ENDING_STATES:
            yield task
            return
        try:
            # The repeated message's own stream holds the slot already.
            async for event in super().on_subscribe_to_task(
                SubscribeToTaskRequest(id=task.id), context
            ):
                yield event
        except TaskNotFoundError:
            # Not running here any more: the task sent first tells its state.
            return
