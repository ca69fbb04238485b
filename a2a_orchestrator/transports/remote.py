"""The remote transport: a child is an A2A task on a role server (or any A2A agent).

Built on the a2a-sdk client: agent-card discovery, JSON-RPC with SSE
streaming (the factory picks the v0.3 compat transport for 0.3 peers), the
SDK's auth interceptor with a per-agent bearer token. A broken stream is
re-attached (GetTask, then SubscribeToTask while the task still works);
the task's history fills in what the break missed. An agent that stays
unreachable for `lost_after` seconds ends its child as `Failed(reason="lost")`.

This module is the one boundary where httpx and a2a client errors become
`DelegationError`s (`translate_error`), with the cause kept.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
from a2a.client import (
    A2ACardResolver,
    A2AClientError,
    A2AClientTimeoutError,
    AgentCardResolutionError,
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientCallInterceptor,
    ClientConfig,
    ClientFactory,
    CredentialService,
)
from a2a.helpers import new_text_message
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import A2AError

from ..delegation import ChildConfig, Emit
from ..errors import AgentUnavailableError, DelegationError, DelegationTimeoutError, ProtocolError
from ..events import Failed
from ..models.base import ChatMessage
from ..network import AgentSpec
from ..wire import (
    CONFIG_KEY,
    CONTROL_EXTENSION,
    CONTROL_KEY,
    StreamDecoder,
    transcript_from_history,
)

__all__ = ["RemoteDelegate", "RemoteRun", "translate_error"]

logger = logging.getLogger(__name__)

OnAttached = Callable[[str, str], Awaitable[None]]


def translate_error(exc: BaseException, url: str) -> DelegationError:
    """The project's error for an httpx or a2a client failure (cause kept by the caller)."""
    cause = exc.__cause__
    if isinstance(exc, A2AClientTimeoutError | httpx.TimeoutException) or isinstance(
        cause, httpx.TimeoutException
    ):
        return DelegationTimeoutError(f"agent at {url} did not answer in time: {exc}")
    if isinstance(exc, httpx.HTTPStatusError) or isinstance(cause, httpx.HTTPStatusError):
        status = exc if isinstance(exc, httpx.HTTPStatusError) else cause
        assert isinstance(status, httpx.HTTPStatusError)
        code = status.response.status_code
        if code in (401, 403):
            return ProtocolError(f"agent at {url} refused the call ({code}): check its token")
        return ProtocolError(f"agent at {url} answered HTTP {code}")
    if isinstance(exc, httpx.TransportError) or isinstance(cause, httpx.TransportError):
        return AgentUnavailableError(f"agent at {url} is unreachable: {cause or exc}")
    if isinstance(exc, AgentCardResolutionError):
        if exc.status_code is None:
            return AgentUnavailableError(f"agent at {url} is unreachable: {exc}")
        return ProtocolError(f"agent at {url} has no usable agent card: {exc}")
    if isinstance(exc, A2AClientError):
        return AgentUnavailableError(f"agent at {url}: {exc}")
    if isinstance(exc, A2AError):
        return ProtocolError(f"agent at {url} answered with an error: {exc}")
    return ProtocolError(f"agent at {url}: {type(exc).__name__}: {exc}")


_TRANSLATED = (httpx.HTTPError, A2AError)


@contextlib.contextmanager
def _translated(url: str) -> Any:
    try:
        yield
    except _TRANSLATED as exc:
        raise translate_error(exc, url) from exc


class _Token(CredentialService):
    def __init__(self, token: str) -> None:
        self._token = token

    async def get_credentials(self, security_scheme_name: str, context: Any) -> str | None:
        return self._token


class RemoteRun:
    """A child that is an A2A task on a remote agent."""

    transport = "remote"

    def __init__(
        self,
        delegate: RemoteDelegate,
        spec: AgentSpec,
        client: Client,
        card: AgentCard,
        *,
        overrides: dict[str, Any],
        task_id: str = "",
        context_id: str = "",
        on_attached: OnAttached | None = None,
    ) -> None:
        self.delegate = delegate
        self.spec = spec
        self.url = spec.url or ""
        self.client = client
        self.card = card
        self.overrides = overrides
        self.task_id = task_id
        self.context_id = context_id
        self.on_attached = on_attached
        self.decoder = StreamDecoder()
        self._sent_config = bool(task_id or context_id)
        self._cancel_requested = False

    @property
    def model(self) -> str:
        return str(self.overrides.get("model", ""))

    async def _note_ids(self) -> None:
        task_id, context_id = self.decoder.task_id, self.decoder.context_id
        if (task_id, context_id) != (self.task_id, self.context_id) and task_id:
            self.task_id, self.context_id = task_id, context_id
            if self.on_attached is not None:
                await self.on_attached(task_id, context_id)
            if self._cancel_requested:
                # Cancel asked for before the agent told us the task's id.
                await self._send_cancel()

    async def _relay(self, responses: AsyncIterator[StreamResponse], emit: Emit) -> bool:
        """Emit a stream's events; True once the turn is over. The stream is
        closed here, also when the turn ends before it does."""
        async with contextlib.aclosing(responses) as stream:  # type: ignore[type-var]
            async for response in stream:
                events = self.decoder.decode(response)
                await self._note_ids()
                for event in events:
                    await emit(event)
                if self.decoder.finished_turn:
                    return True
        return self.decoder.finished_turn

    async def turn(self, text: str | None, emit: Emit) -> None:
        # A cancel asked for before an earlier turn's task had an id does not
        # carry over to this turn (the handle stops a turn not yet started).
        self._cancel_requested = False
        if text is not None:
            message = new_text_message(text, role=Role.ROLE_USER)
            self.decoder.new_turn()
            if self.task_id and not self._task_over():
                message.task_id = self.task_id
                message.context_id = self.context_id
            else:
                # A new task: its id comes with the first frame. After a task
                # ended, a new task in the same context continues the same
                # conversation on the role server.
                message.context_id = self.context_id
                self.task_id = self.decoder.task_id = ""
            if not self._sent_config and self.overrides:
                message.metadata.update({CONFIG_KEY: self.overrides})
            self._sent_config = True
            try:
                with _translated(self.url):
                    request = SendMessageRequest(message=message)
                    if await self._relay(self.client.send_message(request), emit):
                        return
            except DelegationError as exc:
                if not self.task_id:
                    raise
                logger.info("stream from %s broke (%s); re-attaching", self.url, exc)
        if not self.task_id:
            # The orchestrator stopped before the agent acknowledged the task.
            await emit(
                Failed(reason="lost", message=f"{self.url} never acknowledged the child's task")
            )
            return
        await self._reattach(emit)

    def _task_over(self) -> bool:
        return self.decoder.finished_turn and self.decoder.state not in _WAITING

    async def _reattach(self, emit: Emit) -> None:
        """Follow the task until its turn ends, or give it up as lost."""
        deadline = anyio.current_time() + self.delegate.lost_after
        while True:
            try:
                with _translated(self.url):
                    task = await self.client.get_task(GetTaskRequest(id=self.task_id))
                    for event in self.decoder.decode_task(task):
                        await emit(event)
                    if self.decoder.finished_turn:
                        return
                    request = SubscribeToTaskRequest(id=self.task_id)
                    if await self._relay(self.client.subscribe(request), emit):
                        return
                deadline = anyio.current_time() + self.delegate.lost_after
            except (AgentUnavailableError, DelegationTimeoutError) as exc:
                if anyio.current_time() >= deadline:
                    await emit(
                        Failed(reason="lost", message=f"lost contact with {self.url}: {exc}")
                    )
                    return
            except ProtocolError as exc:
                await emit(Failed(reason="lost", message=f"lost the task on {self.url}: {exc}"))
                return
            await anyio.sleep(self.delegate.retry_interval)

    async def cancel(self) -> None:
        self._cancel_requested = True
        if self.task_id:
            await self._send_cancel()

    async def _send_cancel(self) -> None:
        self._cancel_requested = False
        with _translated(self.url):
            try:
                await self.client.cancel_task(CancelTaskRequest(id=self.task_id))
            except A2AError as exc:
                # Already terminal (TaskNotCancelable): the stream tells the rest.
                logger.info("cancel of %s on %s: %s", self.task_id, self.url, exc)

    async def _control(self, action: str, text: str = "") -> None:
        extensions = [e.uri for e in self.card.capabilities.extensions]
        if CONTROL_EXTENSION not in extensions:
            raise DelegationError(
                f"agent at {self.url} does not support {action}: its card does not declare "
                f"the control extension {CONTROL_EXTENSION}"
            )
        if not self.task_id:
            raise DelegationError(f"cannot {action} a child before its task exists")
        message = new_text_message(text or action, role=Role.ROLE_USER)
        message.task_id = self.task_id
        message.context_id = self.context_id
        message.metadata.update({CONTROL_KEY: action})
        context = ClientCallContext(service_parameters={"A2A-Extensions": CONTROL_EXTENSION})
        with _translated(self.url):
            async for _ in self.delegate.plain_client(self).send_message(
                SendMessageRequest(message=message), context=context
            ):
                break

    async def pause(self) -> None:
        await self._control("pause")

    async def resume(self) -> None:
        await self._control("resume")

    async def interrupt(self) -> None:
        await self._control("interrupt")

    async def steer(self, text: str) -> None:
        await self._control("steer", text)

    async def history(self) -> list[ChatMessage]:
        """The task's conversation, read back from its history with GetTask."""
        if not self.task_id:
            return []
        with _translated(self.url):
            task = await self.client.get_task(GetTaskRequest(id=self.task_id))
        return transcript_from_history(task, "")

    async def aclose(self) -> None:
        await self.client.close()


_WAITING = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})


class RemoteDelegate:
    """Opens children on remote A2A agents (`Delegate` for agents with a URL).

    Owns an httpx client unless given one; close it with `aclose()`.
    """

    def __init__(
        self,
        *,
        http: httpx.AsyncClient | None = None,
        timeout: float = 30.0,
        stream_timeout: float = 600.0,
        lost_after: float = 30.0,
        retry_interval: float = 0.5,
    ) -> None:
        self._own_http = http is None
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, read=stream_timeout),
            limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),
        )
        self.lost_after = lost_after
        self.retry_interval = retry_interval
        self._cards: dict[str, AgentCard] = {}

    async def card(self, spec: AgentSpec) -> AgentCard:
        """The agent's card (cached per URL)."""
        url = spec.url or ""
        card = self._cards.get(url)
        if card is None:
            with _translated(url):
                card = await A2ACardResolver(self.http, url).get_agent_card()
            self._cards[url] = card
        return card

    def _client(self, spec: AgentSpec, card: AgentCard, *, streaming: bool) -> Client:
        token = spec.token()
        interceptors: list[ClientCallInterceptor] = (
            [AuthInterceptor(_Token(token))] if token else []
        )
        factory = ClientFactory(ClientConfig(httpx_client=self.http, streaming=streaming))
        return factory.create(card, interceptors=interceptors)

    def plain_client(self, run: RemoteRun) -> Client:
        """A non-streaming client to the same agent (control messages)."""
        return self._client(run.spec, run.card, streaming=False)

    async def open(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        on_attached: OnAttached | None = None,
    ) -> RemoteRun:
        """A new child: its task is created by its first turn."""
        return await self.reopen(spec, config, child_id=child_id, on_attached=on_attached)

    async def reopen(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        entries: Any = (),
        task_id: str = "",
        context_id: str = "",
        on_attached: OnAttached | None = None,
    ) -> RemoteRun:
        """Re-attach to a child's task by its stored ids (crash recovery)."""
        card = await self.card(spec)
        return RemoteRun(
            self,
            spec,
            self._client(spec, card, streaming=True),
            card,
            overrides=config.overrides(),
            task_id=task_id,
            context_id=context_id,
            on_attached=on_attached,
        )

    async def aclose(self) -> None:
        if self._own_http:
            await self.http.aclose()
