"""The spawn policy: what a parent lets a child do, decided at spawn.

A policy sees a `SpawnRequest` (the session, the parent, the target agent
and the child's config as asked) and answers `None` (as asked),
`Narrow(...)` or `Deny(reason)`. Rules come from Python (any callable, sync
or async) or from a TOML file beside the hooks (`.a2a/policy.toml`):

    [[rule]]
    agent = "coder"             # agent name or role; omitted: every child
    parent = ""                 # the parent's role or agent, "" the session's root; omitted: any
    transport = "remote"        # local or remote; omitted: both
    tools = ["read_file", "list_files", "grep"]
    network = false
    budget = { tokens = 20000, model_calls = 8 }

    [[rule]]
    agent = "deployer"
    deny = "agents do not deploy"

Contract: narrowing only. `SpawnPolicy.apply` folds every matching rule's
answer into the config, and nothing it does can widen what the role allows:
tools are intersected with those asked for (else the role's own), so a tool
the role lacks is dropped; a budget takes the smaller limit of each kind;
the network can only be turned off (`network = true` is refused when the
rule is made); a pinned model must be one the role offers (else the spawn
is refused); a work directory only narrows (in-process children only: a
remote child works in its role server's own directory, and a rule that
narrows the work directory of one refuses the spawn). The narrowed config is
the one stored with the child and sent to its role server, which checks it
again (`overrides.py`). The first `Deny` refuses the spawn.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeAlias

from pydantic import StrictStr

from ..configfile import Flag, NameList, OperatorFile, check
from ..errors import ConfigError, OrchestratorError, SpawnRefusedError
from ..runtime.budgets import Budget, BudgetError
from ..runtime.lookup import toml_tables
from ..runtime.overrides import offered_models, operator_models
from ..runtime.roles import Role, find_role, read_roles
from .base import ChildConfig
from .hooks import Deny
from .network import AgentSpec

__all__ = [
    "Narrow",
    "Policy",
    "SpawnPolicy",
    "SpawnRequest",
    "load_policy_file",
]


@dataclass(frozen=True, kw_only=True)
class SpawnRequest:
    """What a policy is asked about: one child about to be spawned."""

    session_id: str
    parent_id: str
    """The parent's child id; "" for the session's root."""
    parent_role: str
    """The parent's role; "" for the session's root."""
    agent: AgentSpec
    """The target agent (name, role, URL when remote)."""
    config: ChildConfig
    """The child's config as asked (and as narrowed by earlier rules)."""

    @property
    def remote(self) -> bool:
        return self.agent.remote


@dataclass(frozen=True, kw_only=True)
class Narrow:
    """What a policy narrows; `None` leaves a field as asked."""

    tools: tuple[str, ...] | None = None
    """At most these tools (intersected with those asked for, or the role's)."""
    model: str | None = None
    """Pin the model; it must be one the role offers."""
    budget: Budget | None = None
    """At most this budget (the smaller limit of each kind)."""
    network: bool | None = None
    """False turns the network off for the child's commands; True is refused."""
    workdir: str | None = None
    """A subdirectory of the session's work directory (in-process children)."""

    def __post_init__(self) -> None:
        if self.network is True:
            raise ConfigError(
                "a spawn policy can only turn a child's network off (network = false), "
                "never on: that is the operator's sandbox setting"
            )
        if self.tools is not None and isinstance(self.tools, str):
            raise ConfigError("a spawn policy's tools must be a list of names")


Verdict: TypeAlias = "Narrow | Deny | None"
Policy: TypeAlias = Callable[[SpawnRequest], "Verdict | Awaitable[Verdict]"]
"""A policy rule: a callable (sync or async) answering a `SpawnRequest`."""


class SpawnPolicy:
    """The rules a session applies to every spawn, in order."""

    def __init__(self, rules: Sequence[Policy] = (), *, cwd: Path | None = None) -> None:
        """`cwd`: where role files are looked up (default: the process's);
        they are read now, as the policy is made at start (`roles.read_roles`)."""
        self.rules: list[Policy] = list(rules)
        self.cwd = cwd
        read_roles(cwd)

    def add(self, rule: Policy) -> Policy:
        """Add a rule (usable as a decorator)."""
        self.rules.append(rule)
        return rule

    async def apply(self, request: SpawnRequest) -> ChildConfig:
        """The config the child gets; `SpawnRefusedError` when a rule denies,
        `ConfigError` when a rule asks for what the role does not allow."""
        config = request.config
        role = self._role(request.agent)
        for rule in self.rules:
            verdict = rule(replace(request, config=config))
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if isinstance(verdict, Deny):
                raise SpawnRefusedError(f"Subagent spawn denied by policy: {verdict.reason}")
            if isinstance(verdict, Narrow):
                config = narrow_config(config, verdict, role, remote=request.remote)
            elif verdict is not None:
                raise ConfigError(
                    f"a spawn policy answered {type(verdict).__name__}; "
                    "expected Narrow, Deny or None"
                )
        return config

    def _role(self, agent: AgentSpec) -> Role | None:
        try:
            return find_role(agent.role, cwd=self.cwd)
        except OrchestratorError:
            return None  # a foreign agent's role: its own server narrows further


def narrow_config(
    config: ChildConfig, narrow: Narrow, role: Role | None, *, remote: bool
) -> ChildConfig:
    """`config` narrowed by `narrow` (see the module docstring)."""
    changes: dict[str, Any] = {}
    if narrow.tools is not None:
        asked = config.tools if config.tools is not None else role.tools if role else None
        allowed = set(narrow.tools)
        # Order as asked; a tool the policy names that was not asked for (or
        # that the role lacks) is not added: a policy never widens.
        changes["tools"] = (
            tuple(t for t in asked if t in allowed) if asked is not None else narrow.tools
        )
    if narrow.model is not None:
        if role is not None:
            offered = offered_models(role, operator_models()) | {role.model}
            if narrow.model not in offered:
                raise ConfigError(
                    f"spawn policy: model {narrow.model!r} is not one role {role.name!r} "
                    f"offers ({', '.join(sorted(offered))})"
                )
        changes["model"] = narrow.model
    if narrow.budget is not None:
        changes["budget"] = (config.budget or Budget()).narrow(narrow.budget)
    if narrow.network is False:
        changes["network"] = False
    if narrow.workdir is not None:
        if remote:
            raise ConfigError(
                f"spawn policy narrows the work directory to {narrow.workdir!r}, which only "
                f"an in-process child can get: agent {config.role!r} is remote and works in "
                'its role server\'s own directory (limit the rule with transport = "local")'
            )
        changes["workdir"] = _narrower_dir(config.workdir, narrow.workdir)
    return replace(config, **changes) if changes else config


def _narrower_dir(asked: str | None, policy: str) -> str:
    """The policy's directory, or the one asked for when it lies inside it."""
    if asked is not None:
        inner, outer = PurePosixPath(asked), PurePosixPath(policy)
        if ".." not in inner.parts and inner.is_relative_to(outer):
            return asked
    return policy


class _RuleEntry(OperatorFile):
    """One `[[rule]]` table of a spawn policy file."""

    agent: StrictStr | None = None
    parent: StrictStr | None = None
    transport: Literal["local", "remote"] | None = None
    tools: NameList | None = None
    model: StrictStr | None = None
    budget: Any = None
    """Checked by `Budget.from_dict`, which a child's config shares."""
    network: Flag | None = None
    workdir: StrictStr | None = None
    deny: StrictStr | None = None


def _rule(where: str, entry: dict[str, Any]) -> Policy:
    fields = check(_RuleEntry, entry, where)
    try:
        budget = Budget.from_dict(fields.budget) if fields.budget is not None else None
        narrow = Narrow(
            tools=tuple(fields.tools) if fields.tools is not None else None,
            model=fields.model,
            budget=budget,
            network=fields.network,
            workdir=fields.workdir,
        )
    except BudgetError as exc:
        raise ConfigError(f"{where}: field {exc.field!r}: {exc.problem}") from exc
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    agent, parent, transport, deny = fields.agent, fields.parent, fields.transport, fields.deny

    def rule(request: SpawnRequest) -> Narrow | Deny | None:
        if agent is not None and agent not in (request.agent.name, request.agent.role):
            return None
        if parent is not None and parent != request.parent_role:
            return None
        if transport is not None and transport != ("remote" if request.remote else "local"):
            return None
        return Deny(deny) if deny is not None else narrow

    return rule


def load_policy_file(path: str | Path, policy: SpawnPolicy | None = None) -> SpawnPolicy:
    """Add the rules a TOML file declares; errors name the file and the rule."""
    policy = policy or SpawnPolicy()
    for where, entry in toml_tables(Path(path), "rule", "policy"):
        policy.add(_rule(where, entry))
    return policy
