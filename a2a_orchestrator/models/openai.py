"""`OpenAIModel`: the `Model` protocol over any OpenAI-compatible chat endpoint.

One client speaks to OpenAI, Ollama, vLLM, llama.cpp server, LM Studio and
anything else that serves `/v1/chat/completions` with streaming. This module is
the one boundary where the `openai` package's exceptions are translated: every
one of them leaves as `ModelError`, naming the endpoint and the model, raised
`from` the original.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import anyio
import openai

from ..errors import ModelError
from .base import ChatMessage, ModelItem, TextDelta, ToolCall, ToolSpec, Usage

__all__ = ["OpenAIModel"]

logger = logging.getLogger(__name__)

# Local servers (Ollama, vLLM, llama.cpp, LM Studio) accept any key, but the
# openai client refuses to start without one; this stand-in is never a secret.
_DUMMY_API_KEY = "not-needed"

# Closing the HTTP response after the consumer stopped must finish even while
# a cancellation is being delivered, but must not hang the cancellation either.
_CLOSE_TIMEOUT = 5.0


@dataclass
class _PendingCall:
    """A tool call whose fragments are still arriving."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIModel:
    """A chat model behind an OpenAI-compatible `/v1/chat/completions` endpoint.

    `stream()` sends one streaming request and yields, in order: a `TextDelta`
    for every content delta, each complete `ToolCall` once the choice finishes
    (fragments joined by index; arguments that are not valid JSON arrive as
    `{"_raw": text}`), and the `Usage` when the endpoint reports it. Any
    failure (unreachable, timeout, bad credentials, error status, malformed
    stream) raises `ModelError`.

    The model owns its HTTP client: close it with `aclose()` or use the model
    as an async context manager. Streaming after close raises `ModelError`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float = 120,
        max_retries: int = 2,
    ) -> None:
        """Create the client; `base_url=None` means the openai default (or
        `OPENAI_BASE_URL`), `api_key=None` means a local server that needs none."""
        self._model = model
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or _DUMMY_API_KEY,
            timeout=timeout,
            max_retries=max_retries,
        )
        # The effective URL, after the client applied its default; used in errors.
        self._base_url = str(self._client.base_url).rstrip("/")
        self._closed = False

    @property
    def name(self) -> str:
        """The concrete model name sent to the endpoint."""
        return self._model

    @property
    def base_url(self) -> str:
        """The endpoint's base URL (without the trailing slash)."""
        return self._base_url

    def __repr__(self) -> str:
        # Deliberately without the API key.
        return f"OpenAIModel({self._model!r}, base_url={self._base_url!r})"

    async def aclose(self) -> None:
        """Close the underlying HTTP client. Idempotent."""
        if not self._closed:
            self._closed = True
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def stream(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncGenerator[ModelItem, None]:
        """Stream one assistant turn; see the class docstring for the contract."""
        if self._closed:
            raise ModelError(f"model client for {self._base_url} (model {self._model!r}) is closed")
        # Some local servers reject an empty `tools` list, so send it only if any.
        tool_params: Any = [_tool_param(tool) for tool in tools] if tools else openai.omit
        # ChatMessage is already the wire shape the client's TypedDicts describe.
        wire_messages: Any = list(messages)
        logger.debug("chat completion: model=%s base_url=%s", self._model, self._base_url)
        try:
            stream = await self._client.chat.completions.create(
                model=self._model,
                messages=wire_messages,
                stream=True,
                stream_options={"include_usage": True},
                tools=tool_params,
            )
        except openai.OpenAIError as exc:
            raise self._translate(exc) from exc

        pending: dict[int, _PendingCall] = {}
        try:
            try:
                async for chunk in stream:
                    for choice in chunk.choices or ():
                        # n=1 is all we ask for; ignore any other choice a server adds.
                        if choice.index != 0:
                            continue
                        delta = choice.delta
                        if delta is not None and delta.content:
                            yield TextDelta(text=delta.content)
                        if delta is not None and delta.tool_calls:
                            _collect(pending, delta.tool_calls)
                        if choice.finish_reason is not None and pending:
                            for call in _complete(pending):
                                yield call
                            pending.clear()
                    if chunk.usage is not None:
                        yield Usage(
                            input_tokens=chunk.usage.prompt_tokens or 0,
                            output_tokens=chunk.usage.completion_tokens or 0,
                        )
            except (openai.OpenAIError, ValueError) as exc:
                # ValueError covers a chunk that is not JSON (json.JSONDecodeError).
                raise self._translate(exc) from exc
            # Servers that never send a finish_reason still get their calls delivered.
            for call in _complete(pending):
                yield call
        finally:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await stream.close()

    def _translate(self, exc: openai.OpenAIError | ValueError) -> ModelError:
        """Turn an openai (or decoding) exception into a `ModelError` naming the endpoint."""
        url, model = self._base_url, f"(model {self._model!r})"
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(f"model endpoint {url} timed out {model}: {exc}")
        if isinstance(exc, openai.APIConnectionError):
            # The openai message is just "Connection error."; the cause says why.
            detail = f"{exc} {exc.__cause__}" if exc.__cause__ else str(exc)
            return ModelError(f"model endpoint {url} unreachable {model}: {detail}")
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return ModelError(
                f"model endpoint {url} refused the credentials {model}, HTTP {exc.status_code}"
                f" (check A2A_MODEL_API_KEY / OPENAI_API_KEY): {exc.message}"
            )
        if isinstance(exc, openai.APIStatusError):
            return ModelError(
                f"model endpoint {url} answered HTTP {exc.status_code} {model}: {exc.message}"
            )
        if isinstance(exc, openai.OpenAIError):
            return ModelError(f"model endpoint {url} failed {model}: {exc}")
        return ModelError(f"model endpoint {url} sent a malformed stream {model}: {exc}")


def _tool_param(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _collect(pending: dict[int, _PendingCall], fragments: Sequence[Any]) -> None:
    """Add streamed tool-call fragments to `pending`, keyed by their index."""
    for position, fragment in enumerate(fragments):
        # Some servers omit `index` when they send each call whole in one chunk.
        index = getattr(fragment, "index", None)
        if index is None:
            index = len(pending) + position
        call = pending.setdefault(index, _PendingCall())
        if fragment.id:
            call.id = fragment.id
        function = fragment.function
        if function is not None:
            # The name comes whole in the first fragment; a few servers repeat it.
            if function.name and not call.name:
                call.name = function.name
            if function.arguments:
                call.arguments.append(function.arguments)


def _complete(pending: dict[int, _PendingCall]) -> list[ToolCall]:
    """The finished calls in index order, with their arguments parsed."""
    calls = []
    for index in sorted(pending):
        call = pending[index]
        raw = "".join(call.arguments)
        arguments: dict[str, Any]
        if not raw.strip():
            arguments = {}
        else:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else {"_raw": raw}
        calls.append(ToolCall(id=call.id or f"call_{index}", name=call.name, arguments=arguments))
    return calls
