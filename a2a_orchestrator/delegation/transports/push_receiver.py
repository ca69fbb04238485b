"""Push mode: a remote child whose updates come by webhook, not a held stream.

For an agent with `push = true` (agent file) the orchestrator's server
(`serve orchestrator`) serves `PushReceiver`'s route, `POST
/a2a/push/{child_id}`, and the child is a `PushRun`:

- Each turn's message goes out with `returnImmediately` and a push config
  naming the child's webhook URL and its token (`X-A2A-Notification-Token`),
  a random secret made per child and kept in the store (`Store.push_token`),
  so a restarted orchestrator still accepts the child's deliveries.
- The agent answers at once with the task; its updates then arrive as
  `StreamResponse` frames posted to the webhook and go through the same
  `StreamDecoder` as a stream's frames, so the child's events are the same
  events, in the same order. A frame whose status message was decoded
  already (a delivery retried after it had arrived) is skipped whole.
- Silence is covered as on a stream (`RemoteRun._relay`): after
  `idle_probe` seconds without a frame the task is read with GetTask, whose
  history fills what deliveries missed (the agent drops deliveries it could
  not make, e.g. while this server was down).
- Re-attaching (after a broken send, or recovery after a restart) registers
  the push config again first (the webhook URL may have changed with the
  restart), then reads the task (GetTask: everything until then), then
  follows the deliveries. Events are de-duplicated by their uuid as on a
  stream, so nothing is lost or recorded twice.

An agent whose card does not offer push notifications, or a child opened
where no receiver serves (`run`, `resume`), streams as usual.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import anyio
from a2a.types import (
    GetTaskRequest,
    SendMessageRequest,
    StreamResponse,
    TaskPushNotificationConfig,
)
from google.protobuf.json_format import ParseDict, ParseError
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...protocol.decoding import StreamDecoder
from .remote_run import RemoteRun

if TYPE_CHECKING:
    from ...storage.store import Store

__all__ = ["PUSH_PREFIX", "PushInbox", "PushReceiver", "PushRun"]

logger = logging.getLogger(__name__)

PUSH_PREFIX = "/a2a/push"
CONFIG_ID = "a2a-orchestrator"
"""The id of our config on a task (registering it again replaces it)."""
_TOKEN_HEADER = "x-a2a-notification-token"
_BACKLOG = 10_000


class PushInbox:
    """The frames pushed for one child, in arrival order, until read."""

    def __init__(self, child_id: str, token: str, url: str) -> None:
        self.child_id = child_id
        self.token = token
        self.url = url
        self._frames: deque[StreamResponse] = deque()
        self._arrived = anyio.Event()

    def put(self, frame: StreamResponse) -> bool:
        """Queue a frame; False when the backlog is full (the sender retries)."""
        if len(self._frames) >= _BACKLOG:
            return False
        self._frames.append(frame)
        self._arrived.set()
        return True

    def drain(self) -> int:
        """Forget what came before a new turn's message (an earlier turn's)."""
        count = len(self._frames)
        self._frames.clear()
        return count

    async def next(self) -> StreamResponse:
        while not self._frames:
            self._arrived = anyio.Event()
            await self._arrived.wait()
        return self._frames.popleft()

    def config(self, task_id: str = "") -> TaskPushNotificationConfig:
        return TaskPushNotificationConfig(
            id=CONFIG_ID, task_id=task_id, url=self.url, token=self.token
        )


class PushReceiver:
    """The orchestrator's webhook endpoint for children in push mode."""

    def __init__(self, store: Store, base_url: str) -> None:
        """`base_url`: where agents reach this server (its public URL)."""
        self.store = store
        self.base_url = base_url.rstrip("/")
        self._inboxes: dict[str, PushInbox] = {}
        self.accepted = 0
        """Deliveries taken into an inbox since start (for logs and tests)."""

    def url_for(self, child_id: str) -> str:
        return f"{self.base_url}{PUSH_PREFIX}/{child_id}"

    def routes(self) -> list[Route]:
        return [Route(PUSH_PREFIX + "/{child_id}", self._receive, methods=["POST"])]

    async def open(self, child_id: str) -> PushInbox:
        """The child's inbox, receiving from now on (its token made if new)."""
        inbox = self._inboxes.get(child_id)
        if inbox is None:
            token = await self.store.push_token(child_id)
            assert token is not None
            inbox = self._inboxes[child_id] = PushInbox(child_id, token, self.url_for(child_id))
        return inbox

    def close(self, child_id: str) -> None:
        self._inboxes.pop(child_id, None)

    def run(self, *args: Any, child_id: str, **kwargs: Any) -> PushRun:
        """A `PushRun` (`RemoteRun`'s arguments) receiving here."""
        return PushRun(*args, receiver=self, child_id=child_id, **kwargs)

    async def check(self, conn: HTTPConnection) -> Response | None:
        """The refusal of a delivery, judged on its headers alone (the server
        runs this before reading the body: `middleware.HeaderCheck`); None
        when its token is the child's and the child is followed here."""
        child_id = conn.url.path.removeprefix(PUSH_PREFIX + "/")
        if not child_id or "/" in child_id:
            return _problem(404, "not a child's webhook")
        given = conn.headers.get(_TOKEN_HEADER, "")
        inbox = self._inboxes.get(child_id)
        token = inbox.token if inbox is not None else None
        if token is None:
            token = await self.store.push_token(child_id, create=False)
        if token is None or not hmac.compare_digest(given.encode(), token.encode()):
            return _problem(401, "unknown child or wrong notification token")
        if inbox is None:
            # A child of ours not followed in this process (finished, or not
            # recovered yet): recovery reads the task itself.
            return _problem(404, f"child {child_id} is not waiting for updates here")
        return None

    async def _receive(self, request: Request) -> Response:
        # Checked again: the inbox may have closed while the body was read.
        refusal = await self.check(request)
        if refusal is not None:
            return refusal
        inbox = self._inboxes[request.path_params["child_id"]]
        try:
            data = json.loads(await request.body())
            if not isinstance(data, dict):
                return _problem(400, "not a StreamResponse: not a JSON object")
            frame = ParseDict(data, StreamResponse(), True)
        except (ValueError, TypeError, ParseError) as exc:
            return _problem(400, f"not a StreamResponse: {exc}")
        except RecursionError:
            return _problem(400, "not a StreamResponse: nested too deeply")
        if not inbox.put(frame):
            return _problem(503, "too many updates waiting; try again")
        self.accepted += 1
        return Response(status_code=204)


def _problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"error": detail}, status_code=status)


class _PushDecoder(StreamDecoder):
    """A stream decoder that skips a frame repeated whole (a retried delivery)."""

    def decode(self, response: StreamResponse) -> list[Any]:
        if response.HasField("status_update"):
            status = response.status_update.status
            if status.HasField("message") and status.message.message_id in self._seen:
                return []  # its state too: it may be older than the state we have
        return super().decode(response)


def _task_of(frame: StreamResponse) -> str:
    which = frame.WhichOneof("payload")
    if which == "task":
        return frame.task.id
    if which == "status_update":
        return frame.status_update.task_id
    if which == "artifact_update":
        return frame.artifact_update.task_id
    return ""


class PushRun(RemoteRun):
    """A remote child in push mode (see the module docstring)."""

    def __init__(self, *args: Any, receiver: PushReceiver, child_id: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.receiver = receiver
        self.child_id = child_id
        decoder = _PushDecoder()
        decoder.state = self.decoder.state
        self.decoder = decoder

    def _pushes(self) -> bool:
        """The agent's card offers push notifications."""
        return bool(self.card.capabilities.push_notifications)

    def _stream(self, request: SendMessageRequest) -> AsyncIterator[StreamResponse]:
        if not self._pushes():
            logger.info("%s offers no push notifications: streaming instead", self.url)
            return super()._stream(request)
        return self._send_pushed(request)

    def _can_follow(self) -> bool:
        return self._pushes() or super()._can_follow()

    def _follow(self) -> AsyncIterator[StreamResponse]:
        if not self._pushes():
            return super()._follow()
        return self._follow_pushed()

    async def _send_pushed(self, request: SendMessageRequest) -> AsyncIterator[StreamResponse]:
        inbox = await self.receiver.open(self.child_id)
        inbox.drain()
        request.configuration.task_push_notification_config.CopyFrom(inbox.config())
        request.configuration.return_immediately = True
        async for response in self.delegate.plain_client(self).send_message(request):
            yield response
        async for frame in self._frames(inbox):
            yield frame

    async def _follow_pushed(self) -> AsyncIterator[StreamResponse]:
        inbox = await self.receiver.open(self.child_id)
        # Registered before the task is read: what happens after the read
        # is pushed here, what happened before is in the answer.
        await self.client.create_task_push_notification_config(
            inbox.config(self.task_id), context=self._call()
        )
        task = await self.client.get_task(GetTaskRequest(id=self.task_id), context=self._call())
        yield StreamResponse(task=task)
        async for frame in self._frames(inbox):
            yield frame

    async def _frames(self, inbox: PushInbox) -> AsyncIterator[StreamResponse]:
        while True:
            frame = await inbox.next()
            task_id = _task_of(frame)
            if self.task_id and task_id and task_id != self.task_id:
                continue  # an earlier task of the child's context
            yield frame

    async def aclose(self) -> None:
        self.receiver.close(self.child_id)
        await super().aclose()
