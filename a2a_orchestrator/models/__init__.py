"""Language models behind one small protocol.

`Model` streams text deltas, tool calls and usage (and a `Restart` when a
cut stream begins its message again). `OpenAIModel` speaks to
any OpenAI-compatible `/v1/chat/completions` endpoint; `ScriptedModel`
replays recorded turns (tests, the offline demo). `resolve_model` picks one
from a role's model name and `ModelSettings.from_env()`.
"""

import typing as _typing

from .base import ChatMessage as ChatMessage
from .base import Model as Model
from .base import ModelItem as ModelItem
from .base import Restart as Restart
from .base import TextDelta as TextDelta
from .base import ToolCall as ToolCall
from .base import ToolSpec as ToolSpec
from .base import Usage as Usage
from .config import OFFLINE_NOTICE as OFFLINE_NOTICE
from .config import OFFLINE_SCRIPT as OFFLINE_SCRIPT
from .config import ModelSettings as ModelSettings
from .config import describe_model as describe_model
from .config import is_scripted as is_scripted
from .config import limit_model as limit_model
from .config import resolve_model as resolve_model
from .scripted import ScriptedModel as ScriptedModel
from .scripted import ScriptedToolCall as ScriptedToolCall
from .scripted import ScriptedTurn as ScriptedTurn
from .scripted import ScriptFunction as ScriptFunction
from .scripted import TurnLike as TurnLike

if _typing.TYPE_CHECKING:
    from .openai import OpenAIModel as OpenAIModel


def __getattr__(name: str) -> object:
    # OpenAIModel loads the openai package (about half a second); a process
    # with a scripted model, or none, never pays for it (PEP 562).
    if name == "OpenAIModel":
        from .openai import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "OFFLINE_NOTICE",
    "OFFLINE_SCRIPT",
    "ChatMessage",
    "Model",
    "ModelItem",
    "ModelSettings",
    "OpenAIModel",
    "Restart",
    "ScriptFunction",
    "ScriptedModel",
    "ScriptedToolCall",
    "ScriptedTurn",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "TurnLike",
    "Usage",
    "describe_model",
    "is_scripted",
    "limit_model",
    "resolve_model",
]
