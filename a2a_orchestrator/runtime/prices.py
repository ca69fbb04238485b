"""The operator's price table file (`A2A_PRICES`), checked by its schema.

`budgets.PriceTable.load` imports this module when it reads a table, so
the commands that read none (`--help`, `status`) never import pydantic.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated

from pydantic import Field

from ..configfile import OperatorFile, check, must_be
from ..errors import ConfigError

__all__ = ["read_prices"]

_PerMillion = Annotated[
    float, Field(ge=0, allow_inf_nan=False), must_be("a number >= 0 (per 1M tokens)")
]


class _Price(OperatorFile):
    """A `[models.NAME]` table."""

    input: Annotated[_PerMillion, Field(description="the price of a million input tokens")]
    output: Annotated[_PerMillion, Field(description="the price of a million output tokens")]


class _PriceFile(OperatorFile):
    models: dict[str, _Price] = {}


def read_prices(path: Path) -> dict[str, tuple[float, float]]:
    """Each model's (input, output) price per million tokens, from the
    TOML file at `path`; a `ConfigError` naming the file and the key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read price table {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    table = check(_PriceFile, data, str(path))
    return {name: (price.input, price.output) for name, price in table.models.items()}
