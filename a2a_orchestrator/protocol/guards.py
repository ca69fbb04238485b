"""Route wrappers that answer bad input with the error the A2A spec names
where a2a-sdk 1.3's own routes answer 500, cut the connection or answer
another error, and label the HTTP+JSON answers as the spec does.

What they cover (most found by fuzzing the served routes,
`tests/properties/test_guards.py`; the media types by the A2A TCK,
`tests/protocol/test_tck_media.py`):

- JSON-RPC (`/`): a body that is not UTF-8, or JSON nested past Python's
  recursion limit, gets -32603 internal error from the SDK; it is a parse
  error, -32700. A request whose Content-Type is not JSON is read by the SDK
  all the same (-32700 when its body does not parse, else an answer); it is
  ContentTypeNotSupportedError, -32005 (spec 5.4, 9.1; TCK JSONRPC-SSE-002),
  in the v0.3 error shape for a v0.3 method. A request without a
  Content-Type is read as JSON, as before: a client that leaves it out still
  sends JSON-RPC. `application/json` and the `+json` types (`application/a2a+json`)
  are JSON.
- HTTP+JSON answers: a2a-sdk labels them `application/a2a+json`; the
  binding's Content-Type is `application/json` (spec 11.1; TCK
  HTTP_JSON-SVC-001), which they go out as. Streams stay `text/event-stream`.
- HTTP+JSON, v1.0 and v0.3 (`/rest/...`, `/rest/v1/...`, and under a
  tenant): a body that is not UTF-8 gets HTTP 500 "unknown exception", on
  v0.3 also one that is not JSON, or a `historyLength` that is not an
  integer, and on both one past the 32-bit range the protocol's integers
  have; here each is a 400 in the SDK's own error format.
- v0.3 HTTP+JSON streams (`message:stream`, `tasks/{id}:subscribe`): the
  SDK starts the SSE response before the first event, so an error (a bad
  body, an unknown task, a task already finished) cuts the stream; here the
  first event is awaited before answering, so the error comes back as an
  HTTP error response (e.g. 400 UnsupportedOperation for a finished task),
  as the v1.0 routes already do.

Each wrapper checks only what it must, and hands the request (its body
already read and cached on it) to the SDK's endpoint unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from a2a.server.jsonrpc_models import JSONParseError
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.utils.constants import A2A_JSON_MEDIA_TYPE
from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import JSON_RPC_ERROR_CODE_MAP, ContentTypeNotSupportedError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

__all__ = ["guard_routes"]

Endpoint = Callable[[Request], Awaitable[Response]]

_V0_3_REST = "/v1/"
_STREAMING_SUFFIXES = (":stream", ":subscribe")
_INTEGER_PARAMS = ("historyLength", "pageSize")
_INT32 = range(-(2**31), 2**31)
_NOTHING = object()


def guard_routes(
    routes: Sequence[BaseRoute], *, rpc_path: str, rest_prefix: str
) -> list[BaseRoute]:
    """`routes` with the JSON-RPC route at `rpc_path` and the HTTP+JSON
    routes under `rest_prefix` wrapped (in mounts too: the tenant routes);
    every other route as it was."""
    guarded: list[BaseRoute] = []
    for route in routes:
        if isinstance(route, Mount):
            inner = guard_routes(route.routes, rpc_path=rpc_path, rest_prefix=rest_prefix)
            route = Mount(route.path, routes=inner, name=route.name)
        elif isinstance(route, Route) and route.methods is not None:
            if route.path == rpc_path:
                route = _rewrapped(route, _jsonrpc_guard(route.endpoint))
            elif route.path.startswith(rest_prefix + "/"):
                # Only the v0.3 streams start before their first event.
                streaming = route.path.startswith(rest_prefix + _V0_3_REST) and route.path.endswith(
                    _STREAMING_SUFFIXES
                )
                route = _rewrapped(route, _rest_guard(route.endpoint, streaming=streaming))
        guarded.append(route)
    return guarded


def _rewrapped(route: Route, endpoint: Endpoint) -> Route:
    methods = sorted(set(route.methods or ()) - {"HEAD"})
    return Route(route.path, endpoint, methods=methods, name=route.name)


def _parsed(body: bytes) -> tuple[Any, str | None]:
    """`body`'s JSON document and None, or why it is not one."""
    try:
        return json.loads(body.decode("utf-8")), None
    except UnicodeDecodeError as exc:
        return None, f"the body is not UTF-8: {exc}"
    except RecursionError:
        return None, "the body's JSON is nested too deeply"
    except ValueError as exc:
        return None, f"the body is not JSON: {exc}"


def _json_problem(body: bytes) -> str | None:
    """Why `body` is not a JSON document, or None."""
    return _parsed(body)[1]


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def _is_json(media: str) -> bool:
    return (
        not media
        or media == "application/json"
        or (media.startswith("application/") and media.endswith("+json"))
    )


def _unsupported_media(document: Any, media: str) -> Response:
    """The JSON-RPC answer to a request whose Content-Type `media` is not
    JSON; `document` is its body, parsed if it could be (its id and method)."""
    request_id = document.get("id") if isinstance(document, dict) else None
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        request_id = None
    method = document.get("method") if isinstance(document, dict) else None
    error = ContentTypeNotSupportedError(
        message=f"Content-Type {media} is not supported: JSON-RPC requests are application/json"
    )
    if isinstance(method, str) and "/" in method:
        # A v0.3 method (`message/send`): v0.3 errors carry no ErrorInfo list.
        code = JSON_RPC_ERROR_CODE_MAP[ContentTypeNotSupportedError]
        body = {"code": code, "message": error.message}
        answer = {"jsonrpc": "2.0", "id": request_id, "error": body}
    else:
        answer = build_error_response(request_id, error)
    return JSONResponse(answer, status_code=200)


def _jsonrpc_guard(endpoint: Endpoint) -> Endpoint:
    async def guarded(request: Request) -> Response:
        media = _media_type(request)
        if not _is_json(media):
            return _unsupported_media(_parsed(await request.body())[0], media)
        document, problem = _parsed(await request.body())
        if problem is not None:
            error = build_error_response(None, JSONParseError(message=problem))
            return JSONResponse(error, status_code=200)  # JSON-RPC errors ride on 200
        # Parsed once: the SDK reads the body with `request.json()`, which
        # returns what starlette cached here instead of parsing it again.
        request._json = document
        return await endpoint(request)

    return guarded


def _rest_error(message: str) -> Response:
    return JSONResponse(
        {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": message}},
        status_code=400,
    )


def _rest_guard(endpoint: Endpoint, *, streaming: bool) -> Endpoint:
    async def guarded(request: Request) -> Response:
        for name in _INTEGER_PARAMS:
            value = request.query_params.get(name)
            if value is not None and not _is_integer(value):
                return _rest_error(f"query parameter {name} must be a 32-bit integer")
        body = await request.body()
        if body:
            problem = _json_problem(body)
            if problem is not None:
                return _rest_error(problem)
        response = await endpoint(request)
        if streaming:
            response = await _first_event_awaited(response)
        if response.headers.get("content-type", "").startswith(A2A_JSON_MEDIA_TYPE):
            response.headers["content-type"] = "application/json"
        return response

    return guarded


def _is_integer(value: str) -> bool:
    try:
        return int(value) in _INT32
    except ValueError:
        return False


async def _first_event_awaited(response: Response) -> Response:
    """`response` (an SSE response whose events are still to come), or the
    error its first event raises as an HTTP error response."""
    events: Any = getattr(response, "body_iterator", None)
    if events is None:
        return response  # already an error response
    first: Any = _NOTHING
    try:
        first = await anext(events)
    except StopAsyncIteration:
        pass
    except Exception as exc:
        payload = build_rest_error_payload(exc)
        return JSONResponse(payload, status_code=payload["error"]["code"])

    async def replayed() -> AsyncIterator[Any]:
        if first is not _NOTHING:
            yield first
        async for event in events:
            yield event

    response.body_iterator = replayed()  # type: ignore[attr-defined]
    return response
