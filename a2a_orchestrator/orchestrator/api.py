"""The orchestrator's HTTP control API (JSON), beside its A2A endpoint.

    POST /api/sessions/{id}/subagents/stop   -> {"stopped": n}   cascading stop
    POST /api/sessions/{id}/children/{child_id}/stop
                                             -> {"child_id": ..., "stopped": bool}
                                                one child, for good (as `agent_abort`)
    GET  /api/sessions                       -> {"sessions": [...]}   each with its `usage`
    GET  /api/sessions/{id}/children         -> {"children": [...]}   each with `usage`
                                                (its own) and `subtree_usage`
    GET  /api/sessions/{id}/usage            -> {"usage": {...}, "parent": {...},
                                                 "children": {id: {...}}}
                                                the session's whole spend (the one
                                                sum, `Store.session_usage`), its
                                                parent agent's own, each child's
                                                subtree's
    GET  /api/sessions/{id}/events?after=&limit=&child=
                                             -> {"events": [...], "next": seq}

A session this process runs is stopped through its control plane; the
records of any session come from the store. An unknown session is a 404 with
a JSON body, never an empty list.

Sessions belong to their caller (`OWNER_KEY` in the session's metadata, the
owner key of the caller whose A2A task opened it; "" without auth, and for
sessions the CLI runs): a caller lists only its own, and another caller's
session answers exactly as one that does not exist. An operator (the
server's own token, or a caller the callers file marks `operator = true`)
also sees the sessions of no caller: those the CLI ran on this store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..control.plane import ControlPlane
from ..runtime.budgets import Spend
from ..server.middleware import is_operator, owner_of
from ..storage.store import ROOT_ID, Store

__all__ = ["MAX_PAGE", "OWNER_KEY", "api_routes", "owns", "visible_to"]

OWNER_KEY = "owner"
"""The session metadata field naming the caller a session belongs to."""

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


def owns(session: Mapping[str, Any] | None, owner: str) -> bool:
    """Whether `session` (a store record) exists and belongs to `owner`."""
    return session is not None and session["metadata"].get(OWNER_KEY, "") == owner


def visible_to(session: Mapping[str, Any] | None, conn: HTTPConnection) -> bool:
    """Whether the caller of `conn` may see `session`: its own, and, for an
    operator, the sessions of no caller (run from the command line)."""
    if owns(session, owner_of(conn)):
        return True
    return is_operator(conn) and owns(session, "")


def api_routes(store: Store, planes: Callable[[], Mapping[str, ControlPlane]]) -> list[Route]:
    """Routes over `store`; `planes()` gives the live sessions' root control planes."""

    async def visible(request: Request, session_id: str) -> bool:
        return visible_to(await store.get_session(session_id), request)

    async def list_sessions(request: Request) -> JSONResponse:
        sessions = [s for s in await store.list_sessions() if visible_to(s, request)]
        for session in sessions:
            session["usage"] = (await store.session_usage(session["id"])).as_dict()
        return JSONResponse({"sessions": sessions})

    async def stop(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if not await visible(request, session_id):
            return _not_found(session_id)
        plane = planes().get(session_id)
        if plane is not None:
            return JSONResponse({"stopped": await plane.stop_children()})
        # Not run by this process: nothing here is running to stop.
        return JSONResponse({"stopped": 0})

    async def stop_child(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        child_id = request.path_params["child_id"]
        if not await visible(request, session_id):
            return _not_found(session_id)
        record = await store.get_child(child_id)
        if record is None or record.session_id != session_id:
            return JSONResponse(
                {"error": "not found", "detail": f"no child {child_id!r} in {session_id!r}"},
                status_code=404,
            )
        plane = planes().get(session_id)
        handle = plane.session.children.get(child_id) if plane is not None else None
        if plane is None or handle is None:
            # Not held by this process: nothing here is running to stop.
            return JSONResponse({"child_id": child_id, "stopped": False})
        # The root's plane ends any descendant: `terminate` records the stop
        # in the session, whoever the child's parent is.
        return JSONResponse({"child_id": child_id, "stopped": await plane.terminate(handle)})

    async def children(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if not await visible(request, session_id):
            return _not_found(session_id)
        records = await store.list_children(session_id=session_id)
        own = await store.child_usage(session_id)
        subtree = await store.subtree_usage(session_id)
        rows = [
            {
                **asdict(r),
                "usage": own.get(r.child_id, Spend()).as_dict(),
                "subtree_usage": subtree.get(r.child_id, Spend()).as_dict(),
            }
            for r in records
        ]
        return JSONResponse({"children": rows})

    async def usage(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if not await visible(request, session_id):
            return _not_found(session_id)
        subtree = await store.subtree_usage(session_id)
        own = await store.child_usage(session_id)
        body = {
            "usage": (await store.session_usage(session_id)).as_dict(),
            "parent": own.get(ROOT_ID, Spend()).as_dict(),
            "children": {child_id: spend.as_dict() for child_id, spend in subtree.items()},
        }
        return JSONResponse(body)

    async def events(request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if not await visible(request, session_id):
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
        Route("/api/sessions/{session_id}/children/{child_id}/stop", stop_child, methods=["POST"]),
        Route("/api/sessions/{session_id}/events", events, methods=["GET"]),
        Route("/api/sessions/{session_id}/usage", usage, methods=["GET"]),
    ]
