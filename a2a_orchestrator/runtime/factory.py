"""The runtime's conversation factory: a role, as one child asked for it, made
into a `Conversation`, and the control actions a running conversation takes.

Written once for both places a role runs: the role server (`executor.py`)
and the in-process transport (`transports/local.py`), so a child gets the
same tools, limits, budget and control there as over A2A, and neither place
imports the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..models.base import ChatMessage, Model
from ..models.config import limit_model
from ..tools import TOOL_NAMES, Sandbox, Tool, Workspace, build_tools
from .budgets import Meter, PriceTable, Spend
from .conversation import ASK_PARENT, Conversation
from .events import ChildEvent, Done, Failed, InputRequired
from .journal import Journal
from .overrides import Overrides, parse_overrides
from .pausing import HOLD_LIMIT
from .render import INTERRUPTED_TEXT
from .roles import Role
from .spans import NO_SPANS, Spans

__all__ = [
    "CONTROL_ACTIONS",
    "CONTROL_TOOL_NAMES",
    "HOLD_LIMIT",
    "RoleRuntime",
    "apply_child_config",
    "control",
    "role_conversation",
    "spent_in",
]

CONTROL_TOOL_NAMES = frozenset(
    {"agent", "agent_manage", "agent_abort", "spawn_agent", "wait_agent", "send_message"}
    | {"supervisor"}
)
"""Tools a role may list that the control plane provides when the role runs
as a parent; a bare role server does not offer them."""


def apply_child_config(role: Role, overrides: Mapping[str, Any] | Overrides) -> Role:
    """The role as one child asked for it: a prompt, fewer tools, other limits.

    The fields' types are checked (`ConfigError` naming the field); a child
    may narrow the role's tools, never widen them. Nothing else is narrowed:
    callers over A2A go through `check_wire_overrides` first.
    """
    if not isinstance(overrides, Overrides):
        overrides = parse_overrides(overrides)
    return overrides.apply(role)


@dataclass(frozen=True, kw_only=True)
class RoleRuntime:
    """The operator's side of every conversation one owner builds (a role
    server, the in-process transport, a parent agent): given once to the
    owner, passed to `role_conversation` as it is."""

    sandbox: Sandbox | None = None
    """Where `run_command` runs commands (None: `Sandbox.from_env()`)."""
    prices: PriceTable | None = None
    """The operator's price table (a cost budget needs its model's price)."""
    spans: Spans = NO_SPANS
    """The spans its conversations open (the tracer's, `observe/tracing.py`)."""


def role_conversation(
    role: Role,
    model: Model,
    workspace: Workspace,
    *,
    runtime: RoleRuntime = RoleRuntime(),
    extra_tools: Mapping[str, Tool] | None = None,
    messages: Sequence[ChatMessage] | None = None,
    journal: Journal | None = None,
    spent: Spend | None = None,
    turn_spent: Spend | None = None,
    spent_below: Callable[[], Awaitable[Spend]] | None = None,
    reuse_tools: bool = True,
) -> Conversation:
    """A conversation with exactly the tools the role lists, within the role's budget.

    `runtime.sandbox` is the operator's policy for `run_command` (default:
    `Sandbox.from_env()`), with the network allowed too when the role file
    says `sandbox_network: true`, and never when the child's config turned it
    off (`Role.no_network`). Raises `ConfigError` when the role lists
    `run_command` and that sandbox cannot be had on this machine, or when it
    has a cost budget and `runtime.prices` has no price for its model. `spent`,
    `turn_spent` and `spent_below` go to the `Conversation`. `reuse_tools`
    (`build_tools`' `reuse`): False for a workspace made for this
    conversation alone.
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
        sandbox = runtime.sandbox
        policy = (sandbox if sandbox is not None else Sandbox.from_env()).allowing_network(
            role.sandbox_network
        )
        if role.no_network:
            policy = dataclasses.replace(policy, network=False)
    tools = build_tools(
        [name for name in role.tools if name in TOOL_NAMES],
        workspace,
        command_timeout=min(role.timeout, 600.0),
        sandbox=policy,
        reuse=reuse_tools,
    )
    tools += [extra[name] for name in role.tools if name in extra]
    prices = runtime.prices
    price = prices.price(model.name) if prices is not None else None
    meter = Meter(
        role.budget, price=price, spent=spent, turn=turn_spent, below=spent_below, model=model.name
    )
    return Conversation(
        # The role file's model_timeout / model_retries, where it sets them.
        model=limit_model(model, timeout=role.model_timeout, retries=role.model_retries),
        system_prompt=role.prompt,
        tools=tools,
        ask_parent=ASK_PARENT in role.tools,
        max_turns=role.max_turns,
        timeout=role.timeout,
        role=role.name,
        messages=messages,
        journal=journal,
        meter=meter,
        spans=runtime.spans,
    )


def spent_in(entries: Sequence[str | ChildEvent]) -> tuple[Spend, Spend]:
    """What a child's stored transcript says it spent: (its finished turns',
    the turn in progress at its end). A finished turn's spend is on the event
    that ended it; a turn a crash cut has only its steps' spend."""
    finished = Spend()
    running = Spend()
    for entry in entries:
        if isinstance(entry, Done | Failed | InputRequired):
            finished = finished + entry.spent
            running = Spend()
        elif not isinstance(entry, str):
            step = getattr(entry, "spent", None)
            if step is not None:
                running = running + step
    return finished, running


CONTROL_ACTIONS = ("pause", "resume", "interrupt", "steer", "pause_on")
"""The control extension's actions: what a caller may do to a running turn.
All but `pause_on` act on the conversation (`control`); `pause_on` replaces
the pause rules of whoever holds the turn (a role server's executor)."""


def control(conversation: Conversation, action: str, text: str = "") -> bool:
    """Pause, resume, interrupt or steer `conversation` (in this process or
    on a role server alike). True when done; for `steer`, False when no turn
    runs or it has passed its last step boundary (then nothing was queued,
    and the caller gives the text a turn of its own)."""
    if action == "pause":
        conversation.pause()
    elif action == "resume":
        conversation.resume()
    elif action == "interrupt":
        conversation.resume()
        conversation.abort("aborted", INTERRUPTED_TEXT)
    elif action == "steer":
        return conversation.offer(text)
    else:
        raise ValueError(f"unknown control action {action!r}")
    return True
