"""The orchestrator's HTTP control API (JSON), beside its A2A endpoint.

    POST /api/sessions/{id}/subagents/stop   -> {"stopped": n}   cascading stop
    GET  /api/sessions                       -> {"sessions": [...]}
    GET  /api/sessions/{id}/children         -> {"children": [...]}
    GET  /api/sessions/{id}/events?after=&limit=&child=
                                             -> {"events": [...], "next": seq}

A session this process runs is stopped through its control plane; the
records of any session come from the store. An unknown session is a 404 with
a JSON body, never an empty list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .control import ControlPlane
from .store import Store

__all__ = ["MAX_PAGE", "api_routes"]

MAX_PAGE = 1000


def _not_found(session_id: str) -> JSONResponse:
    return JSONResponse(
        {"error": "not found", "detail": f"no session {session_id!r}"}, status_code=404
    )


def _int(request: Request, name: str, default: int, low: int, high: int) -> int | JSONResponse:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        return JSONResponse(
            {"error": "bad request", "detail": f"{name} must be an integer in [{low}, {high}]"},
            status_code=400,
        )
    return value


def api_routes(store: Store, planes: Callable[[], Mapping[str, ControlPlane]]) -> list[Route]:
    """Routes over `store`; `planes()` gives the live sessions' root control planes."""

    async def list_sessions(request: Request) -> JSONResponse:
        return JSONResponse({"sessions": await store.list_sessions()})

    async def stop(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        plane = planes().get(session_id)
        if plane is not None:
            return JSONResponse({"stopped": await plane.stop_children()})
        if await store.get_session(session_id) is None:
            return _not_found(session_id)
        # Not run by this process: nothing here is running to stop.
        return JSONResponse({"stopped": 0})

    async def children(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if await store.get_session(session_id) is None:
            return _not_found(session_id)
        records = await store.list_children(session_id=session_id)
        return JSONResponse({"children": [asdict(r) for r in records]})

    async def events(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if await store.get_session(session_id) is None:
            return _not_found(session_id)
        after = _int(request, "after", 0, 0, 2**62)
        if isinstance(after, JSONResponse):
            return after
        limit = _int(request, "limit", 100, 1, MAX_PAGE)
        if isinstance(limit, JSONResponse):
            return limit
        child = request.query_params.get("child")
        page = await store.events(session_id, child_id=child, after=after, limit=limit)
        body = {
            "events": [e.as_json() for e in page],
            "next": page[-1].seq if page else after,
        }
        return JSONResponse(body)

    return [
        Route("/api/sessions", list_sessions, methods=["GET"]),
        Route("/api/sessions/{session_id}/subagents/stop", stop, methods=["POST"]),
        Route("/api/sessions/{session_id}/children", children, methods=["GET"]),
        Route("/api/sessions/{session_id}/events", events, methods=["GET"]),
    ]
