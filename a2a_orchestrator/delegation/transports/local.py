"""The in-process transport: a child's conversation runs in this process.

The same role files, tools, runtime and child-config rules as a role server
(`runtime/factory.py`), without HTTP; events come straight from the runtime. A
child's budget is kept by the same runtime code as on a role server; a child
whose config names a `workdir` works in that subdirectory of the session's
work directory. What the owner adds per child (its own control tools, the
tool journal, its subtree's spend) reaches the delegate when it is made.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath

from ...errors import ConfigError, OrchestratorError
from ...models.base import ChatMessage, Model
from ...observe import tracing
from ...runtime.budgets import Budget, Spend
from ...runtime.conversation import Conversation
from ...runtime.events import ChildEvent
from ...runtime.factory import (
    RoleRuntime,
    apply_child_config,
    control,
    role_conversation,
    spent_in,
)
from ...runtime.render import CANCELED_TEXT
from ...runtime.roles import find_role
from ...runtime.selectors import Selector
from ...runtime.transcript import rebuild_transcript
from ...storage.journal import CallJournal, JournalRow, ToolJournal, lost_announcements, unanswered
from ...tools import Sandbox, Tool, Workspace
from ...tools.sandbox import STATE_DIR
from ..base import ChildConfig, Emit, IdentityListener, Resume
from ..network import AgentSpec

__all__ = ["LocalDelegate", "LocalRun", "check_sandbox", "narrow_workspace", "pick_model"]

SpentBelow = Callable[[], Awaitable[Spend]]
ChildTools = Callable[[str, int], Mapping[str, Tool]]
"""Tools a child gets besides its role's, by child id and depth."""


def _journaled(
    entries: Sequence[str | ChildEvent], started: Sequence[JournalRow]
) -> tuple[list[str | ChildEvent], set[str]]:
    """A crashed child's entries and the calls to answer as interrupted.

    A child's events are written behind it (`outbox.py`) while its journal
    rows are written at once, so a crash can keep a call's announcement
    (`ToolCalled`) or its result from the store after the journal recorded
    its start or its close: every call that started without a stored result
    is interrupted (`journal.unanswered`), and a lost announcement is put
    back at the end, where the crash cut the turn (only the crashed turn can
    have lost events: a turn's end is stored after all of its events)."""
    open_calls = unanswered(started, entries)
    return [*entries, *lost_announcements(entries, open_calls)], {row.call_id for row in open_calls}


def narrow_workspace(workspace: Workspace, subdir: str) -> Workspace:
    """The workspace of `subdir`, an existing directory inside `workspace`
    (relative, no `..`, not the server's `.a2a`); `ConfigError` otherwise."""
    path = PurePosixPath(subdir)
    if not subdir.strip() or path.is_absolute() or ".." in path.parts:
        raise ConfigError(
            f"child config field 'workdir': {subdir!r} must be a relative path inside "
            "the work directory, without '..'"
        )
    if path.parts and path.parts[0] == STATE_DIR:
        raise ConfigError(f"child config field 'workdir': {subdir!r} is the server's own state")
    target = workspace.root / path
    try:
        real = target.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise ConfigError(f"child config field 'workdir': {subdir!r} does not exist") from exc
    if not real.is_relative_to(workspace.root) or not real.is_dir():
        raise ConfigError(
            f"child config field 'workdir': {subdir!r} is not a directory inside the work directory"
        )
    return Workspace(real)


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
    message_id = ""

    def __init__(self, conversation: Conversation, spent_below: SpentBelow | None = None) -> None:
        self.conversation = conversation
        self._spent_below = spent_below
        self.on_identity: IdentityListener | None = None

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
        control(self.conversation, "pause")

    async def resume(self) -> None:
        control(self.conversation, "resume")

    async def pause_on(self, rules: Mapping[str, Selector]) -> bool:
        """The conversation holds itself at an event a rule selects, before
        its next step (`Conversation.pause_on`): the parent's watchers hear
        of events beside the child's turn, not inside it, so their `pause()`
        would come a step late."""
        self.conversation.pause_on(rules)
        return True

    async def steer(self, text: str) -> bool:
        # Decided at once in this process: the loop either will read it or
        # has passed its last step boundary (then the handle opens a turn).
        return control(self.conversation, "steer", text)

    async def interrupt(self) -> None:
        control(self.conversation, "interrupt")

    async def history(self) -> list[ChatMessage]:
        return [dict(m) for m in self.conversation.messages]

    async def budget_left(self) -> Budget | None:
        budget = self.conversation.budget
        if budget is None:
            return None
        below = await self._spent_below() if self._spent_below is not None else Spend()
        # The children's time is their own: wall time is not summed over a subtree.
        spent = self.conversation.spent_now() + dataclasses.replace(below, seconds=0.0)
        return budget.left(spent)

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
        runtime: RoleRuntime | None = None,
        journal: ToolJournal | None = None,
        child_tools: ChildTools | None = None,
        spent_below: Callable[[str], Awaitable[Spend]] | None = None,
        on_conversation: Callable[[str, Conversation], None] | None = None,
    ) -> None:
        """`runtime`: where the children's commands run, the operator's
        price table and the spans they open (`factory.RoleRuntime`; default:
        no sandbox given, no prices, the tracer's spans).
        `journal` records the children's tool calls' starts, so each runs at
        most once across crashes; `child_tools` gives a child tools of its
        own (its control tools, when the nesting depth allows it a control
        plane); `spent_below` reads what a child's own children spent (its
        budget covers them); `on_conversation` is told each child's
        conversation once made (a child that is a parent gets its children's
        results there)."""
        self.workspace = workspace
        self.runtime = runtime or RoleRuntime(spans=tracing.CONVERSATION_SPANS)
        self.models = models
        self.parent_model = parent_model
        self.extra_tools = dict(extra_tools or {})
        self.cwd = cwd
        self.journal = journal
        self.child_tools = child_tools
        self.spent_below = spent_below
        self.on_conversation = on_conversation

    def _conversation(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        entries: Sequence[str | ChildEvent],
        extra_tools: Mapping[str, Tool] | None,
        journal: CallJournal | None,
        interrupted: Collection[str] | None = None,
        spent_below: SpentBelow | None = None,
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
        workspace, runtime = self.workspace, self.runtime
        if config.workdir is not None:
            workspace = narrow_workspace(self.workspace, config.workdir)
            # The session's own state stays hidden from a child working below it.
            base = runtime.sandbox if runtime.sandbox is not None else Sandbox.from_env()
            runtime = dataclasses.replace(
                runtime, sandbox=base.hiding(self.workspace.root / STATE_DIR)
            )
        spent, turn_spent = spent_in(entries)
        return role_conversation(
            role,
            model,
            workspace,
            runtime=runtime,
            extra_tools=tools,
            messages=messages,
            # A narrowed workspace is this child's own: its tools are not kept.
            reuse_tools=config.workdir is None,
            journal=journal,
            spent=spent,
            turn_spent=turn_spent,
            spent_below=spent_below,
        )

    async def open(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        depth: int = 1,
        resume: Resume | None = None,
    ) -> LocalRun:
        """A new child, or with `resume` one rebuilt from its stored
        transcript: what it spent is read from there (its budget goes on
        from it), and calls a crash interrupted are ended first and answered
        as interrupted, never run again."""
        journal: CallJournal | None = None
        interrupted: Collection[str] | None = None
        entries = resume.entries if resume is not None else ()
        if self.journal is not None:
            if resume is not None:
                # At most once: what the crashed runner's calls left running
                # is ended before anything resumes.
                await self.journal.recover(child_id)
                started = await self.journal.started_calls(child_id)
                entries, interrupted = _journaled(entries, started)
            journal = self.journal.scoped(child_id)
        extra = self.child_tools(child_id, depth) if self.child_tools is not None else None
        spent_below: SpentBelow | None = None
        if self.spent_below is not None:
            read = self.spent_below

            async def below() -> Spend:
                return await read(child_id)

            spent_below = below
        conversation = self._conversation(
            spec, config, entries, extra, journal, interrupted, spent_below
        )
        if self.on_conversation is not None:
            self.on_conversation(child_id, conversation)
        return LocalRun(conversation, spent_below)
