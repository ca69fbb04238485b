"""`SessionForwarding`: a message for a session another replica runs goes there.

Orchestrator replicas on one PostgreSQL store run each session on one
replica at a time (`session_leases.py`). A message naming a session (its
A2A context id) that another live replica holds is forwarded to that
replica's URL (its lease names it) by this middleware, so a balancer in
front of the replicas needs no pinning and a stock A2A client needs nothing
more than the one URL: the JSON-RPC or HTTP+JSON request is sent on as it
came (method, path, body, the caller's headers, its credential included:
the owner authenticates it again), and the owner's answer, SSE streams
included, is relayed back as it arrives. A redirect would not do: a2a-sdk's
client does not follow one on a POST.

Bounds: the owner has `CONNECT_TIMEOUT` seconds to accept the connection,
and may stay silent up to `READ_TIMEOUT` seconds within its answer (a turn
of the orchestrator role lasts at most 1,800 s). An owner that cannot be
reached leaves the request to this replica, which answers as before
(`SessionOwnedElsewhere`: the session's owner and its URL). A forwarded
request carries `FORWARDED_HEADER` and is never forwarded again (a lease
that moved meanwhile is answered the same way). Only messages are
forwarded (SendMessage, SendStreamingMessage, in either binding) and only
by their context id: a request naming just a task id is answered here.
"""

from __future__ import annotations

import json
import logging

import anyio
import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..storage.session_leases import Leases

__all__ = ["CONNECT_TIMEOUT", "FORWARDED_HEADER", "READ_TIMEOUT", "SessionForwarding"]

logger = logging.getLogger(__name__)

FORWARDED_HEADER = "x-a2a-forwarded-by"
"""Names the replica that forwarded a request (its lease owner id)."""

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 1800.0

# Not passed on: they describe one connection, not the request.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"upgrade",
        b"te",
        b"trailer",
        b"proxy-connection",
        b"host",
        b"content-length",
    }
)


def session_of(body: bytes) -> str:
    """The context id a message request names ("" if none, or not a message)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(payload, dict):
        return ""
    params = payload.get("params") if "jsonrpc" in payload else payload
    message = params.get("message") if isinstance(params, dict) else None
    if not isinstance(message, dict):
        return ""
    context_id = message.get("contextId", message.get("context_id", ""))
    return context_id if isinstance(context_id, str) else ""


def _is_message_path(path: str) -> bool:
    return path == "/" or path.endswith(("/message:send", "/message:stream"))


class SessionForwarding:
    """ASGI middleware forwarding a message to its session's owner (module docstring)."""

    def __init__(self, app: ASGIApp, *, leases: Leases) -> None:
        self.app = app
        self.leases = leases

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", ()))
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not _is_message_path(scope["path"])
            or FORWARDED_HEADER.encode() in headers
        ):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        session_id = session_of(body)
        owner = await self.leases.elsewhere(session_id) if session_id else None
        if owner is None or not await self._forward(scope, body, owner, receive, send):
            await self.app(scope, _replay(body, receive), send)

    async def _forward(
        self, scope: Scope, body: bytes, owner: str, receive: Receive, send: Send
    ) -> bool:
        """Send the request to `owner` and its answer back; False if the
        owner could not be reached (nothing was sent to the client)."""
        url = owner.rstrip("/") + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope.get("headers", ())
            if name.lower() not in _HOP_BY_HOP
        ]
        headers.append((FORWARDED_HEADER, self.leases.owner))
        timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT)
        forwarded = True  # a caller gone meanwhile gets no answer from here either
        async with httpx.AsyncClient(timeout=timeout) as client:
            # A caller gone ends the exchange (the server drops what is sent
            # to it after): else it would wait for the owner's answer and
            # read it to its end, a whole turn, holding the owner's
            # connection and the caller's stream slot there.
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                request = client.build_request("POST", url, content=body, headers=headers)
                forwarded = await _exchange(client, request, owner, send)
                tg.cancel_scope.cancel()
        return forwarded


async def _exchange(
    client: httpx.AsyncClient, request: httpx.Request, owner: str, send: Send
) -> bool:
    """Send `request` to the owner and its answer to the caller; False if
    the owner could not be reached (nothing was sent to the caller)."""
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        logger.warning("could not forward a request to the replica at %s: %s", owner, exc)
        return False
    try:
        await _relay(response, owner, send)
    finally:
        await response.aclose()
    return True


async def _relay(response: httpx.Response, owner: str, send: Send) -> None:
    """The owner's answer to the caller, as it arrives."""
    started = False
    try:
        await send(
            {
                "type": "http.response.start",
                "status": response.status_code,
                "headers": [
                    (name, value)
                    for name, value in response.headers.raw
                    if name.lower() not in _HOP_BY_HOP
                ],
            }
        )
        started = True
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.TransportError as exc:
        # The owner went away mid-answer: the client's answer ends here.
        logger.warning("forwarding to the replica at %s broke off: %s", owner, exc)
        if started:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    """Cancel `scope` when the caller disconnects (its body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _read_body(receive: Receive) -> bytes:
    """The request's whole body (bounded by `BodyLimitMiddleware`, outside this one)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` giving the body read already, then the connection's own messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
