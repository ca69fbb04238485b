"""`OpenAIModel`: the `Model` protocol over any OpenAI-compatible chat endpoint.

One client speaks to OpenAI, Ollama, vLLM, llama.cpp server, LM Studio and
anything else that serves `/v1/chat/completions` with streaming. This module is
the one boundary where the `openai` package's exceptions are translated: every
one of them leaves as `ModelError`, naming the endpoint and the model, raised
`from` the original.

Failure contract (one model call = up to `1 + retries` attempts):

- An answer is complete only when its choice carries a `finish_reason`. A
  stream that ends without one (cut short by a proxy, a crashed server) is a
  failure, never a shorter answer.
- Retried, with exponential backoff and jitter: a refused or dropped
  connection (before or during the stream), silence longer than `timeout`,
  a stream without a finish reason, and HTTP 408 / 409 / 429 / 5xx (a
  `Retry-After` is honoured up to the backoff cap). Not retried: bad
  credentials, other 4xx, an error event in the stream, a malformed chunk,
  a closed client. The `openai` package's own retries are off, so every
  attempt is counted here, once.
- `timeout` is "no byte for this many seconds" (connect, and each read),
  not a limit on the whole answer: a long answer that keeps flowing is never
  cut. 0 means no limit.
- Text is handed on as it streams, so a retry may follow text the runtime
  has already shown. A retry begins the message again: before the next
  attempt a `Restart` withdraws the text handed on so far, and the retry's
  answer streams whole, whatever its words (a sampling model rarely repeats
  itself; the same words are just as fine). So the turn's text is always
  one complete answer of the endpoint. Tool calls are handed on only once
  the finish reason arrived, and usage once the stream ended after it, so a
  call whose arguments were cut is never run, and none precedes a retry:
  the tokens of a cut attempt are in no total (an endpoint reports them
  with a finished answer only).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import anyio
import openai

from ..errors import ModelError
from .base import ChatMessage, ModelItem, Restart, TextDelta, ToolCall, ToolSpec, Usage
from .limits import DEFAULT_RETRIES, DEFAULT_TIMEOUT, check_retries, check_timeout

__all__ = ["DEFAULT_RETRIES", "DEFAULT_TIMEOUT", "OpenAIModel", "check_retries", "check_timeout"]

logger = logging.getLogger(__name__)

# Local servers (Ollama, vLLM, llama.cpp, LM Studio) accept any key, but the
# openai client refuses to start without one; this stand-in is never a secret.
_DUMMY_API_KEY = "not-needed"

# Closing the HTTP response after the consumer stopped must finish even while
# a cancellation is being delivered, but must not hang the cancellation either.
_CLOSE_TIMEOUT = 5.0

# Backoff before retry n (0-based): a random 50-100 % of min(cap, base * 2**n),
# so many children hitting one overloaded server do not retry in lockstep.
_BACKOFF_BASE = 0.5
_BACKOFF_CAP = 8.0

# The statuses the openai package itself retries: timeouts, lock conflicts,
# rate limits and server errors. Everything else is an answer, not a hiccup.
_RETRY_STATUSES = frozenset({408, 409, 429})


@dataclass
class _PendingCall:
    """A tool call whose fragments are still arriving."""

    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _Retryable(Exception):
    """One attempt failed in a way another attempt may not."""

    def __init__(self, error: ModelError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


class OpenAIModel:
    """A chat model behind an OpenAI-compatible `/v1/chat/completions` endpoint.

    `stream()` sends one streaming request and yields, in order: a `TextDelta`
    for every content delta (a `Restart` before a retry withdraws those the
    cut attempt yielded), each complete `ToolCall` once the choice finishes
    (fragments joined by index; arguments that are not valid JSON arrive as
    `{"_raw": text}`), and the `Usage` when the endpoint reports it (whole
    numbers of tokens; its last report, at the end). Failures are retried as
    the module docstring says; what is not retried, or still fails on the
    last attempt, raises `ModelError`.

    The model owns its HTTP client: close it with `aclose()` or use the model
    as an async context manager. Streaming after close raises `ModelError`.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float = DEFAULT_TIMEOUT,
        retries: int = DEFAULT_RETRIES,
    ) -> None:
        """Create the client; `base_url=None` means the openai default (or
        `OPENAI_BASE_URL`), `api_key=None` means a local server that needs none.
        `timeout`: seconds without a byte before an attempt fails (0: no
        limit); `retries`: attempts after the first. Bad limits raise
        `ConfigError`."""
        self._model = model
        self._timeout = check_timeout(timeout, "timeout")
        self._retries = check_retries(retries, "retries")
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or _DUMMY_API_KEY,
            timeout=_http_timeout(self._timeout),
            # Retries happen in `stream`, where a broken stream is seen too.
            max_retries=0,
        )
        # The effective URL, after the client applied its default; used in errors.
        self._base_url = str(self._client.base_url).rstrip("/")

    @property
    def name(self) -> str:
        """The concrete model name sent to the endpoint."""
        return self._model

    @property
    def base_url(self) -> str:
        """The endpoint's base URL (without the trailing slash)."""
        return self._base_url

    @property
    def timeout(self) -> float:
        """Seconds without a byte before an attempt fails; 0 means no limit."""
        return self._timeout

    @property
    def retries(self) -> int:
        """Attempts after the first for one model call."""
        return self._retries

    def with_limits(
        self, *, timeout: float | None = None, retries: int | None = None
    ) -> OpenAIModel:
        """This model with another `timeout` and/or `retries` (`None` keeps
        the current one; bad values raise `ConfigError`). The copy shares the
        HTTP client and its connections: closing either closes both."""
        limited = copy.copy(self)
        if timeout is not None:
            limited._timeout = check_timeout(timeout, "timeout")
        if retries is not None:
            limited._retries = check_retries(retries, "retries")
        return limited

    def __repr__(self) -> str:
        # Deliberately without the API key.
        return f"OpenAIModel({self._model!r}, base_url={self._base_url!r})"

    async def aclose(self) -> None:
        """Close the underlying HTTP client. Idempotent."""
        if not self._client.is_closed():
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
        if self._client.is_closed():
            raise ModelError(
                f"model client for {self._base_url} (model {self._model!r}) is closed",
                kind="closed",
            )
        # Some local servers reject an empty `tools` list, so send it only if any.
        tool_params: Any = [_tool_param(tool) for tool in tools] if tools else openai.omit
        # ChatMessage is already the wire shape the client's TypedDicts describe.
        request: dict[str, Any] = {
            "model": self._model,
            "messages": list(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": tool_params,
            "timeout": _http_timeout(self._timeout),
        }
        # Whether this attempt's text was handed on: a retry then withdraws it.
        shown = False
        attempt = 0
        while True:
            logger.debug(
                "chat completion: model=%s base_url=%s attempt=%d",
                self._model,
                self._base_url,
                attempt + 1,
            )
            items = self._attempt(request)
            try:
                async for item in items:
                    shown = shown or isinstance(item, TextDelta)
                    yield item
                return
            except _Retryable as failure:
                if attempt >= self._retries:
                    tried = (
                        f"gave up after {attempt + 1} attempts" if attempt else "retries are off"
                    )
                    raise ModelError(
                        f"{failure.error} ({tried})", kind=failure.error.kind
                    ) from failure.__cause__
                cut = failure.error
                delay = _backoff(attempt, failure.retry_after)
                logger.warning(
                    "%s; retry %d of %d in %.1f s", failure.error, attempt + 1, self._retries, delay
                )
            finally:
                # Closes the attempt's HTTP response at once, also when the
                # consumer stopped early (GeneratorExit at the yield above).
                await items.aclose()
            if shown:
                # Said before the backoff, so a view replaces the half-shown
                # text at once rather than after the wait.
                yield Restart(reason=str(cut))
                shown = False
            await anyio.sleep(delay)
            attempt += 1

    async def _attempt(self, request: dict[str, Any]) -> AsyncGenerator[ModelItem, None]:
        """One request: its items. Raises `_Retryable` for what another
        attempt may fix, `ModelError` for the rest."""
        try:
            stream = await self._client.chat.completions.create(**request)
        except openai.OpenAIError as exc:
            raise self._translate(exc) from exc

        pending: dict[int, _PendingCall] = {}
        received = 0  # characters of text this attempt has streamed
        finished = False
        # The endpoint's last report: one at the end (OpenAI's), or a running
        # count on every chunk (vLLM's continuous usage stats). Handed on
        # once the answer is whole, so a cut attempt's tokens count nowhere.
        reported: Usage | None = None
        try:
            try:
                async for chunk in stream:
                    for choice in chunk.choices or ():
                        # n=1 is all we ask for; ignore any other choice a server adds.
                        if choice.index != 0:
                            continue
                        delta = choice.delta
                        if delta is not None and delta.content:
                            received += len(delta.content)
                            yield TextDelta(text=delta.content)
                        if delta is not None and delta.tool_calls:
                            _collect(pending, delta.tool_calls)
                        if choice.finish_reason is not None and not finished:
                            finished = True
                            for call in _complete(pending):
                                yield call
                            pending.clear()
                    if chunk.usage is not None:
                        reported = Usage(
                            input_tokens=_whole(chunk.usage.prompt_tokens),
                            output_tokens=_whole(chunk.usage.completion_tokens),
                        )
            except openai.APIConnectionError as exc:
                if not finished:
                    raise self._translate(exc, received=received) from exc
                # The answer is whole; only the usage or the end marker was lost.
                logger.debug("stream broke after its finish reason: %s", exc)
            except (openai.OpenAIError, ValueError) as exc:
                # ValueError covers a chunk that is not JSON (json.JSONDecodeError).
                raise self._translate(exc) from exc
            if not finished:
                raise _Retryable(
                    ModelError(
                        f"model endpoint {self._base_url} ended its stream without a finish "
                        f"reason (model {self._model!r}), after {received} characters of text: "
                        "the answer was cut short",
                        kind="cut_short",
                    )
                )
            if reported is not None:
                yield reported
        finally:
            with anyio.move_on_after(_CLOSE_TIMEOUT, shield=True):
                await stream.close()

    def _translate(
        self, exc: openai.OpenAIError | ValueError, *, received: int | None = None
    ) -> ModelError | _Retryable:
        """Turn an openai (or decoding) exception into a `ModelError` naming
        the endpoint, wrapped in `_Retryable` when another attempt may help."""
        url, model = self._base_url, f"(model {self._model!r})"
        where = "" if received is None else f" mid-stream, after {received} characters"
        if isinstance(exc, openai.APITimeoutError):
            limit = f"no byte for {self._timeout:g} s"
            return _Retryable(
                ModelError(
                    f"model endpoint {url} timed out {model}{where}: {limit} "
                    "(A2A_MODEL_TIMEOUT or the role's model_timeout sets it)",
                    kind="timeout",
                )
            )
        if isinstance(exc, openai.APIConnectionError):
            # The openai message is just "Connection error."; the cause says why.
            cause = exc.__cause__
            detail = f"{exc} {type(cause).__name__}: {cause}" if cause else str(exc)
            return _Retryable(
                ModelError(
                    f"model endpoint {url} unreachable {model}{where}: {detail}", kind="unreachable"
                )
            )
        if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
            return ModelError(
                f"model endpoint {url} refused the credentials {model}, HTTP {exc.status_code}"
                f" (check A2A_MODEL_API_KEY / OPENAI_API_KEY): {exc.message}",
                kind="refused",
            )
        if isinstance(exc, openai.APIStatusError):
            error = ModelError(
                f"model endpoint {url} answered HTTP {exc.status_code} {model}: {exc.message}",
                kind=f"http_{exc.status_code}",
            )
            if exc.status_code in _RETRY_STATUSES or exc.status_code >= 500:
                return _Retryable(error, _retry_after(exc.response.headers.get("retry-after")))
            return error
        if isinstance(exc, openai.OpenAIError):
            return ModelError(f"model endpoint {url} failed {model}: {exc}")
        return ModelError(
            f"model endpoint {url} sent a malformed stream {model}: {exc}", kind="malformed"
        )


def _http_timeout(seconds: float) -> openai.Timeout:
    # One number for connect, write, pool and each read: httpx's read timeout
    # is the wait for the next bytes, so a flowing stream is never cut.
    return openai.Timeout(seconds if seconds > 0 else None)


def _backoff(attempt: int, retry_after: float | None) -> float:
    delay = min(_BACKOFF_CAP, _BACKOFF_BASE * 2**attempt) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, min(retry_after, _BACKOFF_CAP))
    return delay


def _retry_after(header: str | None) -> float | None:
    """A `Retry-After` in seconds; the HTTP-date form is rare from model servers."""
    try:
        seconds = float(header) if header is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _whole(value: object) -> int:
    """A token count as an int: some servers send 565.0, a few send nothing."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return max(0, int(value))
    return 0


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
