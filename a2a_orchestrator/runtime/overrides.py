"""`Overrides`: what one child changes in its role, checked field by field.

A child's configuration (`ChildConfig.overrides()`) reaches a role from two
kinds of caller, and the two are trusted differently:

- The operator's own Python code (the in-process transport). `parse_overrides`
  checks the types; beyond that the operator may ask for anything its role
  files and model settings allow (a model script, bigger limits).
- A caller over A2A (the first message's metadata under `wire.CONFIG_KEY`).
  `check_wire_overrides` checks the same types, then narrows: limits only
  shrink, tools are a subset of the role's, a budget is no wider than the
  role's, the network can only be turned off, and the model is one of the
  names the operator offers (`offered_models`). A model script or a file path is
  never taken from the wire, so no caller can make the server read a file.

Every problem is a `ConfigError` whose message names the field and never
repeats more than a short piece of the offending value.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..models.base import ChatMessage
from .budgets import Budget, BudgetError
from .roles import Role

__all__ = [
    "BUILTIN_MODELS",
    "OVERRIDE_FIELDS",
    "Overrides",
    "check_wire_overrides",
    "offered_models",
    "operator_models",
    "parse_overrides",
]

OVERRIDE_FIELDS = (
    "system_prompt",
    "tools",
    "model",
    "max_turns",
    "timeout",
    "shared_context",
    "budget",
    "network",
)
"""The fields a child's configuration may carry (`ChildConfig.overrides()`)."""

BUILTIN_MODELS = ("default", "mini")
"""Model names every role server that chooses models per child offers."""

_MESSAGE_ROLES = frozenset({"system", "user", "assistant", "tool"})
_SCRIPTED = "scripted"
# How much of a caller's value an error message repeats: enough to recognise
# it, never a whole (possibly huge) payload.
_ECHO = 60


@dataclass(frozen=True, kw_only=True)
class Overrides:
    """A child's changes to its role, each field type-checked; `None` keeps the role's."""

    system_prompt: str | None = None
    """Replaces the role's system prompt."""
    tools: tuple[str, ...] | None = None
    """A subset of the role's tools."""
    model: str | None = None
    """A model name, resolved by the server's model resolver."""
    max_turns: int | None = None
    """Model calls per turn."""
    timeout: float | None = None
    """Seconds per turn."""
    shared_context: tuple[ChatMessage, ...] = ()
    """Messages the child starts with."""
    budget: Budget | None = None
    """Narrows the role's budget (the smaller limit of each kind)."""
    network: bool | None = None
    """False turns the network off for the child's commands; never True."""

    def apply(self, role: Role) -> Role:
        """The role with these changes; a child may narrow the role's tools,
        budget and network, never widen them."""
        if self.tools is not None:
            extra = [t for t in self.tools if t not in role.tools]
            if extra:
                raise ConfigError(
                    f"child config field 'tools': role {role.name!r} has no tools {extra}; "
                    f"its tools: {', '.join(role.tools)}"
                )
        role = role.with_overrides(
            prompt=self.system_prompt,
            tools=self.tools,
            max_turns=self.max_turns,
            timeout=self.timeout,
        )
        if self.budget is not None:
            base = role.budget or Budget()
            role = dataclasses.replace(role, budget=base.narrow(self.budget))
        if self.network is False:
            role = dataclasses.replace(role, no_network=True, sandbox_network=False)
        return role


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _ECHO else text[: _ECHO - 3] + "..."


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _fail(field: str, problem: str) -> ConfigError:
    return ConfigError(f"child config field {field!r}: {problem}")


def _text(data: Mapping[str, Any], field: str) -> str | None:
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(field, f"must be a non-empty string, got {_kind(value)}")
    return value


def _tools(data: Mapping[str, Any]) -> tuple[str, ...] | None:
    value = data.get("tools")
    if value is None:
        return None
    if isinstance(value, str):
        # A bare string is iterable too: without this check "read_file"
        # would be read as the tools 'r', 'e', 'a', ...
        raise _fail("tools", "must be a list of tool names, not a string")
    if not isinstance(value, list | tuple) or not all(
        isinstance(name, str) and name for name in value
    ):
        raise _fail("tools", f"must be a list of tool names, got {_kind(value)}")
    return tuple(value)


def _max_turns(data: Mapping[str, Any]) -> int | None:
    value = data.get("max_turns")
    if value is None:
        return None
    # Numbers in A2A metadata travel as a protobuf Struct, where every number
    # is a double: 5 arrives as 5.0 and is still a whole number of turns.
    whole = isinstance(value, int) or (
        isinstance(value, float) and math.isfinite(value) and value.is_integer()
    )
    if isinstance(value, bool) or not whole or value <= 0:
        raise _fail("max_turns", f"must be a positive integer, got {_short(value)}")
    return int(value)


def _timeout(data: Mapping[str, Any]) -> float | None:
    value = data.get("timeout")
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise _fail("timeout", f"must be a positive number of seconds, got {_short(value)}")
    return float(value)


def _shared_context(data: Mapping[str, Any]) -> tuple[ChatMessage, ...]:
    value = data.get("shared_context")
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise _fail("shared_context", f"must be a list of chat messages, got {_kind(value)}")
    messages: list[ChatMessage] = []
    for index, message in enumerate(value):
        where = f"shared_context[{index}]"
        if not isinstance(message, Mapping):
            raise _fail(where, f"must be a chat message object, got {_kind(message)}")
        role = message.get("role")
        if role not in _MESSAGE_ROLES:
            raise _fail(f"{where}.role", f"must be one of {', '.join(sorted(_MESSAGE_ROLES))}")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise _fail(f"{where}.content", f"must be a string or a list, got {_kind(content)}")
        messages.append(dict(message))
    return tuple(messages)


def _budget(data: Mapping[str, Any]) -> Budget | None:
    value = data.get("budget")
    if value is None:
        return None
    try:
        return Budget.from_dict(value)
    except BudgetError as exc:
        raise _fail(exc.field, exc.problem) from exc


def _network(data: Mapping[str, Any]) -> bool | None:
    value = data.get("network")
    if value is None or value is False:
        return value
    if value is True:
        # The sandbox's network is the operator's to allow; a child (or a
        # policy) may only give it up.
        raise _fail("network", "can only be false: a child's network can be turned off, never on")
    raise _fail("network", f"must be false, got {_kind(value)}")


def parse_overrides(data: object) -> Overrides:
    """Check a child configuration's fields and types; `ConfigError` names the field."""
    if data is None:
        return Overrides()
    if not isinstance(data, Mapping):
        raise ConfigError(f"child config must be an object, got {_kind(data)}")
    unknown = [key for key in data if key not in OVERRIDE_FIELDS]
    if unknown:
        raise _fail(
            str(unknown[0])[:_ECHO], f"unknown field; known fields: {', '.join(OVERRIDE_FIELDS)}"
        )
    return Overrides(
        system_prompt=_text(data, "system_prompt"),
        tools=_tools(data),
        model=_text(data, "model"),
        max_turns=_max_turns(data),
        timeout=_timeout(data),
        shared_context=_shared_context(data),
        budget=_budget(data),
        network=_network(data),
    )


def operator_models(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The model names the operator offers besides `default`, `mini` and a
    role's `models`: `$A2A_MODELS`, comma-separated (as for `serve`)."""
    return tuple(n.strip() for n in environ.get("A2A_MODELS", "").split(",") if n.strip())


def offered_models(role: Role, operator: Iterable[str] = ()) -> frozenset[str]:
    """The model names a caller may choose: `default`, `mini`, the role file's
    `models` and the operator's list.

    Refuses (`ConfigError`, at start-up) a listed name that would load a
    model script: scripts are the operator's to set as a role's model or as
    `A2A_MODEL_DEFAULT`, never a caller's to pick. Names with a slash
    (`meta-llama/Llama-3.1-8B-Instruct`) are fine: only `scripted:` names
    ever reach the filesystem.
    """
    names = {*BUILTIN_MODELS, *role.models}
    for name in operator:
        name = name.strip()
        if name:
            names.add(name)
    scripted = sorted(n for n in names if n == _SCRIPTED or n.startswith(_SCRIPTED + ":"))
    if scripted:
        raise ConfigError(
            f"models offered to callers may not be model scripts ({', '.join(scripted)}); "
            "set a script as the role's model instead"
        )
    return frozenset(names)


def check_wire_overrides(data: object, role: Role, models: Collection[str]) -> Overrides:
    """A configuration sent by a caller over A2A, narrowed to what the operator allowed.

    `models` are the names the caller may pick (`offered_models`; empty when
    the server does not choose models per child). Refuses with `ConfigError`
    naming the field: a wrong type, a tool the role lacks, a limit above the
    role's own, or a model not offered (a script or a path is never offered,
    and the check is a set lookup: nothing touches the filesystem).
    """
    overrides = parse_overrides(data)
    if overrides.max_turns is not None and overrides.max_turns > role.max_turns:
        raise _fail(
            "max_turns",
            f"{overrides.max_turns} is over role {role.name!r}'s maximum of {role.max_turns}",
        )
    if overrides.timeout is not None and overrides.timeout > role.timeout:
        raise _fail(
            "timeout",
            f"{overrides.timeout:g} s is over role {role.name!r}'s maximum of {role.timeout:g} s",
        )
    if overrides.budget is not None and role.budget is not None:
        for kind in overrides.budget.wider_than(role.budget):
            raise _fail(
                f"budget.{kind}",
                f"{getattr(overrides.budget, kind)} is over role {role.name!r}'s maximum "
                f"of {getattr(role.budget, kind):g}",
            )
    if overrides.model is not None and overrides.model not in models:
        if not models:
            raise _fail("model", "this role server does not let callers choose a model")
        raise _fail(
            "model",
            f"{_short(overrides.model)} is not offered here; choose one of: "
            + ", ".join(sorted(models)),
        )
    # The tool subset is checked by the same code the local transport uses.
    overrides.apply(role)
    return overrides
