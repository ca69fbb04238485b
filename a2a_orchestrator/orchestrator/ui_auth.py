"""How a browser authenticates to the orchestrator: a login form and a cookie.

A browser's `EventSource` cannot send an `Authorization` header, so the web
view (`ui.py`) logs in once: `POST /ui/login` checks the token with the
server's `Access` (the same rule as the header) and answers with a cookie
holding it (`HttpOnly`, `SameSite=Strict`, `Secure` over HTTPS). On later
requests to the web view's and its API's own routes (`ui.py`, `api.py`)
that carry no `Authorization` header, `BrowserLogin` turns the cookie into
exactly that header, so the server's own authentication middleware
(`middleware.CallerBackend`) decides as for any client. The cookie is never
honoured anywhere else: a path is matched against those routes' patterns,
not a prefix, so an A2A route under a tenant named `ui` or `api`
(`/ui/rest/tasks`) or one that merely starts alike (`/uix/...`) needs its
bearer header as every A2A route does.

Cross-site request forgery: besides `SameSite=Strict`, a request that is
not GET or HEAD and is authenticated by the cookie must carry
`X-CSRF-Token` (an HMAC of the credential under a key of this process,
which the pages embed) and, when the browser sends one, an `Origin` equal to
the server's own; otherwise it is a 403 before anything runs. A page
rendered before a restart carries the old key's token: reload it.

The page's script and style (`/ui/static/`) are served here, before any
check: they hold no data, and the login form needs its style too.

Without auth (no `Access`) there is nothing to log in to: the login page
redirects to the sessions list and requests pass untouched.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import html
import json
import secrets
from collections.abc import Sequence
from importlib import resources
from urllib.parse import parse_qs

import anyio
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import CredentialError, IssuerUnavailableError
from ..server.auth.access import Access

__all__ = ["COOKIE", "CSRF_HEADER", "CSRF_SCOPE_KEY", "LOGIN_PATH", "BrowserLogin"]

COOKIE = "a2a_ui"
"""The cookie carrying a browser's credential."""

CSRF_HEADER = "x-csrf-token"
CSRF_SCOPE_KEY = "a2a_orchestrator.csrf"
"""Where `BrowserLogin` leaves the request's CSRF token for the pages."""

LOGIN_PATH = "/ui/login"
LOGOUT_PATH = "/ui/logout"
STATIC_PREFIX = "/ui/static/"
_STATIC = {"ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}
_SAFE = ("GET", "HEAD")
_MAX_FORM = 16 * 1024
_FORM_TIMEOUT = 10.0


def _encode(credential: str) -> str:
    # Tokens may hold characters a cookie value cannot (`;`, spaces, quotes).
    return base64.urlsafe_b64encode(credential.encode()).decode()


def _decode(value: str) -> str:
    try:
        return base64.urlsafe_b64decode(value.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""


class BrowserLogin:
    """ASGI middleware, outermost: serves the login form and turns the login
    cookie into a bearer header for the routes it is given (see the module docstring)."""

    def __init__(self, app: ASGIApp, access: Access | None, cookie_routes: Sequence[Route]) -> None:
        """`cookie_routes`: the web view's and its API's routes, the only
        ones the cookie opens (those under `/ui` are its pages)."""
        self.app = app
        self.access = access
        self._key = secrets.token_bytes(32)
        self._patterns = tuple(route.path_regex for route in cookie_routes)

    def _opens(self, path: str) -> bool:
        return any(pattern.match(path) for pattern in self._patterns)

    def csrf_token(self, credential: str) -> str:
        return hmac.new(self._key, credential.encode(), hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path == LOGIN_PATH:
            await self._login(scope, receive, send)
            return
        if path.startswith(STATIC_PREFIX):
            await _static(path.removeprefix(STATIC_PREFIX), send)
            return
        if path == LOGOUT_PATH:
            await _redirect(send, LOGIN_PATH, cookie=_cookie(scope, "", clear=True))
            return
        if self.access is None or not self._opens(path):
            scope[CSRF_SCOPE_KEY] = self.csrf_token("")
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if "authorization" in headers:
            # A client with its own header: the cookie plays no part.
            await self.app(scope, receive, send)
            return
        credential = _decode(HTTPConnection(scope).cookies.get(COOKIE, ""))
        page = (path == "/ui" or path.startswith("/ui/")) and scope["method"] in _SAFE
        if not credential:
            if page and not path.endswith("/stream"):
                await _redirect(send, LOGIN_PATH)
                return
            await self.app(scope, receive, send)  # refused there, as any request without one
            return
        token = self.csrf_token(credential)
        if scope["method"] not in _SAFE:
            problem = _forgery(scope, headers, token)
            if problem:
                await _send(
                    send,
                    403,
                    "application/json",
                    json.dumps({"error": "forbidden", "detail": problem}).encode(),
                )
                return
        scope = {
            **scope,
            "headers": [
                *scope["headers"],
                (b"authorization", f"Bearer {credential}".encode("latin-1", "replace")),
            ],
            CSRF_SCOPE_KEY: token,
        }
        if page:
            send = _to_login_on_401(send)
        await self.app(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.access is None:
            await _redirect(send, "/ui")
            return
        if scope["method"] in _SAFE:
            await _send(send, 200, "text/html; charset=utf-8", _form())
            return
        if scope["method"] != "POST":
            await _send(send, 405, "text/plain", b"method not allowed")
            return
        origin = Headers(scope=scope).get("origin")
        if origin is not None and origin != _own_origin(scope):
            await _send(send, 403, "text/plain", b"cross-origin login refused")
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > _MAX_FORM:
            # Refused unread: a login form is small, and nobody is known yet.
            await _send(send, 413, "text/plain", b"form too large", close=True)
            return
        body = await _read_form(receive)
        if body is None:
            await _send(send, 413, "text/plain", b"form too large or too slow", close=True)
            return
        credential = (parse_qs(body.decode("utf-8", "replace")).get("token") or [""])[0].strip()
        try:
            await self.access.authenticate(credential)
        except IssuerUnavailableError:
            await _send(
                send,
                503,
                "text/html; charset=utf-8",
                _form("The token issuer cannot be reached to check the token; try again shortly."),
            )
            return
        except CredentialError:
            await _send(send, 401, "text/html; charset=utf-8", _form("That token is not accepted."))
            return
        await _redirect(send, "/ui", cookie=_cookie(scope, _encode(credential)))


async def _static(name: str, send: Send) -> None:
    if name not in _STATIC:
        await _send(send, 404, "text/plain", b"not found")
        return
    body = resources.files("a2a_orchestrator.orchestrator").joinpath("ui_static", name).read_bytes()
    await _send(send, 200, _STATIC[name], body)


def _forgery(scope: Scope, headers: Headers, token: str) -> str:
    """Why a cookie-authenticated unsafe request looks forged; "" when it does not."""
    origin = headers.get("origin")
    if origin is not None and origin != _own_origin(scope):
        return "cross-origin request refused"
    if not hmac.compare_digest(headers.get(CSRF_HEADER, ""), token):
        return f"missing or stale {CSRF_HEADER} header (reload the page)"
    return ""


def _own_origin(scope: Scope) -> str:
    host = Headers(scope=scope).get("host", "")
    return f"{scope.get('scheme', 'http')}://{host}"


def _cookie(scope: Scope, value: str, *, clear: bool = False) -> bytes:
    parts = [f"{COOKIE}={value}", "Path=/", "HttpOnly", "SameSite=Strict"]
    if scope.get("scheme") == "https":
        parts.append("Secure")
    if clear:
        parts.append("Max-Age=0")
    return "; ".join(parts).encode()


async def _read_form(receive: Receive) -> bytes | None:
    """The request body, or None past `_MAX_FORM` bytes or `_FORM_TIMEOUT` seconds
    (this runs before the server's own body limits)."""
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(_FORM_TIMEOUT):
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b""
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > _MAX_FORM:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
    return None


def _form(error: str = "") -> bytes:
    notice = f'<p class="error">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a2a-orchestrator: log in</title>
<link rel="stylesheet" href="/ui/static/ui.css"></head>
<body><main class="login"><h1>a2a-orchestrator</h1>{notice}
<form method="post" action="{LOGIN_PATH}">
<label>Bearer token <input type="password" name="token" autocomplete="current-password"
 autofocus required></label>
<button type="submit">Log in</button></form>
<p class="hint">The token you give the API as <code>Authorization: Bearer</code>.
It is kept in an HttpOnly cookie for this site only.</p></main></body></html>
""".encode()


_SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


async def _send(
    send: Send, status: int, content_type: str, body: bytes, *, close: bool = False
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        *_SECURITY_HEADERS,
    ]
    if close:
        headers.append((b"connection", b"close"))  # what is left of the body is never read
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send: Send, location: str, *, cookie: bytes | None = None) -> None:
    headers = [(b"location", location.encode()), (b"content-length", b"0"), *_SECURITY_HEADERS]
    if cookie is not None:
        headers.append((b"set-cookie", cookie))
    await send({"type": "http.response.start", "status": 303, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _to_login_on_401(send: Send) -> Send:
    """A page whose cookie is refused (a token revoked or expired) goes back
    to the login form, the cookie cleared, instead of showing a JSON 401."""
    refused = False

    async def wrapped(message: Message) -> None:
        nonlocal refused
        if message["type"] == "http.response.start" and message["status"] == 401:
            refused = True
            cookie = f"{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0".encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 303,
                    "headers": [
                        (b"location", LOGIN_PATH.encode()),
                        (b"set-cookie", cookie),
                        (b"content-length", b"0"),
                    ],
                }
            )
            return
        if refused:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b""})
            return
        await send(message)

    return wrapped
