"""Budgets: how much a child (and everything it spawns) may spend.

A `Budget` caps four kinds of spend, any of them unset: tokens (input +
output), wall time while running (seconds; paused time does not count, as
for `timeout`), model calls, and cost, computed from the operator's
`PriceTable`. A `Spend` is what was used, in the same kinds.

Contract:
- Budgets only narrow: `a.narrow(b)` takes the smaller limit of each kind,
  so the role file's budget, the child's config, a spawn policy and what is
  left of the parent's can be combined in any order with the same result.
- A child's budget covers its whole life (every turn) and its subtree:
  what its own children spend counts against it, and each child it spawns
  gets at most what is left (`Budget.left`).
- The runtime stops a child at the step where it would pass its budget:
  before a model call once a kind is used up (the call would pass it), and
  right after a model call whose tokens or cost passed it (its tool calls
  are not run). Wall time is a deadline.
- Prices are the operator's only (a file named by `A2A_PRICES`, or a
  `PriceTable` given in code), never a caller's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.base import Usage

__all__ = [
    "BUDGET_KINDS",
    "PRICES_ENV",
    "Budget",
    "BudgetError",
    "Meter",
    "Price",
    "PriceTable",
    "Spend",
]

BUDGET_KINDS = ("tokens", "seconds", "model_calls", "cost")
"""The kinds of spend a budget may cap, in the order errors and reports name them."""

PRICES_ENV = "A2A_PRICES"
"""The environment variable naming the operator's price table (a TOML file)."""

_WHOLE = frozenset({"tokens", "model_calls"})


class BudgetError(ConfigError):
    """A budget that does not validate; `field` names the part (`budget.tokens`)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True, kw_only=True)
class Spend:
    """What was spent: by one model call, one turn, one child or a subtree."""

    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0
    seconds: float = 0.0
    """Wall time while running (paused time not counted)."""
    cost: float = 0.0
    """In the price table's currency; 0 without a price for the model."""

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            model_calls=self.model_calls + other.model_calls,
            seconds=self.seconds + other.seconds,
            cost=self.cost + other.cost,
        )

    def __sub__(self, earlier: Spend) -> Spend:
        """What was spent since `earlier` (a total read before this one;
        totals only grow, so nothing is below 0)."""
        return Spend(
            input_tokens=max(self.input_tokens - earlier.input_tokens, 0),
            output_tokens=max(self.output_tokens - earlier.output_tokens, 0),
            model_calls=max(self.model_calls - earlier.model_calls, 0),
            seconds=max(self.seconds - earlier.seconds, 0.0),
            cost=max(self.cost - earlier.cost, 0.0),
        )

    def amount(self, kind: str) -> float:
        """The spend of one of `BUDGET_KINDS`."""
        return self.tokens if kind == "tokens" else getattr(self, kind)

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "model_calls": self.model_calls,
            "seconds": round(self.seconds, 3),
            "cost": round(self.cost, 6),
        }

    def describe(self) -> str:
        """One line for people: `130 tokens (100 in, 30 out), 2 model calls, 0.4 s`."""
        text = (
            f"{self.tokens} tokens ({self.input_tokens} in, {self.output_tokens} out), "
            f"{self.model_calls} model calls, {self.seconds:.1f} s"
        )
        return text + (f", cost {self.cost:.4f}" if self.cost else "")

    @classmethod
    def from_dict(cls, data: object) -> Spend:
        """Read a stored or decoded spend; what is missing or malformed counts 0."""
        if not isinstance(data, Mapping):
            return cls()

        def number(key: str) -> float:
            value = data.get(key, 0)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            return float(value) if ok and math.isfinite(value) else 0.0

        return cls(
            input_tokens=int(number("input_tokens")),
            output_tokens=int(number("output_tokens")),
            model_calls=int(number("model_calls")),
            seconds=number("seconds"),
            cost=number("cost"),
        )

    @classmethod
    def of_call(cls, usage: Usage, cost: float = 0.0) -> Spend:
        """One model call's spend."""
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            model_calls=1,
            cost=cost,
        )


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Limits on spend; `None` leaves a kind unlimited."""

    tokens: int | None = None
    """Input plus output tokens."""
    seconds: float | None = None
    """Wall time while running."""
    model_calls: int | None = None
    cost: float | None = None
    """In the price table's currency (needs a price for the child's model)."""

    @property
    def empty(self) -> bool:
        """No kind is limited."""
        return all(getattr(self, kind) is None for kind in BUDGET_KINDS)

    def narrow(self, other: Budget | None) -> Budget:
        """The smaller limit of each kind (an unset one is no limit)."""
        if other is None:
            return self
        values: dict[str, Any] = {}
        for kind in BUDGET_KINDS:
            mine, theirs = getattr(self, kind), getattr(other, kind)
            values[kind] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
        return Budget(**values)

    def left(self, spent: Spend) -> Budget:
        """What is left after `spent` (never below 0)."""
        values: dict[str, Any] = {}
        for kind in BUDGET_KINDS:
            limit = getattr(self, kind)
            if limit is not None:
                rest = max(limit - spent.amount(kind), 0)
                values[kind] = int(rest) if kind in _WHOLE else rest
        return replace(self, **values)

    def used_up(self, spent: Spend) -> str | None:
        """The first kind `spent` has reached: no further model call fits."""
        for kind in BUDGET_KINDS:
            limit = getattr(self, kind)
            if limit is not None and spent.amount(kind) >= limit:
                return kind
        return None

    def passed(self, spent: Spend) -> str | None:
        """The first kind `spent` has gone over."""
        for kind in BUDGET_KINDS:
            limit = getattr(self, kind)
            if limit is not None and spent.amount(kind) > limit:
                return kind
        return None

    def wider_than(self, other: Budget) -> list[str]:
        """The kinds this budget sets above `other`'s limit (a kind it leaves
        unset is not wider: `other`'s limit still applies to it)."""
        wider = []
        for kind in BUDGET_KINDS:
            limit, cap = getattr(self, kind), getattr(other, kind)
            if cap is not None and limit is not None and limit > cap:
                wider.append(kind)
        return wider

    def as_dict(self) -> dict[str, Any]:
        return {
            kind: getattr(self, kind) for kind in BUDGET_KINDS if getattr(self, kind) is not None
        }

    def describe(self) -> str:
        return ", ".join(f"{kind} {value:g}" for kind, value in self.as_dict().items()) or "none"

    @classmethod
    def from_dict(cls, data: object, *, field: str = "budget") -> Budget:
        """Check a budget object (a config, a role file, a policy); `ConfigError`
        names the field (`budget.tokens`). Numbers may arrive as doubles
        (A2A metadata): 5.0 is still a whole number of tokens."""
        if isinstance(data, Budget):
            return data
        if not isinstance(data, Mapping):
            raise BudgetError(field, f"must be an object with {', '.join(BUDGET_KINDS)}")
        unknown = [str(key)[:40] for key in data if key not in BUDGET_KINDS]
        if unknown:
            raise BudgetError(
                f"{field}.{unknown[0]}", f"unknown budget kind; known: {', '.join(BUDGET_KINDS)}"
            )
        values: dict[str, Any] = {}
        for kind in BUDGET_KINDS:
            value = data.get(kind)
            if value is None:
                continue
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value <= 0:
                raise BudgetError(
                    f"{field}.{kind}", f"must be a positive number, got {value!r:.40}"
                )
            if kind in _WHOLE and not float(value).is_integer():
                raise BudgetError(f"{field}.{kind}", f"must be a whole number, got {value!r}")
            values[kind] = int(value) if kind in _WHOLE else float(value)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class Price:
    """What one model costs, per million tokens."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        return (usage.input_tokens * self.input + usage.output_tokens * self.output) / 1e6


@dataclass(frozen=True)
class PriceTable:
    """The operator's prices by model name (as the model reports its name).

    The file:

        [models."gpt-4o"]
        input = 2.50      # per million input tokens
        output = 10.00    # per million output tokens
    """

    prices: Mapping[str, Price]

    def price(self, model: str) -> Price | None:
        return self.prices.get(model)

    @classmethod
    def load(cls, path: str | Path) -> PriceTable:
        """The table in the TOML file at `path`; a `ConfigError` names the
        file and the key of a bad one."""
        # Imported here: its schema imports pydantic, which `--help` and the
        # commands that read no table never need.
        from .prices import read_prices

        prices = read_prices(Path(path))
        return cls({name: Price(input=i, output=o) for name, (i, o) in prices.items()})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> PriceTable:
        """The table `A2A_PRICES` names; an empty one when it is unset."""
        path = environ.get(PRICES_ENV, "").strip()
        return cls.load(path) if path else cls({})


class Meter:
    """One child's spend against its budget, as its runtime keeps it.

    `spent` is the child's whole life so far; `turn` the running turn's
    (seeded, for a turn continued after a crash, with what it spent before);
    `below` reads what the child's own children spent (their wall time runs
    inside the child's own, so it is not added). A turn's `cap` (a role
    server's per-caller limit) counts that turn only.
    """

    def __init__(
        self,
        budget: Budget | None = None,
        *,
        price: Price | None = None,
        spent: Spend | None = None,
        turn: Spend | None = None,
        below: Callable[[], Awaitable[Spend]] | None = None,
        model: str = "",
    ) -> None:
        self.budget = budget if budget is not None and not budget.empty else None
        if self.budget is not None and self.budget.cost is not None and price is None:
            raise ConfigError(
                f"a cost budget needs a price for model {model!r} in the price table ({PRICES_ENV})"
            )
        self.price = price
        self.spent = spent or Spend()
        self.turn = Spend()
        self.cap: Budget | None = None
        self._resumed = turn or Spend()
        self._below = below

    def start_turn(self, *, continued: bool, cap: Budget | None) -> None:
        """A new turn (or, `continued`, the one a crash cut, with its spend)."""
        self.turn = self._resumed if continued else Spend()
        self._resumed = Spend()
        self.cap = cap if cap is not None and not cap.empty else None

    def add(self, spend: Spend) -> None:
        self.turn = self.turn + spend
        self.spent = self.spent + spend

    def add_call(self, usage: Usage) -> Spend:
        """Count one model call; its spend (with its cost, when priced)."""
        step = Spend.of_call(usage, self.price.cost(usage) if self.price is not None else 0.0)
        self.add(step)
        return step

    def seconds_left(self) -> float | None:
        """The wall time left for this turn (None: no wall-time budget)."""
        return self.budget.left(self.spent).seconds if self.budget is not None else None

    async def total(self) -> Spend:
        if self._below is None:
            return self.spent
        below = await self._below()
        return self.spent + replace(below, seconds=0.0)

    async def over(self, *, before_call: bool) -> str | None:
        """The kind the next model call would pass (`before_call`), or the
        last one passed; `cap:<kind>` for the turn's cap; None when within."""
        if self.budget is not None:
            total = await self.total()
            kind = self.budget.used_up(total) if before_call else self.budget.passed(total)
            if kind is not None:
                return kind
        if self.cap is not None:
            check = self.cap.used_up if before_call else self.cap.passed
            kind = check(self.turn)
            if kind is not None:
                return "cap:" + kind
        return None

    async def exhausted(self, kind: str) -> str:
        """The message of a child stopped by `kind` (from `over`): the limit
        and what was spent."""
        if kind.startswith("cap:"):
            kind = kind.removeprefix("cap:")
            limit = getattr(self.cap, kind)
            return (
                f"budget exhausted: {kind} {self.turn.amount(kind):g} of the {limit:g} "
                f"this caller may still use on this server today "
                f"(this turn spent {self.turn.describe()})"
            )
        total = await self.total()
        limit = getattr(self.budget, kind)
        whose = "this child and its children" if self._below else "this child"
        return (
            f"budget exhausted: {kind} {total.amount(kind):g} of {limit:g} "
            f"({whose} spent {total.describe()})"
        )
