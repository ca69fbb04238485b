"""The in-process transport: a child's conversation runs in this process.

The same role files, tools, runtime and child-config rules as a role server,
without HTTP; events come straight from the runtime.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path

from ..delegation import CANCELED_TEXT, INTERRUPTED_TEXT, ChildConfig, Emit
from ..errors import OrchestratorError
from ..events import ChildEvent
from ..executor import apply_child_config, role_conversation
from ..journal import CallJournal
from ..models.base import ChatMessage, Model
from ..network import AgentSpec
from ..roles import find_role
from ..runtime import Conversation
from ..selectors import Selector
from ..tools import Sandbox, Tool, Workspace
from ..transcript import rebuild_transcript

__all__ = ["LocalDelegate", "LocalRun", "check_sandbox", "pick_model"]


def pick_model(requested: str | None, role_model: str, parent_model: str | None) -> str:
    """The child's model: asked for, else the role's own, else the parent's."""
    if requested:
        return requested
    if role_model and role_model != "default":
        return role_model
    return parent_model or "default"


def check_sandbox(
    specs: Iterable[AgentSpec], sandbox: Sandbox | None, *, cwd: Path | None = None
) -> None:
    """Raise `ConfigError` when an in-process agent's role lists `run_command`
    and `sandbox` cannot be had here, so a network refuses at start rather
    than at its first command. A role that does not load is left for its
    spawn to report."""
    for spec in specs:
        if spec.remote:
            continue
        try:
            role = find_role(spec.role, cwd=cwd)
        except OrchestratorError:
            continue
        if "run_command" in role.tools:
            policy = sandbox if sandbox is not None else Sandbox.from_env()
            policy.allowing_network(role.sandbox_network).check()


class LocalRun:
    """A child conversation running in this process."""

    transport = "local"
    task_id = ""
    context_id = ""

    def __init__(self, conversation: Conversation) -> None:
        self.conversation = conversation

    @property
    def model(self) -> str:
        return self.conversation.model.name

    async def turn(self, text: str | None, emit: Emit) -> list[str]:
        await self.conversation.run(text, emit)
        # Steering the turn took but never read (it ended first): handed
        # back, so the handle makes it the next turn's input.
        return self.conversation.take_steering()

    async def cancel(self) -> None:
        self.conversation.resume()
        self.conversation.abort("aborted", CANCELED_TEXT)

    async def pause(self) -> None:
        self.conversation.pause()

    async def resume(self) -> None:
        self.conversation.resume()

    async def pause_on(self, rules: Mapping[str, Selector]) -> bool:
        """False, nothing to do: each event reaches the parent's listeners
        before the conversation takes its next step (the emit is awaited),
        so a listener's `pause()` already lands at the event."""
        return False

    async def steer(self, text: str) -> bool:
        # Decided at once in this process: the loop either will read it or
        # has passed its last step boundary (then the handle opens a turn).
        return self.conversation.offer(text)

    async def interrupt(self) -> None:
        self.conversation.resume()
        self.conversation.abort("aborted", INTERRUPTED_TEXT)

    async def history(self) -> list[ChatMessage]:
        return [dict(m) for m in self.conversation.messages]

    async def aclose(self) -> None:
        self.conversation.abort("lost", "the orchestrator stopped while this child ran")


class LocalDelegate:
    """Opens in-process children (`Delegate` for agents without a URL)."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        models: Callable[[str], Model],
        parent_model: str | None = None,
        extra_tools: Mapping[str, Tool] | None = None,
        cwd: Path | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        """`sandbox`: where the children's commands run (default: `Sandbox.from_env()`)."""
        self.workspace = workspace
        self.sandbox = sandbox
        self.models = models
        self.parent_model = parent_model
        self.extra_tools = dict(extra_tools or {})
        self.cwd = cwd

    def _conversation(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        entries: Sequence[str | ChildEvent],
        extra_tools: Mapping[str, Tool] | None,
        journal: CallJournal | None,
        interrupted: Collection[str] | None = None,
    ) -> Conversation:
        role = apply_child_config(find_role(spec.role, cwd=self.cwd), config.overrides())
        if config.unlimited:
            # In process, the caller is the operator: timeout=0 lifts the role's limit.
            role = dataclasses.replace(role, timeout=math.inf)
        model = self.models(pick_model(config.model, role.model, self.parent_model))
        messages = rebuild_transcript(
            role.prompt, entries, shared_context=config.shared_context, interrupted=interrupted
        )
        tools = {**self.extra_tools, **(extra_tools or {})}
        return role_conversation(
            role,
            model,
            self.workspace,
            extra_tools=tools,
            messages=messages,
            sandbox=self.sandbox,
            journal=journal,
        )

    async def open(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        extra_tools: Mapping[str, Tool] | None = None,
        journal: CallJournal | None = None,
    ) -> LocalRun:
        """`extra_tools`: tools for this child only (its control tools, when
        the nesting depth allows it a control plane of its own); `journal`
        records its tool calls' starts (at most once across crashes)."""
        return LocalRun(self._conversation(spec, config, (), extra_tools, journal))

    async def reopen(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        entries: Sequence[str | ChildEvent],
        task_id: str = "",
        context_id: str = "",
        extra_tools: Mapping[str, Tool] | None = None,
        journal: CallJournal | None = None,
        interrupted: Collection[str] | None = None,
    ) -> LocalRun:
        """A child resumed from its stored transcript (crash recovery);
        `interrupted`: ids of its calls a crash interrupted (never re-run)."""
        return LocalRun(
            self._conversation(spec, config, entries, extra_tools, journal, interrupted)
        )
