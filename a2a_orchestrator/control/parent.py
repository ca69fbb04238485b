"""A parent agent: the agent runtime with the control-plane and supervisor tools.

An LLM (or a scripted model) orchestrates by calling `agent`, `agent_manage`,
`wait_agent`, `send_message` and `agent_abort` (and `spawn_agent`, the
one-child form); its inbox receives each child's rendered FINAL_ANSWER,
absorbed at its step boundaries. A role gets only the control tools it lists,
and children get none unless the nesting depth allows (`max_depth`, default 1).
Every error a tool meets is that tool's result (`control.as_tool`): the
parent's turn goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import anyio

from ..delegation.hooks import Hooks
from ..delegation.session import Session
from ..models.base import ChatMessage, Model
from ..runtime.conversation import Conversation, Emit
from ..runtime.events import ChildEvent, MessageDelta, event_to_dict
from ..runtime.factory import role_conversation
from ..runtime.records import RecordKind, transcript_entries
from ..runtime.roles import Role, find_role
from ..runtime.transcript import rebuild_transcript
from ..tools import Tool
from .plane import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_DEPTH,
    WAIT_BOUNDS_MS,
    ControlPlane,
    as_tool,
)
from .supervisor import Supervisor, supervisor_tool

__all__ = ["ParentAgent", "control_tools"]

logger = logging.getLogger(__name__)

_AGENT_ITEM = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "description": "Agent name or role, e.g. coder."},
        "prompt": {"type": "string", "description": "The task for this child."},
        "model": {"type": "string", "description": "Only if a specific model is required."},
        "tools": {
            "type": "array",
            "items": {"type": "string"},
            "description": "A subset of the role's tools.",
        },
        "system_prompt": {"type": "string", "description": "Replaces the role's prompt."},
    },
    "required": ["role", "prompt"],
}


def _tool(
    name: str,
    description: str,
    properties: dict[str, Any],
    required: list[str],
    call: Callable[[dict[str, Any]], Awaitable[Any]],
) -> Tool:
    parameters = {"type": "object", "properties": properties, "required": required}
    return as_tool(name, description, parameters, call)


def control_tools(plane: ControlPlane) -> dict[str, Tool]:
    """The control-plane operations as tools for a parent's model."""

    async def spawn_agent(args: dict[str, Any]) -> Any:
        handle = await plane.spawn_agent(
            str(args["name"]),
            str(args["prompt"]),
            model=args.get("model"),
            system_prompt=args.get("system_prompt"),
        )
        return {"child_id": handle.child_id, "role": handle.role}

    tools = [
        _tool(
            "agent",
            "Start one or more sub-agents at once. Returns immediately with their "
            "child ids; their results arrive in your context when they finish.",
            {"agents": {"type": "array", "items": _AGENT_ITEM}},
            ["agents"],
            lambda a: plane.agent(a["agents"]),
        ),
        _tool(
            "agent_manage",
            "Optionally send messages to children ({role or child_id: text}), then "
            "wait until a child finishes a turn; returns every child's status, with "
            "the message of those that are idle (a result or a question).",
            {"messages": {"type": "object", "additionalProperties": {"type": "string"}}},
            [],
            lambda a: plane.agent_manage(a.get("messages")),
        ),
        _tool(
            "wait_agent",
            "Wait for one child to finish, only when its result blocks your next step. "
            "timeout_ms is clamped to [10000, 3600000] (default 30000). Returns "
            "completed, failed or timeout; a timeout does not stop the child.",
            {"child_id": {"type": "string"}, "timeout_ms": {"type": "integer"}},
            ["child_id"],
            lambda a: plane.wait_agent(str(a["child_id"]), a.get("timeout_ms")),
        ),
        _tool(
            "send_message",
            "Send a message to a child: a running child reads it at its next step, "
            "an idle one (or one whose turn just ended) starts a new turn with it. "
            "An aborted child takes no messages.",
            {"child_id": {"type": "string"}, "text": {"type": "string"}},
            ["child_id", "text"],
            lambda a: plane.send_message(str(a["child_id"]), str(a["text"])),
        ),
        _tool(
            "agent_abort",
            "Abort children, named by child id or role, running or idle: they stop "
            "for good and take no more messages.",
            {"abort": {"type": "array", "items": {"type": "string"}}},
            ["abort"],
            lambda a: plane.agent_abort([str(t) for t in a["abort"]]),
        ),
        _tool(
            "spawn_agent",
            "Start one sub-agent (name = agent or role). Returns its child id at once.",
            {
                "name": {"type": "string"},
                "prompt": {"type": "string"},
                "model": {"type": "string"},
                "system_prompt": {"type": "string"},
            },
            ["name", "prompt"],
            spawn_agent,
        ),
    ]
    return {tool.name: tool for tool in tools}


class ParentAgent:
    """A conversation that orchestrates children through its control plane."""

    def __init__(
        self,
        session: Session,
        model: Model,
        *,
        role: Role | str = "orchestrator",
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        max_depth: int = DEFAULT_MAX_DEPTH,
        hooks: Hooks | None = None,
        wait_bounds_ms: tuple[int, int] = WAIT_BOUNDS_MS,
        messages: list[ChatMessage] | None = None,
        model_names: Collection[str] | None = None,
    ) -> None:
        """`messages`: the parent's transcript so far (see `restore`); None
        starts fresh. `model_names`: what the parent may choose for a child
        besides `default`, `mini` and the role's `models` (None: `$A2A_MODELS`)."""
        self.session = session
        self.role = find_role(role) if isinstance(role, str) else role
        self.plane = ControlPlane(
            session,
            max_concurrent=max_concurrent,
            max_depth=max_depth,
            hooks=hooks,
            wait_bounds_ms=wait_bounds_ms,
            model_names=model_names,
        )
        self.supervisor = Supervisor(self.plane, start_turn=self.start_turn)
        tools = {**control_tools(self.plane), "supervisor": supervisor_tool(self.supervisor)}
        agents = ", ".join(
            f"{spec.name} ({spec.role}{', remote' if spec.remote else ''})"
            for spec in session.network.agents.values()
        )
        prompt = self.role.prompt + (f"\n\nAgents you can delegate to: {agents}." if agents else "")
        self.conversation: Conversation = role_conversation(
            self.role.with_overrides(prompt=prompt),
            model,
            session.workspace,
            extra_tools=tools,
            messages=messages,
            # The operator's sandbox (--no-sandbox, --allow-network, the
            # store hidden) for a parent role that lists run_command too.
            sandbox=session.sandbox,
        )
        self.plane.inbox = self.conversation
        self.emit: Emit | None = None
        """Where the parent's own events go besides the store (a view), for
        turns started by `start_turn` as well as by `run`."""
        self.last: ChildEvent | None = None
        """How the parent's latest turn ended."""
        self._turns: list[str] | None = None
        self._turn_lock = anyio.Lock()
        """Turns run one at a time: a client's and one an injection started."""

    @classmethod
    async def restore(cls, session: Session, model: Model, **kwargs: Any) -> ParentAgent:
        """The session's parent as its stored transcript left it (a later turn,
        another process, a restart): its inputs, events and children's results."""
        role = kwargs.pop("role", "orchestrator")
        the_role = find_role(role) if isinstance(role, str) else role
        stored = await session.store.events(session.id)
        entries = transcript_entries(item for item in stored if item.child_id is None)
        fresh = cls(session, model, role=the_role, **kwargs)
        # Stored subscriptions act from now on, not from the first tool call.
        await fresh.supervisor.load()
        if entries:
            prompt = fresh.conversation.messages[0]["content"]
            fresh.conversation.messages = rebuild_transcript(prompt, entries)
        return fresh

    async def run(self, text: str | None, emit: Emit | None = None) -> ChildEvent:
        """One turn of the parent; its input and events go to the session's transcript."""
        async with self._turn_lock:
            return await self._run(text, emit)

    async def _run(self, text: str | None, emit: Emit | None) -> ChildEvent:
        store = self.session.store
        if not self.supervisor.loaded:
            await self.supervisor.load()
        if text is not None:
            await store.append_event(self.session.id, RecordKind.INPUT, {"text": text})

        async def record(event: ChildEvent) -> None:
            if not isinstance(event, MessageDelta):
                await store.append_event(
                    self.session.id, event.kind, event_to_dict(event), uuid=event.uuid
                )
            target = emit or self.emit
            if target is not None:
                await target(event)

        self.last = await self.conversation.run(text, record)
        return self.last

    async def start_turn(self, text: str) -> None:
        """Give the parent `text` now: a new turn if it is idle (run in the
        session's task group, one turn at a time, not blocking the caller),
        else its inbox for its next step."""
        if self.conversation.running or self._turns is not None:
            if self._turns is not None and not self.conversation.running:
                self._turns.append(text)  # a turn is about to start: queue behind it
            else:
                self.conversation.steer(text)
            return
        self._turns = [text]

        async def turns() -> None:
            try:
                while self._turns:
                    try:
                        await self.run(self._turns.pop(0))
                    except Exception:
                        logger.exception("a parent turn failed")
            finally:
                self._turns = None

        self.session.start_soon(turns, name="parent turns")

    async def cancel(self) -> None:
        """Stop the parent's children and end its running turn as aborted
        (the same `cancel` as `Pipeline.cancel`, for the orchestrator server)."""
        await self.plane.stop_children()
        self.conversation.abort("aborted", "canceled by request")

    def close(self) -> None:
        self.supervisor.close()
        self.plane.close()
