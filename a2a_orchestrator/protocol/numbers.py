"""Whole numbers leave the A2A routes as JSON integers.

Metadata and data parts are protobuf `Struct`/`Value`s, whose numbers are
all doubles; a2a-sdk 1.3 turns every response into JSON through protobuf's
`MessageToDict`, so a token count of 565 goes out as `565.0`. A reader that
checks for an integer type (the A2A TCK, a strict peer) sees a float.

`integral_routes` wraps the JSON-RPC route and the HTTP+JSON routes (v1.0
and v0.3, also under a tenant mount) in an ASGI layer that rewrites what
they send: a JSON body whole, an SSE stream line by line (each `data:` line
is one JSON document; a line split across body chunks is held until its
end arrives, everything else is passed on at once). In each document, every
float inside a `metadata` or `data` value (at any depth: task, message,
artifact, status, part, error data) that is a whole number of magnitude at
most 2**53 (where a double is exact) becomes an int. Genuine fractions stay
floats (`cost: 0.0123`), and so does a whole-valued double such as
`seconds: 2.0`, which goes out as `2`: the same JSON number, and the A2A
types have no float fields of their own for this to blur. Values outside
`metadata` and `data` (a JSON-RPC `id`, protobuf's own ints) are untouched.

The rewrite is cheap where there is nothing to do: a document is parsed
only if its bytes hold `.0` and a delimiter (how `json.dumps` writes a
whole float ends), and sent re-encoded only if a number changed;
otherwise the SDK's bytes go out unchanged (`bench/integers.py` measures
both cases).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["IntegralNumbers", "integral_json", "integral_routes"]

_STRUCT_KEYS = frozenset({"metadata", "data"})
_EXACT = 2.0**53
# A whole float as `json.dumps` writes it ends in `.0` then a delimiter. No
# digit before it in the pattern: a leading `\d` makes the search try every
# digit of a text, 15 times slower on a tool's output.
_CANDIDATE = re.compile(rb"\.0[,}\]\s]")
_LINE_ENDS = re.compile(rb"(\r\n|\r|\n)")
_DATA = b"data:"


def integral_routes(
    routes: Sequence[BaseRoute], *, rpc_path: str, rest_prefix: str
) -> list[BaseRoute]:
    """`routes` with the JSON-RPC route at `rpc_path` and the HTTP+JSON
    routes under `rest_prefix` (in mounts too) sending whole numbers as
    integers; every other route as it was."""
    wrapped: list[BaseRoute] = []
    for route in routes:
        if isinstance(route, Mount):
            inner = integral_routes(route.routes, rpc_path=rpc_path, rest_prefix=rest_prefix)
            route = Mount(route.path, routes=inner, name=route.name)
        elif isinstance(route, Route) and (
            route.path == rpc_path or route.path.startswith(rest_prefix + "/")
        ):
            # A copy keeps the route's methods, name and converters; only
            # the app it calls (the endpoint after its own middleware) changes.
            route = copy.copy(route)
            route.app = IntegralNumbers(route.app)
        wrapped.append(route)
    return wrapped


class IntegralNumbers:
    """ASGI wrapper: the wrapped app's JSON and SSE responses with whole
    numbers in `metadata`/`data` as integers (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sender = _Sender(send)
        await self.app(scope, receive, sender)


class _Sender:
    """The `send` the wrapped app calls: JSON bodies are held until whole
    (their Content-Length may change), SSE lines pass on as they complete,
    anything else passes through."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._mode = ""
        self._start: Message | None = None
        self._held: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            media = _content_type(message)
            if "json" in media:
                self._mode = "json"
                self._start = message
                return
            self._mode = "sse" if media.startswith("text/event-stream") else "other"
        elif kind == "http.response.body" and self._mode == "json":
            await self._json_body(message)
            return
        elif kind == "http.response.body" and self._mode == "sse":
            await self._sse_body(message)
            return
        await self._send(message)

    async def _json_body(self, message: Message) -> None:
        self._held.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(self._held)
        self._held.clear()
        start = self._start
        assert start is not None  # the start message comes first
        rewritten = integral_json(body)
        if rewritten is not None:
            body = rewritten
            start = {**start, "headers": _with_length(start.get("headers", []), len(body))}
        await self._send(start)
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _sse_body(self, message: Message) -> None:
        more = message.get("more_body", False)
        chunk = message.get("body", b"")
        if self._held:
            chunk = self._held.pop() + chunk
        if more:
            # Only complete lines go on; an SSE line is content up to a line end.
            end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1
            if end < len(chunk):
                self._held.append(chunk[end:])
                chunk = chunk[:end]
            if not chunk:
                return
        if b".0" in chunk and _CANDIDATE.search(chunk) is not None:
            chunk = _integral_lines(chunk)
        await self._send({"type": "http.response.body", "body": chunk, "more_body": more})


def _content_type(start: Message) -> str:
    for name, value in start.get("headers", []):
        if name.lower() == b"content-type":
            return bytes(value).decode("latin-1").lower()
    return ""


def _with_length(headers: Sequence[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name.lower() != b"content-length"]
    return [*kept, (b"content-length", str(length).encode("latin-1"))]


def _integral_lines(chunk: bytes) -> bytes:
    """`chunk` (whole SSE lines) with each `data:` line's JSON rewritten;
    line ends and every other line as they were."""
    pieces = _LINE_ENDS.split(chunk)
    changed = False
    for index in range(0, len(pieces), 2):  # odd indexes are the line ends
        line = pieces[index]
        if not line.startswith(_DATA):
            continue
        prefix = len(_DATA) + (1 if line[len(_DATA) : len(_DATA) + 1] == b" " else 0)
        rewritten = integral_json(line[prefix:])
        if rewritten is not None:
            pieces[index] = line[:prefix] + rewritten
            changed = True
    return b"".join(pieces) if changed else chunk


def integral_json(document: bytes) -> bytes | None:
    """`document` (JSON) re-encoded with the whole floats inside its
    `metadata` and `data` values as ints; None when there are none (or it
    is not JSON), so the caller keeps the bytes it has."""
    if b".0" not in document or _CANDIDATE.search(document) is None:
        return None
    try:
        value = json.loads(document)
    except ValueError:
        return None
    if not _struct_fields(value):
        return None
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _whole(number: float) -> int | None:
    # inf and nan are not integers; past 2**53 a double is no exact count.
    if number.is_integer() and -_EXACT <= number <= _EXACT:
        return int(number)
    return None


def _struct_fields(node: Any) -> bool:
    """Make ints of the whole floats under every `metadata`/`data` key in
    `node` (in place); whether any changed."""
    changed = False
    if type(node) is dict:
        for key, value in node.items():
            kind = type(value)
            if key in _STRUCT_KEYS:
                if kind is float:
                    whole = _whole(value)
                    if whole is not None:
                        node[key] = whole
                        changed = True
                elif kind is dict or kind is list:
                    changed |= _all_numbers(value)
            elif kind is dict or kind is list:
                changed |= _struct_fields(value)
    elif type(node) is list:
        for item in node:
            if type(item) is dict or type(item) is list:
                changed |= _struct_fields(item)
    return changed


def _all_numbers(node: Any) -> bool:
    """Make ints of every whole float in `node` (in place); whether any changed."""
    changed = False
    entries = node.items() if type(node) is dict else enumerate(node)
    for key, value in entries:
        kind = type(value)
        if kind is float:
            whole = _whole(value)
            if whole is not None:
                node[key] = whole  # replaces a value: the dict's size stays
                changed = True
        elif kind is dict or kind is list:
            changed |= _all_numbers(value)
    return changed
