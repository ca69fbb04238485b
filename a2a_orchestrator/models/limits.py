"""The model call limits and their checks, apart from the openai client.

`ModelSettings` reads and checks these at start-up; keeping them here lets it
do so without importing the openai package, which only `OpenAIModel` needs.
"""

from __future__ import annotations

import math

from ..errors import ConfigError

__all__ = ["DEFAULT_RETRIES", "DEFAULT_TIMEOUT", "check_retries", "check_timeout"]

DEFAULT_TIMEOUT = 15.0
"""Seconds without a byte from the endpoint before an attempt fails. With
`DEFAULT_RETRIES` a hung endpoint fails in about 47 s: under the 60 s a role's
turn gets by default, so the turn reports the model, not its own timeout."""

DEFAULT_RETRIES = 2
"""Attempts after the first for one model call."""


def check_timeout(value: object, what: str) -> float:
    """`value` as a timeout in seconds (0: no limit), else `ConfigError` naming `what`."""
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    ):
        return float(value)
    raise ConfigError(f"{what} must be a number of seconds, 0 for no limit, got {value!r}")


def check_retries(value: object, what: str) -> int:
    """`value` as a retry count, else `ConfigError` naming `what`."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{what} must be a whole number, 0 or more, got {value!r}")
