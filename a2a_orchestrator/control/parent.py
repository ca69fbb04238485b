"""A parent agent: the agent runtime with the control-plane and supervisor tools.

An LLM (or a scripted model) orchestrates by calling `agent`, `agent_manage`,
`wait_agent`, `send_message` and `agent_abort` (and `spawn_agent`, the
one-child form); its inbox receives each child's rendered FINAL_ANSWER,
absorbed at its step boundaries. A role gets only the control tools it lists,
and children get none unless the nesting depth allows (`max_depth`, default 1).
Every error a tool meets is that tool's result (`plane.as_tool`): the
parent's turn goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

import anyio

from ..delegation.hooks import Hooks
from ..delegation.session import Session
from ..models.base import ChatMessage, Model
from ..observe import tracing
from ..runtime.conversation import Conversation, Emit
from ..runtime.events import ChildEvent, MessageDelta, event_to_dict
from ..runtime.factory import RoleRuntime, role_conversation
from ..runtime.records import RecordKind, transcript_entries
from ..runtime.roles import Role, find_role
from ..runtime.transcript import rebuild_transcript
from .plane import (
    DEFAULT_MAX_CONCURRENT,
    DEFAULT_MAX_DEPTH,
    WAIT_BOUNDS_MS,
    ControlPlane,
    control_tools,
)
from .supervisor import Supervisor, supervisor_tool

__all__ = ["ParentAgent"]

logger = logging.getLogger(__name__)


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
            runtime=RoleRuntime(sandbox=session.sandbox, spans=tracing.CONVERSATION_SPANS),
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
