"""Which model a role gets: settings from the environment and name resolution.

Roles name their model as `default`, `mini`, a concrete name (`gpt-4.1`,
`llama3.1:8b`), or `scripted` / `scripted:<path>`. `resolve_model` turns that
name into a `Model`. With no endpoint configured at all (no base URL, no API
key) every non-scripted name resolves to a scripted model, and that model
says plainly that it is scripted: an offline run never pretends to be real.

Environment:

    A2A_MODEL_BASE_URL  (or OPENAI_BASE_URL)   any OpenAI-compatible /v1 endpoint
    A2A_MODEL_API_KEY   (or OPENAI_API_KEY)    its key; local servers need none
    A2A_MODEL_DEFAULT   model for `default`    (gpt-4o)
    A2A_MODEL_MINI      model for `mini`       (gpt-4o-mini)
    A2A_MODEL_SCRIPT    script file the scripted model replays
    A2A_MODEL_TIMEOUT   seconds without a byte before a model call is retried
                        or fails; 0 for no limit (15)
    A2A_MODEL_RETRIES   attempts after the first for one model call (2)

A role file's `model_timeout` and `model_retries` replace the last two for
that role (`limit_model`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .base import Model
from .limits import DEFAULT_RETRIES, DEFAULT_TIMEOUT, check_retries, check_timeout
from .scripted import ScriptedModel

__all__ = [
    "OFFLINE_NOTICE",
    "OFFLINE_SCRIPT",
    "ModelSettings",
    "describe_model",
    "is_scripted",
    "limit_model",
    "read_scripts",
    "resolve_model",
]

OFFLINE_NOTICE = (
    "model: scripted (offline) - no model endpoint is configured, so a scripted model "
    "replays recorded turns and no language model is called. To use a real model, set "
    "A2A_MODEL_BASE_URL and/or A2A_MODEL_API_KEY (or OPENAI_BASE_URL / OPENAI_API_KEY)."
)
"""The notice to print when the run is offline (`ModelSettings.offline`)."""

OFFLINE_SCRIPT: tuple[Mapping[str, Any], ...] = (
    {
        "text": (
            "This is the scripted offline model of a2a-orchestrator, not a language model. "
            "No model endpoint is configured, so this task was not worked on.\n"
            "To use a real model, set A2A_MODEL_BASE_URL to any OpenAI-compatible /v1 "
            "endpoint (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio) and, if it needs "
            "one, A2A_MODEL_API_KEY; OPENAI_BASE_URL / OPENAI_API_KEY work too.\n"
            "TASK_SKIPPED"
        )
    },
)
"""The one-turn script used offline when neither a script file nor a fallback is given."""

_SCRIPTED = "scripted"


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """Where models live and what `default` / `mini` mean."""

    base_url: str | None = None
    """The OpenAI-compatible endpoint; `None` means OpenAI's own."""
    api_key: str | None = field(default=None, repr=False)
    """The endpoint's key; `None` for local servers. Kept out of `repr`."""
    default: str = "gpt-4o"
    """The model a role gets for `default` (or no model at all)."""
    mini: str = "gpt-4o-mini"
    """The model a role gets for `mini`."""
    script: str | None = None
    """A script file for the scripted model (used offline and for `scripted`)."""
    timeout: float = DEFAULT_TIMEOUT
    """Seconds without a byte from the endpoint before a model call is retried
    or fails; 0 means no limit. A time between bytes, not for the whole answer."""
    retries: int = DEFAULT_RETRIES
    """Attempts after the first for one model call (dropped connections,
    silence, a stream cut short, HTTP 429 / 5xx)."""

    def __post_init__(self) -> None:
        # Checked here so a bad value fails at start-up, not at the first call.
        check_timeout(self.timeout, "model timeout")
        check_retries(self.retries, "model retries")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ModelSettings:
        """Read the `A2A_MODEL_*` variables, falling back to `OPENAI_*` for the
        endpoint and key. Empty values count as unset; a timeout or retry
        count that is not a number raises `ConfigError` naming the variable."""

        def get(*names: str) -> str | None:
            for name in names:
                value = environ.get(name, "").strip()
                if value:
                    return value
            return None

        return cls(
            base_url=get("A2A_MODEL_BASE_URL", "OPENAI_BASE_URL"),
            api_key=get("A2A_MODEL_API_KEY", "OPENAI_API_KEY"),
            default=get("A2A_MODEL_DEFAULT") or cls.default,
            mini=get("A2A_MODEL_MINI") or cls.mini,
            script=get("A2A_MODEL_SCRIPT"),
            timeout=_number(get("A2A_MODEL_TIMEOUT"), "A2A_MODEL_TIMEOUT", cls.timeout),
            retries=_count(get("A2A_MODEL_RETRIES"), "A2A_MODEL_RETRIES", cls.retries),
        )

    @property
    def offline(self) -> bool:
        """No endpoint configured at all: neither a base URL nor an API key."""
        return not self.base_url and not self.api_key


def resolve_model(
    name: str | None,
    settings: ModelSettings,
    *,
    fallback_script: Sequence[Mapping[str, Any]] | None = None,
) -> Model:
    """The `Model` for a role's model name.

    `None` and `"default"` mean `settings.default`, `"mini"` means
    `settings.mini`, other names pass through (so `A2A_MODEL_DEFAULT` may
    itself be `scripted:<path>`). `"scripted:<path>"` replays that file;
    `"scripted"` replays `settings.script`. When `settings.offline`, or for a
    bare `"scripted"` without a script file, the model is scripted from
    `settings.script`, else `fallback_script`, else `OFFLINE_SCRIPT`.
    A bad script file raises `ConfigError`. A script file is read once per
    process (the commands read the ones their configuration names at start,
    `read_scripts`): later resolutions replay that first read, whatever the
    file holds by then.
    """
    if name is None or name == "default":
        concrete = settings.default
    elif name == "mini":
        concrete = settings.mini
    else:
        concrete = name
    if concrete.startswith(_SCRIPTED + ":"):
        return _script(concrete.removeprefix(_SCRIPTED + ":"))
    if concrete == _SCRIPTED or settings.offline:
        return _offline_model(settings, fallback_script)
    # Imported here: the openai package is loaded only for an endpoint model.
    from .openai import OpenAIModel

    return OpenAIModel(
        concrete,
        base_url=settings.base_url,
        api_key=settings.api_key,
        timeout=settings.timeout,
        retries=settings.retries,
    )


def limit_model(model: Model, *, timeout: float | None, retries: int | None) -> Model:
    """`model` with a role's own model call limits (`None` keeps the operator's).

    Only a model that calls an endpoint has such limits; any other model (a
    scripted one, one of your own) is returned as it is. Bad values raise
    `ConfigError`.
    """
    if timeout is None and retries is None:
        return model
    from .openai import OpenAIModel  # here, not at the top: see resolve_model

    if isinstance(model, OpenAIModel):
        return model.with_limits(timeout=timeout, retries=retries)
    return model


def _number(raw: str | None, name: str, default: float) -> float:
    if raw is None:
        return default
    try:
        value: object = float(raw)
    except ValueError:
        value = raw  # refused by the check, which names the variable
    return check_timeout(value, name)


def _count(raw: str | None, name: str, default: int) -> int:
    if raw is None:
        return default
    try:
        value: object = int(raw)
    except ValueError:
        value = raw
    return check_retries(value, name)


def _offline_model(
    settings: ModelSettings, fallback_script: Sequence[Mapping[str, Any]] | None
) -> ScriptedModel:
    if settings.script:
        return _script(settings.script)
    if fallback_script is not None:
        return ScriptedModel(fallback_script)
    return ScriptedModel(OFFLINE_SCRIPT, name="scripted:offline")


# Script files read so far, by absolute path. A script is configuration: the
# first read is kept for the process's life, so a file a model's command
# rewrites between two spawns is not what the next child replays (the model
# is stateless, so one instance serves every conversation). A file read at
# start (`read_scripts`) that could not be had keeps its refusal.
_scripts: dict[str, ScriptedModel | ConfigError] = {}


def _script(path: str) -> ScriptedModel:
    key = os.path.abspath(path)
    found = _scripts.get(key)
    if found is None:
        # Not named at start (the Python API): read at its first use; a
        # broken file is refused each time, never kept.
        found = _scripts.setdefault(key, ScriptedModel.from_file(path))
    if isinstance(found, ConfigError):
        # The same refusal each time, not a traceback that grows with each raise.
        raise found.with_traceback(None)
    return found


def read_scripts(names: Iterable[str | None], settings: ModelSettings) -> None:
    """Read now every script file the model names `names` (the roles'
    models) and `settings` (`default`, `mini`, `A2A_MODEL_SCRIPT`) lead to.

    The commands that run models call it at start, before any model runs
    (`commands`): a role whose first child comes later in the run then
    replays the file as it was at start, never one a command wrote since. A
    file that cannot be read or parsed now is refused, with this error,
    each time a model resolves to it; it is not read again.
    """
    paths = [settings.script] if settings.script else []
    for name in (*names, "default", "mini"):
        concrete = {None: settings.default, "default": settings.default, "mini": settings.mini}
        model = concrete.get(name, name) or settings.default
        if model.startswith(_SCRIPTED + ":"):
            paths.append(model.removeprefix(_SCRIPTED + ":"))
    for path in paths:
        key = os.path.abspath(path)
        if key not in _scripts:
            try:
                _scripts[key] = ScriptedModel.from_file(path)
            except ConfigError as exc:
                _scripts[key] = exc


def is_scripted(model: Model) -> bool:
    """Whether `model` replays a script instead of calling a language model."""
    return bool(getattr(model, "scripted", False))


def describe_model(model: Model) -> str:
    """One line for humans saying which model runs, and plainly if it is scripted."""
    if is_scripted(model):
        return f"model: scripted (offline) - {model.name} replays recorded turns, no language model"
    base_url = getattr(model, "base_url", None)
    return f"model: {model.name} at {base_url}" if base_url else f"model: {model.name}"
