"""ASGI pieces in front of the A2A routes: caller authentication and a bounded body read.

Order (outermost first): auth, then the body. Auth looks at headers only,
so an unauthenticated request is answered 401 before any byte of its body
is read, and the connection is closed so that none is read after either.
Routes that take a credential of their own instead (the orchestrator's push
webhooks) give the body middleware a `HeaderCheck`, run on the headers
before the body is read, with the same effect.
The body is then read whole, bounded in size (413) and in time (408),
before the app sees it. A 408, or a 413 found while reading, closes the
connection too. A 413 on a declared Content-Length keeps it: the client (it
passed auth) then reads its 413 instead of a reset, and uvicorn discards
the declared rest of the body without keeping it.

Auth uses Starlette's `AuthenticationMiddleware` with a `CallerBackend`
(tokens, a callers file, JWTs: see `access.py`), so `request.user` flows
into a2a-sdk's `ServerCallContext.user` and the task store scopes tasks to
their owner: one caller never sees another's. The agent card stays public:
a client needs it to learn which credentials are accepted at all.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Mapping

import anyio
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    BaseUser,
)
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import CredentialError, IssuerUnavailableError
from .auth.access import Access
from .auth.callers import Caller

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "BodyLimitMiddleware",
    "CallerBackend",
    "CallerUser",
    "HeaderCheck",
    "auth_error",
    "is_operator",
    "owner_of",
]

DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Largest request body a server accepts (bytes)."""

DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds a client has to send a request's whole body once its headers arrived."""


HeaderCheck = Callable[[HTTPConnection], Awaitable[Response | None]]
"""A route's own credential check, on the request's headers alone: the
response refusing it, or None to let it in."""


class CallerUser(BaseUser):
    """The Starlette user of an authenticated request: a2a-sdk's default
    context builder turns it into the `ServerCallContext` user, whose
    `user_name` (this `display_name`) is the owner the task stores scope by."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.caller.owner

    @property
    def identity(self) -> str:
        return self.caller.owner


def owner_of(conn: HTTPConnection) -> str:
    """The owner key of a request's caller; "" without auth (everyone is one caller)."""
    user = conn.scope.get("user")
    return user.caller.owner if isinstance(user, CallerUser) else ""


def is_operator(conn: HTTPConnection) -> bool:
    """Whether a request's caller is an operator (`callers.Caller.operator`)."""
    user = conn.scope.get("user")
    return isinstance(user, CallerUser) and user.caller.operator


class _Refused(AuthenticationError):
    """An `AuthenticationError` carrying the response it should get."""

    def __init__(self, status: int, headers: dict[str, str], detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.headers = headers


class CallerBackend(AuthenticationBackend):
    """Authenticates `Authorization: Bearer <credential>` with an `Access`.

    A missing credential is a 401 with a bare `WWW-Authenticate: Bearer`
    challenge; a malformed, unknown, expired or badly signed one a 401 with
    `error="invalid_token"` (RFC 6750); a JWT that cannot be checked because
    the issuer's keys are unavailable a 503 with Retry-After. Never a 500:
    nothing a client sends reaches past `Access.authenticate`'s errors.
    """

    def __init__(
        self, access: Access, public_paths: Collection[str], public_prefixes: Collection[str] = ()
    ) -> None:
        """`public_paths` and paths under `public_prefixes` need no bearer
        token (their routes check what they need)."""
        self._access = access
        self._public = frozenset(public_paths)
        self._public_prefixes = tuple(p.rstrip("/") + "/" for p in public_prefixes)

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, BaseUser] | None:
        path = conn.url.path
        if path in self._public or (
            self._public_prefixes and path.startswith(self._public_prefixes)
        ):
            return None
        scheme, _, credential = conn.headers.get("authorization", "").partition(" ")
        credential = credential.strip()
        if scheme.lower() != "bearer" or not credential:
            raise _Refused(401, {"WWW-Authenticate": _challenge()}, "missing bearer token")
        try:
            caller = await self._access.authenticate(credential)
        except IssuerUnavailableError as exc:
            raise _Refused(503, {"Retry-After": "30"}, str(exc)) from exc
        except CredentialError as exc:
            challenge = _challenge(error="invalid_token", description=str(exc))
            raise _Refused(401, {"WWW-Authenticate": challenge}, str(exc)) from exc
        return AuthCredentials(["authenticated"]), CallerUser(caller)


def _challenge(*, error: str | None = None, description: str | None = None) -> str:
    parts = ['Bearer realm="a2a"']
    if error:
        parts.append(f'error="{error}"')
    if description:
        # A quoted-string of printable ASCII (a header is latin-1 at most),
        # without quotes or backslashes, whatever a token put in the message.
        safe = "".join(
            c for c in description[:200] if c.isascii() and c.isprintable() and c not in '"\\'
        )
        parts.append(f'error_description="{safe}"')
    return ", ".join(parts)


def auth_error(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    # The body was not read: closing the connection is how the server
    # declines to read it at all (keep-alive would mean draining it first).
    status, headers = 401, {"WWW-Authenticate": _challenge()}
    if isinstance(exc, _Refused):
        status, headers = exc.status, exc.headers
    error = "unauthorized" if status == 401 else "service unavailable"
    return JSONResponse(
        {"error": error, "detail": str(exc)},
        status_code=status,
        headers={**headers, "Connection": "close"},
    )


class BodyLimitMiddleware:
    """Reads a request's body whole, within `max_bytes` and `timeout` seconds,
    before the app sees it.

    A declared Content-Length over the limit is a 413 at once, without
    reading; a body that passes the limit while being read (chunked) is a
    413 too, and one not complete `timeout` seconds after the request came
    in (a client trickling its body) is a 408. The body is handed on whole:
    the A2A dispatchers catch every exception an app raises, so a limit
    enforced while they read would come out as a JSON-RPC internal error
    instead of an HTTP status.
    """

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int = DEFAULT_MAX_BODY,
        timeout: float = DEFAULT_BODY_TIMEOUT,
        bodyless_paths: Collection[str] = (),
        header_checks: Mapping[str, HeaderCheck] | None = None,
    ) -> None:
        """`bodyless_paths` (the public agent card) take GET and HEAD only,
        without a body: any other method is a 405, a body a 413, both with
        the body unread, so a client without a token cannot make the server
        buffer a body there. Paths under a
        prefix of `header_checks` are let in by its check first, on their
        headers: a refusal is sent with the body unread and the connection
        closed."""
        self.app = app
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.bodyless = frozenset(bodyless_paths)
        self.header_checks = tuple(
            (prefix.rstrip("/") + "/", check) for prefix, check in (header_checks or {}).items()
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] in self.bodyless:
            if scope["method"] not in ("GET", "HEAD"):
                detail = f"{scope['path']} takes GET only"
                await _refuse(send, 405, "method not allowed", detail, close=True)
                return
            if _declares_body(scope):
                # A GET with a body would otherwise be read here, unauthenticated.
                detail = f"{scope['path']} takes no request body"
                await _refuse(send, 413, "payload too large", detail, close=True)
                return
        for prefix, check in self.header_checks:
            if scope["path"].startswith(prefix):
                refusal = await check(HTTPConnection(scope))
                if refusal is not None:
                    refusal.headers["connection"] = "close"
                    await refusal(scope, receive, send)
                    return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._too_large(send)
                return
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(self.timeout) as deadline:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break  # the client went away; the app sees an empty body
                size += len(message.get("body", b""))
                if size > self.max_bytes:
                    await self._too_large(send, close=True)
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
        if deadline.cancelled_caught:
            await _refuse(
                send,
                408,
                "request timeout",
                f"the request body did not arrive within {self.timeout:g} s",
                close=True,
            )
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send, *, close: bool = False) -> None:
        detail = f"request body over {self.max_bytes} bytes"
        await _refuse(send, 413, "payload too large", detail, close=close)


def _declares_body(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


async def _refuse(send: Send, status: int, error: str, detail: str, *, close: bool) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        # Whatever the client still sends is never read.
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
