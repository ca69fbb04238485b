"""`RoleExecutor`: a role's conversations behind a2a-sdk's request handler.

One conversation per A2A context: the first message of a context starts it
(isolated: it sees no other context), a follow-up on the same task or a new
task in the same context continues it. The conversation is kept in memory
while it lives and is rebuilt from the stored tasks of its context when the
server restarted meanwhile.

A child's configuration (system prompt, a subset of the role's tools, model,
limits, an explicitly shared context) travels in the first message's
metadata under `CONFIG_KEY`; `apply_child_config` applies it here and in the
local transport alike.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
from a2a.helpers import get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskStore, TaskUpdater
from a2a.types import ListTasksRequest, Message, Task, TaskState, TaskStatus
from google.protobuf.json_format import MessageToDict

from .delegation import INTERRUPTED_TEXT
from .errors import ConfigError
from .events import ChildEvent, Failed, InputRequired
from .models.base import ChatMessage, Model
from .roles import Role
from .runtime import ASK_PARENT, Conversation
from .tools import TOOL_NAMES, Sandbox, Tool, Workspace, build_tools
from .transcript import rebuild_transcript
from .wire import CONFIG_KEY, history_entries, publish

__all__ = [
    "CONTROL_TOOL_NAMES",
    "RoleExecutor",
    "apply_child_config",
    "role_conversation",
]

logger = logging.getLogger(__name__)

CONTROL_TOOL_NAMES = frozenset(
    {"agent", "agent_manage", "agent_abort", "spawn_agent", "wait_agent", "send_message"}
    | {"supervisor"}
)
"""Tools a role may list that the control plane provides when the role runs
as a parent; a bare role server does not offer them."""

MAX_CONVERSATIONS = 256
"""Idle conversations kept in memory; older ones are rebuilt from the store."""

# How long cancel and shutdown wait for a turn to publish its terminal state.
_STOP_GRACE = 10.0


def apply_child_config(role: Role, overrides: Mapping[str, Any]) -> Role:
    """The role as one child asked for it: a prompt, fewer tools, other limits.

    A child may narrow the role's tools, never widen them.
    """
    tools = overrides.get("tools")
    if tools is not None:
        extra = [t for t in tools if t not in role.tools]
        if extra:
            raise ConfigError(
                f"role {role.name!r} has no tools {extra}; its tools: {', '.join(role.tools)}"
            )
    max_turns = overrides.get("max_turns")
    timeout = overrides.get("timeout")
    return role.with_overrides(
        prompt=overrides.get("system_prompt"),
        tools=tools,
        max_turns=int(max_turns) if max_turns is not None else None,
        timeout=float(timeout) if timeout is not None else None,
    )


def role_conversation(
    role: Role,
    model: Model,
    workspace: Workspace,
    *,
    extra_tools: Mapping[str, Tool] | None = None,
    messages: Sequence[ChatMessage] | None = None,
    command_timeout: float | None = None,
    sandbox: Sandbox | None = None,
) -> Conversation:
    """A conversation with exactly the tools the role lists.

    `sandbox` is the operator's policy for `run_command` (default:
    `Sandbox.from_env()`), with the network allowed too when the role file
    says `sandbox_network: true`. Raises `ConfigError` when the role lists
    `run_command` and that sandbox cannot be had on this machine.
    """
    extra = dict(extra_tools or {})
    unknown = [
        name
        for name in role.tools
        if name not in TOOL_NAMES
        and name != ASK_PARENT
        and name not in extra
        and name not in CONTROL_TOOL_NAMES
    ]
    if unknown:
        where = f" ({role.source})" if role.source else ""
        known = ", ".join([*TOOL_NAMES, ASK_PARENT, *sorted(CONTROL_TOOL_NAMES)])
        raise ConfigError(
            f"role {role.name!r}{where} lists unknown tools {unknown}; known tools: {known}"
        )
    policy = None
    if "run_command" in role.tools:
        policy = (sandbox if sandbox is not None else Sandbox.from_env()).allowing_network(
            role.sandbox_network
        )
    tools = build_tools(
        [name for name in role.tools if name in TOOL_NAMES],
        workspace,
        command_timeout=command_timeout or min(role.timeout, 600.0),
        sandbox=policy,
    )
    tools += [extra[name] for name in role.tools if name in extra]
    return Conversation(
        model=model,
        system_prompt=role.prompt,
        tools=tools,
        ask_parent=ASK_PARENT in role.tools,
        max_turns=role.max_turns,
        timeout=role.timeout,
        role=role.name,
        messages=messages,
    )


def _metadata(message: Message | None) -> dict[str, Any]:
    if message is None or not message.HasField("metadata"):
        return {}
    return MessageToDict(message.metadata)


class RoleExecutor(AgentExecutor):
    """Runs one role's conversations for a2a-sdk's request handler."""

    def __init__(
        self,
        role: Role,
        model: Model,
        workspace: Workspace,
        *,
        task_store: TaskStore | None = None,
        models: Callable[[str], Model] | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        self.role = role
        self.model = model
        self.workspace = workspace
        self.task_store = task_store
        self._models = models
        self.sandbox = sandbox
        # Fail at start-up, not at the first request, on a bad tool list or
        # a sandbox this machine cannot provide.
        role_conversation(role, model, workspace, sandbox=sandbox)
        self._conversations: dict[str, Conversation] = {}
        self._context_of: dict[str, str] = {}
        self._turn_ended: dict[str, anyio.Event] = {}
        self._waiting: dict[str, str] = {}
        """Context id -> the task parked in input-required there."""

    def running(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Nothing to hold open for the server's lifetime."""
        return contextlib.nullcontext()

    def conversation(self, task_id: str) -> Conversation | None:
        """The conversation a task belongs to, while this server holds it."""
        context_id = self._context_of.get(task_id)
        return self._conversations.get(context_id) if context_id else None

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        task_id = context.task_id or ""
        # A follow-up that names only the task gets a fresh context id from the
        # SDK; the task's own context id is the one that isolates it.
        context_id = task.context_id if task is not None else (context.context_id or "")
        updater = TaskUpdater(event_queue, task_id, context_id)
        if task is None:
            # The handler wants the Task enqueued before any status update.
            task = Task(
                id=task_id,
                context_id=context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message] if context.message else [],
            )
            await event_queue.enqueue_event(task)

        async def emit(event: ChildEvent) -> None:
            await publish(updater, event)

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
        text = get_message_text(context.message) if context.message else ""
        ended = self._turn_ended[task_id] = anyio.Event()
        try:
            terminal = await conversation.run(text, emit)
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
            self._evict()

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

    def _evict(self) -> None:
        idle = [
            context_id
            for context_id, conversation in self._conversations.items()
            if not conversation.running and context_id not in self._waiting
        ]
        for context_id in idle[: max(0, len(self._conversations) - MAX_CONVERSATIONS)]:
            del self._conversations[context_id]

    async def _open(self, context: RequestContext, task: Task) -> Conversation:
        """A new conversation, or one rebuilt from the context's stored tasks."""
        current = context.message.message_id if context.message else ""
        earlier = await self._earlier_tasks(task, context.call_context)
        tasks = [*earlier, task]
        entries = [e for t in tasks for e in history_entries(t, exclude=current)]
        # The context's first message carries the child's configuration.
        first = next((t.history[0] for t in tasks if t.history), context.message)
        overrides = _metadata(first).get(CONFIG_KEY) or {}
        if not isinstance(overrides, dict):
            raise ConfigError(f"{CONFIG_KEY} must be an object")
        role = apply_child_config(self.role, overrides)
        model = self.model
        if overrides.get("model"):
            if self._models is None:
                raise ConfigError("this role server does not choose models per child")
            model = self._models(str(overrides["model"]))
        messages = rebuild_transcript(
            role.prompt, entries, shared_context=overrides.get("shared_context") or ()
        )
        return role_conversation(
            role, model, self.workspace, messages=messages, sandbox=self.sandbox
        )

    async def _earlier_tasks(
        self, task: Task, call_context: ServerCallContext | None
    ) -> list[Task]:
        if self.task_store is None or call_context is None:
            return []
        tasks: list[Task] = []
        token = ""
        while True:
            listing = await self.task_store.list(
                ListTasksRequest(context_id=task.context_id, page_token=token, page_size=100),
                call_context,
            )
            tasks.extend(t for t in listing.tasks if t.id != task.id)
            token = listing.next_page_token
            if not token:
                break
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

    def control(self, task_id: str, action: str, text: str = "") -> bool:
        """Pause, resume, interrupt or steer a task's conversation; False if not held here."""
        conversation = self.conversation(task_id)
        if conversation is None:
            return False
        if action == "pause":
            conversation.pause()
        elif action == "resume":
            conversation.resume()
        elif action == "interrupt":
            conversation.resume()
            conversation.abort("aborted", INTERRUPTED_TEXT)
        elif action == "steer":
            conversation.steer(text)
        else:
            raise ValueError(f"unknown control action {action!r}")
        return True

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
