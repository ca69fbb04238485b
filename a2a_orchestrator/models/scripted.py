"""`ScriptedModel`: a `Model` that replays recorded turns (tests, the offline demo).

It is stateless on purpose: the turn to play is the number of assistant
messages already in the conversation. One instance therefore serves any
number of concurrent conversations, and a conversation resumed after a restart
continues where its transcript left off.

A script file is a JSON or YAML list of turns (or a mapping with a `turns`
list); each turn is a mapping with the fields of `ScriptedTurn`:

    - text: "I'll look at the file first."
      tool_calls:
        - {name: read_file, arguments: {path: README.md}}
    - text: "Done."
      usage: {input_tokens: 120, output_tokens: 3}
    - error: "simulated outage"      # raises ModelError
    - text: "slow"
      delay: 5                       # seconds before answering
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeAlias

import anyio
import anyio.lowlevel
import yaml

from ..errors import ConfigError, ModelError
from .base import ChatMessage, ModelItem, TextDelta, ToolCall, ToolSpec, Usage

__all__ = [
    "ScriptFunction",
    "ScriptedModel",
    "ScriptedToolCall",
    "ScriptedTurn",
    "TurnLike",
]

# Words per TextDelta: small enough that every multi-word answer streams as
# several deltas, so consumers of deltas are exercised by every test.
_WORDS_PER_DELTA = 3


@dataclass(frozen=True, kw_only=True)
class ScriptedToolCall:
    """A tool call a scripted turn makes."""

    name: str
    """The tool's name."""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    """The arguments object, as the model would send it."""
    id: str | None = None
    """The call id; `None` means `call_<turn>_<i>` (deterministic across runs)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScriptedToolCall:
        """Build from `{name, arguments, id?}`; `arguments` may be a JSON string.

        Raises `ValueError` describing the first problem found.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a tool call must be a mapping, got {type(data).__name__}")
        if set(data) - {"name", "arguments", "id"}:
            # The unknown names are not repeated: errors never echo a file's text.
            raise ValueError("unknown tool call field; a tool call has: name, arguments, id")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("a tool call needs a non-empty string 'name'")
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        if not isinstance(arguments, Mapping):
            raise ValueError(f"tool call {name!r}: 'arguments' must be a mapping")
        call_id = data.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ValueError(f"tool call {name!r}: 'id' must be a string")
        return cls(name=name, arguments=dict(arguments), id=call_id)


@dataclass(frozen=True, kw_only=True)
class ScriptedTurn:
    """One recorded assistant turn."""

    text: str = ""
    """The assistant's text, streamed as several deltas."""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    """The tool calls the turn makes, after its text."""
    usage: Usage | None = None
    """Token usage to report; `None` means a rough count of words (never zero)."""
    delay: float = 0.0
    """Seconds to wait before answering (cancellable), to make a turn slow."""
    error: str | None = None
    """If set, the turn raises `ModelError` with this message (after `delay`)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScriptedTurn:
        """Build from a mapping with the fields above; `tool_calls` items are
        `{name, arguments}` mappings and `usage` is `{input_tokens, output_tokens}`.

        Raises `ValueError` describing the first problem found.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a turn must be a mapping, got {type(data).__name__}")
        if set(data) - {"text", "tool_calls", "usage", "delay", "error"}:
            # The unknown names are not repeated: errors never echo a file's text.
            raise ValueError(
                "unknown turn field; a turn has: text, tool_calls, usage, delay, error"
            )
        text = data.get("text") or ""
        if not isinstance(text, str):
            raise ValueError("'text' must be a string")
        raw_calls = data.get("tool_calls") or []
        if not isinstance(raw_calls, list | tuple):
            raise ValueError("'tool_calls' must be a list")
        usage = data.get("usage")
        if usage is not None:
            usage = _usage_from(usage)
        delay = data.get("delay", 0.0)
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise ValueError("'delay' must be a number of seconds >= 0")
        error = data.get("error")
        if error is not None and not isinstance(error, str):
            raise ValueError("'error' must be a string")
        return cls(
            text=text,
            tool_calls=tuple(ScriptedToolCall.from_dict(call) for call in raw_calls),
            usage=usage,
            delay=float(delay),
            error=error,
        )


TurnLike: TypeAlias = ScriptedTurn | Mapping[str, Any]
"""A turn, or a mapping `ScriptedTurn.from_dict` accepts."""

ScriptFunction: TypeAlias = Callable[[Sequence[ChatMessage]], TurnLike]
"""Chooses the turn from the conversation so far (like pydantic-ai's `FunctionModel`)."""


class ScriptedModel:
    """A `Model` that replays a script of turns, or asks a function for each turn.

    Turn `i` (0-based) is played when the conversation holds `i` assistant
    messages. Past the end of the script, `stream()` raises `ModelError`.
    Text arrives as several `TextDelta`s whose concatenation is the turn's
    text, then the tool calls, then one `Usage`.
    """

    scripted: ClassVar[bool] = True
    """Marks a model that calls no language model (see `describe_model`)."""

    def __init__(
        self,
        script: Sequence[TurnLike] | ScriptFunction,
        *,
        name: str = "scripted",
    ) -> None:
        """`script` is a list of turns (validated now; `ConfigError` if bad)
        or a function of the messages returning a turn."""
        self._name = name
        self._function: ScriptFunction | None = None
        self._turns: tuple[ScriptedTurn, ...] = ()
        if callable(script):
            self._function = script
        else:
            try:
                self._turns = tuple(_turn(turn) for turn in script)
            except ValueError as exc:
                raise ConfigError(f"scripted model {name!r}: {exc}") from exc

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load a JSON (`.json`) or YAML (anything else) script; its name is
        `scripted:<file stem>`. Any problem raises `ConfigError` naming the
        file and, for a parse error, the line and column: never the file's
        text, so an error shown to a caller cannot leak a line of it."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"model script {path} is not UTF-8 text (byte {exc.start})") from exc
        except OSError as exc:
            raise ConfigError(f"cannot read model script {path}: {exc.strerror or exc}") from exc
        try:
            data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        except json.JSONDecodeError as exc:
            # `msg` is the json module's fixed wording; `str(exc)` is the same plus position.
            raise ConfigError(
                f"model script {path} does not parse: {exc.msg} "
                f"at line {exc.lineno}, column {exc.colno}"
            ) from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"model script {path} does not parse: {_yaml_where(exc)}") from exc
        if isinstance(data, Mapping) and "turns" in data:
            data = data["turns"]
        if not isinstance(data, list):
            raise ConfigError(f"model script {path}: expected a list of turns")
        turns = []
        for number, item in enumerate(data, start=1):
            try:
                turns.append(ScriptedTurn.from_dict(item))
            except ValueError as exc:
                raise ConfigError(f"model script {path}: turn {number}: {exc}") from exc
        return cls(turns, name=f"scripted:{path.stem}")

    @property
    def name(self) -> str:
        """`scripted`, or `scripted:<file stem>` for a script file."""
        return self._name

    @property
    def turns(self) -> tuple[ScriptedTurn, ...]:
        """The script (empty when a function chooses the turns)."""
        return self._turns

    def __repr__(self) -> str:
        size = "function" if self._function is not None else f"{len(self._turns)} turns"
        return f"ScriptedModel({self._name!r}, {size})"

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncGenerator[ModelItem, None]:
        """Play the turn chosen by the number of assistant messages in `messages`."""
        index = sum(1 for message in messages if message.get("role") == "assistant")
        turn = self._choose(index, messages)
        if turn.delay > 0:
            await anyio.sleep(turn.delay)
        if turn.error is not None:
            raise ModelError(turn.error)
        for chunk in _chunks(turn.text):
            # A checkpoint per delta lets concurrent conversations interleave
            # and cancellation land mid-turn, as with a real endpoint.
            await anyio.lowlevel.checkpoint()
            yield TextDelta(text=chunk)
        for position, call in enumerate(turn.tool_calls):
            yield ToolCall(
                id=call.id or f"call_{index}_{position}",
                name=call.name,
                arguments=dict(call.arguments),
            )
        yield turn.usage or _estimate_usage(messages, turn)

    def _choose(self, index: int, messages: Sequence[ChatMessage]) -> ScriptedTurn:
        if self._function is not None:
            try:
                return _turn(self._function(messages))
            except ValueError as exc:
                raise ModelError(f"scripted model {self._name!r}: bad turn: {exc}") from exc
        if index >= len(self._turns):
            raise ModelError(
                f"scripted model has no turn {index + 1} (script has {len(self._turns)} turns)"
            )
        return self._turns[index]


def _yaml_where(exc: yaml.YAMLError) -> str:
    """A YAML error's kind and position; PyYAML's own message quotes the line."""
    kind = type(exc).__name__
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is None:
        return f"invalid YAML ({kind})"
    return f"invalid YAML ({kind}) at line {mark.line + 1}, column {mark.column + 1}"


def _turn(turn: TurnLike) -> ScriptedTurn:
    return turn if isinstance(turn, ScriptedTurn) else ScriptedTurn.from_dict(turn)


def _usage_from(data: Any) -> Usage:
    if isinstance(data, Usage):
        return data
    if not isinstance(data, Mapping):
        raise ValueError("'usage' must be a mapping {input_tokens, output_tokens}")
    if set(data) - {"input_tokens", "output_tokens"}:
        raise ValueError("unknown usage field; usage has: input_tokens, output_tokens")
    values = {key: data.get(key, 0) for key in ("input_tokens", "output_tokens")}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"usage {key!r} must be an integer >= 0")
    return Usage(**values)


def _chunks(text: str) -> list[str]:
    """Split `text` into deltas of a few words each; they join back to `text` exactly."""
    words = re.findall(r"\s*\S+\s*", text)
    if not words:
        return [text] if text else []
    return [
        "".join(words[start : start + _WORDS_PER_DELTA])
        for start in range(0, len(words), _WORDS_PER_DELTA)
    ]


def _count_words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        # Content given as parts: [{"type": "text", "text": ...}, ...]
        return sum(_count_words(part.get("text")) for part in value if isinstance(part, dict))
    return 0


def _estimate_usage(messages: Sequence[ChatMessage], turn: ScriptedTurn) -> Usage:
    """Roughly a token per word, never zero, so usage sums are exercised."""
    prompt = sum(_count_words(message.get("content")) for message in messages)
    answer = _count_words(turn.text) + sum(
        1 + len(json.dumps(call.arguments).split()) for call in turn.tool_calls
    )
    return Usage(input_tokens=max(1, prompt), output_tokens=max(1, answer))
