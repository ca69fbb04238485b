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


class _TooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """Answers 413 to a request whose body passes `max_bytes`.

    Checks the declared Content-Length first and counts the bytes actually
    received too, for chunked bodies that declare none.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BODY) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._reject(send)
                return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._reject(send)

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
