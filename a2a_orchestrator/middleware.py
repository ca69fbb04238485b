"""ASGI pieces in front of the A2A routes: bearer-token auth and a body limit.

Auth uses Starlette's `AuthenticationMiddleware`, so `request.user` flows
into a2a-sdk's `ServerCallContext.user` and the task store scopes tasks to
their owner. The agent card stays public: a client needs it to learn that a
token is required at all.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Collection

from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
    SimpleUser,
)
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["DEFAULT_MAX_BODY", "BearerTokenBackend", "BodyLimitMiddleware", "auth_error"]

DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Largest request body a server accepts (bytes)."""


class BearerTokenBackend(AuthenticationBackend):
    """Accepts `Authorization: Bearer <token>`; everything else is a 401."""

    def __init__(self, token: str, public_paths: Collection[str]) -> None:
        if not token:
            raise ValueError("an empty bearer token would accept anyone")
        self._token = token.encode()
        self._public = frozenset(public_paths)

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        if conn.url.path in self._public:
            return None
        scheme, _, credential = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not credential:
            raise AuthenticationError("missing bearer token")
        # Constant-time comparison: the token is a shared secret.
        if not hmac.compare_digest(credential.strip().encode(), self._token):
            raise AuthenticationError("invalid bearer token")
        return AuthCredentials(["authenticated"]), SimpleUser("a2a-client")


def auth_error(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return JSONResponse(
        {"error": "unauthorized", "detail": str(exc)},
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer realm="a2a"'},
    )


class BodyLimitMiddleware:
    """Answers 413 to a request whose body passes `max_bytes`.

    A declared Content-Length is checked at once. A body without one
    (chunked) is read here, bounded, before the app sees it, and handed on
    whole: the A2A dispatchers catch every exception an app raises, so a
    limit enforced while they read would come out as a JSON-RPC internal
    error instead of a 413.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit():
                declared = int(value)
        if declared is not None:
            if declared > self.max_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client went away; the app sees an empty body
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        body = json.dumps(
            {"error": "payload too large", "detail": f"request body over {self.max_bytes} bytes"}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
