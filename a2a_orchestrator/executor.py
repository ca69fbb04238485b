"""`RoleExecutor`: a role's conversations behind a2a-sdk's request handler.

One A2A task is one `Conversation`; its `context_id` isolates it. A
follow-up message on a task continues that conversation (the answer to an
`ask_parent` question, or a new instruction after it finished a turn). The
conversation is kept in memory while its task lives on this server and is
rebuilt from the stored task's history when the server restarted meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import anyio
from a2a.helpers import get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Task, TaskState, TaskStatus

from .errors import ConfigError
from .events import ChildEvent, Done, Failed
from .models.base import Model
from .roles import Role
from .runtime import ASK_PARENT, Conversation
from .tools import TOOL_NAMES, Tool, Workspace, build_tools
from .wire import publish, transcript_from_history

__all__ = ["CONTROL_TOOL_NAMES", "RoleExecutor", "role_conversation"]

logger = logging.getLogger(__name__)

CONTROL_TOOL_NAMES = frozenset(
    {"agent", "agent_manage", "agent_abort", "spawn_agent", "wait_agent", "send_message"}
    | {"supervisor"}
)
"""Tools a role may list that the control plane provides when the role runs
as a parent; a bare role server does not offer them."""

# How long cancel and shutdown wait for a turn to publish its terminal state.
_STOP_GRACE = 10.0


def role_conversation(
    role: Role,
    model: Model,
    workspace: Workspace,
    *,
    extra_tools: Mapping[str, Tool] | None = None,
    messages: list[dict[str, object]] | None = None,
    command_timeout: float | None = None,
) -> Conversation:
    """A conversation with exactly the tools the role lists."""
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
    tools = build_tools(
        [name for name in role.tools if name in TOOL_NAMES],
        workspace,
        command_timeout=command_timeout or min(role.timeout, 600.0),
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


class RoleExecutor(AgentExecutor):
    """Runs one role's conversations for `DefaultRequestHandler`."""

    def __init__(self, role: Role, model: Model, workspace: Workspace) -> None:
        self.role = role
        self.model = model
        self.workspace = workspace
        # Fail at start-up, not at the first request, on a bad tool list.
        role_conversation(role, model, workspace)
        self._conversations: dict[str, Conversation] = {}
        self._turn_ended: dict[str, anyio.Event] = {}

    def conversation(self, task_id: str) -> Conversation | None:
        return self._conversations.get(task_id)

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
        conversation = self._conversations.get(task_id)
        if conversation is None:
            current = context.message.message_id if context.message else ""
            conversation = role_conversation(
                self.role,
                self.model,
                self.workspace,
                messages=transcript_from_history(task, self.role.prompt, exclude=current),
            )
            self._conversations[task_id] = conversation
        text = get_message_text(context.message) if context.message else ""

        async def emit(event: ChildEvent) -> None:
            await publish(updater, event)

        ended = self._turn_ended[task_id] = anyio.Event()
        try:
            terminal = await conversation.run(text, emit)
        finally:
            ended.set()
            if self._turn_ended.get(task_id) is ended:
                del self._turn_ended[task_id]
        if isinstance(terminal, Done | Failed):
            self._conversations.pop(task_id, None)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Abort the running turn and let it publish CANCELED itself.

        The handler cancels `execute()` right after this returns, so wait
        (bounded) for the turn to end; a task parked in input-required has no
        running turn and the handler marks it CANCELED on its own.
        """
        task_id = context.task_id or ""
        conversation = self._conversations.pop(task_id, None)
        ended = self._turn_ended.get(task_id)
        if conversation is None or ended is None:
            return
        conversation.abort("aborted", "canceled by request")
        with anyio.move_on_after(_STOP_GRACE):
            await ended.wait()

    async def shutdown(self) -> None:
        """End every running turn as failed (reason `lost`) before the server stops."""
        running = [(tid, c) for tid, c in self._conversations.items() if c.running]
        for _task_id, conversation in running:
            conversation.abort("lost", "the role server shut down while this task ran")
        with anyio.move_on_after(_STOP_GRACE):
            for task_id, _conversation in running:
                ended = self._turn_ended.get(task_id)
                if ended is not None:
                    await ended.wait()
