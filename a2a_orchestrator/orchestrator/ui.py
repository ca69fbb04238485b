"""The orchestrator's web view: sessions, a session's tree of children, a
child's event log and result, live over server-sent events.

    GET /ui                                        sessions list
    GET /ui/sessions/{id}                          what was asked, how it ended, and
                                                   the tree under its root (the parent
                                                   agent or the pipeline): role,
                                                   transport, status, last event,
                                                   tokens, elapsed; stop buttons
    GET /ui/sessions/{id}/children/{child}         a child's event log and result
                                                   (`root`: the parent agent's)
    GET /ui/stream, /ui/sessions/{id}/stream,
        /ui/sessions/{id}/children/{child}/stream  the same, live (text/event-stream)
    GET /ui/static/{ui.js,ui.css}                  the page's script and style
                                                   (public: see `ui_auth.py`)
    POST /ui/sessions/{id}/questions/{question}    answer a question the session's
                                                   run asks ({"answer": TEXT})

Pages are rendered on the server (jinja2, autoescaped) and kept current by a
small script (`ui_static/ui.js`, no build step, nothing fetched from
elsewhere) that writes what the streams send with `textContent` only: child
text is untrusted and never becomes markup. A Content-Security-Policy that
allows only this origin's script and style backs that up.

The store is the source of truth: every stream reads new events from it by
sequence number, so a stream resumes exactly where it left off after a
reconnect (`Last-Event-ID`), whoever wrote them (this server, or a CLI run
on the same store). For a session this server holds, a listener on the
session wakes the stream as soon as an event is stored; otherwise it polls.

A question a session's run asks a person (`questions.py`) shows on the
session page, while this server holds the session, with a box to answer
it; the answer goes where the terminal's or the A2A caller's would, and the
first answer counts. The stop buttons call the HTTP API (`api.py`). Access is the API's: the
same authentication (a browser logs in once, see `ui_auth.py`), and a
caller sees only its own sessions (an operator also those run from the
command line); another's answer 404.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..delegation.session import Session
from ..runtime.budgets import Spend
from ..runtime.events import CHILD_EVENT_KINDS, event_from_dict
from ..runtime.records import RecordKind
from ..runtime.render import describe_event
from ..server.middleware import owner_of
from ..server.streams import StreamSlots
from ..storage.store import ROOT_ID, ChildRecord, Store, StoredEvent
from .api import visible_to
from .outcome import outcome_of
from .ui_auth import CSRF_SCOPE_KEY
from .ui_story import ROOT_PATH, Story, elapsed, frame, header, one_line, root_record

__all__ = ["MAX_SESSIONS", "POLL_SECONDS", "ui_routes"]

POLL_SECONDS = 1.0
"""How often a stream looks at the store when no listener wakes it."""

KEEPALIVE_SECONDS = 15.0
"""A comment line this often keeps proxies from closing an idle stream."""

MAX_SESSIONS = 200
"""The sessions list shows the newest this many."""

_PAGE = 500
_ANSWER_BYTES = 64 * 1024
"""The largest answer body taken (a question's answer is a few lines)."""
_DETAIL_CHARS = 20_000
# The page's own script and style, and nothing else, from this origin only.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("a2a_orchestrator.orchestrator", "ui_templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def _when(timestamp: float | None) -> str:
    if not timestamp:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def summarize(event: StoredEvent) -> dict[str, Any]:
    """One line of a child's log: a short summary and the full text (a JSON
    value; the page writes it as text)."""
    payload = event.payload
    if event.kind in CHILD_EVENT_KINDS:
        try:
            summary = describe_event(event_from_dict(dict(payload)))
        except (TypeError, ValueError):
            summary = event.kind
    elif event.kind == RecordKind.SUBAGENT_RESULT:
        # The parent's inbox got a child's FINAL_ANSWER: whose, and how it ended.
        who = f"{payload.get('role', 'child')} {str(payload.get('child_id', ''))[:6]}"
        summary = f"result of {who}: {payload.get('status', '')}"
    else:
        # A record (input, steer, control, a refusal): its kind and its first
        # text-like field.
        words = next(
            (
                str(payload[k])
                for k in ("text", "message", "action", "result", "reason")
                if k in payload
            ),
            "",
        )
        summary = f"{event.kind} {' '.join(words.split())[:80]}".strip()
    detail = next(
        (
            str(payload[k])
            for k in ("text", "message", "question", "output", "reason")
            if payload.get(k)
        ),
        "",
    )
    if not detail and payload.get("arguments"):
        detail = json.dumps(payload["arguments"], indent=2, ensure_ascii=False)
    return {
        "seq": event.seq,
        "time": _when(event.created_at),
        "kind": event.kind,
        "child_id": event.child_id or "",
        "summary": summary,
        "detail": detail[:_DETAIL_CHARS],
    }


def _status(record: ChildRecord) -> str:
    return f"{record.status} ({record.reason})" if record.reason else record.status


class _Tree:
    """A session's children as the page shows them, kept current from the
    store: each child's last event is followed incrementally by sequence."""

    def __init__(self, store: Store, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.seq = 0
        self.last: dict[str, str] = {}
        self.story = Story()

    async def advance(self) -> bool:
        """Read the events stored since the last call; whether there were any."""
        grew = False
        while True:
            page = await self.store.events(self.session_id, after=self.seq, limit=_PAGE)
            for event in page:
                # Deltas are summed up by the message that follows them.
                summary = summarize(event)["summary"] if event.kind != "message_delta" else ""
                if event.child_id and summary:
                    self.last[event.child_id] = summary
                self.story.see(event, summary)
            if page:
                self.seq, grew = page[-1].seq, True
            if len(page) < _PAGE:
                return grew

    async def rows(self, session: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The tree's rows: the root, then the children in tree order (each
        after its parent), with depth (see `ui_story.frame`)."""
        records = await self.store.list_children(session_id=self.session_id)
        spend = await self.store.child_usage(self.session_id)
        below: dict[str, list[ChildRecord]] = {}
        known = {r.child_id for r in records}
        for record in records:
            parent = record.parent_id if record.parent_id in known else ""
            below.setdefault(parent, []).append(record)
        rows: list[dict[str, Any]] = []

        def walk(parent: str, depth: int) -> None:
            for record in sorted(below.get(parent, []), key=lambda r: r.created_at):
                used = spend.get(record.child_id, Spend())
                running = record.status in ("running", "input_required")
                if running:
                    # The turn under way: what its model calls spent so far.
                    used = used + self.story.in_flight.get(record.child_id, Spend())
                rows.append(
                    {
                        "key": record.child_id,
                        "link": record.child_id,
                        "elapsed": elapsed(
                            record.created_at, None if running else record.completed_at
                        ),
                        "child_id": record.child_id,
                        "parent_id": record.parent_id,
                        "depth": depth,
                        "agent": record.agent or record.role,
                        "role": record.role,
                        "model": record.model,
                        "transport": record.transport,
                        "status": _status(record),
                        "state": record.status,
                        "last": self.last.get(record.child_id, ""),
                        "input_tokens": used.input_tokens,
                        "output_tokens": used.output_tokens,
                    }
                )
                walk(record.child_id, depth + 1)

        walk("", 0)
        outcome = await outcome_of(self.store, session)
        return frame(session, self.story, rows, spend, outcome)


class _Wake:
    """Wakes a stream when a session this server holds relays an event;
    `wait` returns after `POLL_SECONDS` otherwise. The listener only sets an
    event: a slow browser never slows a child."""

    def __init__(self, sessions: Callable[[], Mapping[str, Session]], session_id: str) -> None:
        self._sessions = sessions
        self._id = session_id
        self._held: Session | None = None
        self._remove: Callable[[], None] | None = None
        self._event = anyio.Event()

    async def _on_event(self, *_: object) -> None:
        self._event.set()

    def _follow(self) -> None:
        # The session may be opened, closed and opened again while a page is open.
        session = self._sessions().get(self._id) if self._id else None
        if session is self._held:
            return
        self.close()
        if session is not None:
            self._remove = session.add_listener(self._on_event)
        self._held = session

    async def wait(self) -> None:
        self._follow()
        with anyio.move_on_after(POLL_SECONDS):
            await self._event.wait()
        self._event = anyio.Event()

    def close(self) -> None:
        if self._remove is not None:
            try:
                self._remove()
            except ValueError:
                pass  # the session dropped its listeners already
        self._remove, self._held = None, None


def _sse(data: Any, *, event: str, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


_SEQ = re.compile(r"[0-9]{1,19}")
"""An event's seq as the streams send it: ASCII digits, below 2**63 (a
BIGINT in the store; `str.isdigit` would also take "²")."""


def _after(request: Request) -> int | None:
    """Where a stream resumes: the browser's Last-Event-ID on a reconnect,
    else the page's `after` (what it was rendered with), else 0 (both
    empty); None when the one given is not a seq this server sends."""
    for raw in (request.headers.get("last-event-id"), request.query_params.get("after")):
        if raw:
            return int(raw) if _SEQ.fullmatch(raw) and int(raw) < 2**63 else None
    return 0


class _CappedStream(StreamingResponse):
    """An event stream that holds one of its caller's stream slots while it
    is open (`streams.py`), or answers 429 when none is free."""

    def __init__(self, chunks: AsyncIterator[str], slots: StreamSlots, owner: str) -> None:
        headers = {**_HEADERS, "X-Accel-Buffering": "no"}
        super().__init__(chunks, media_type="text/event-stream", headers=headers)
        self.slots = slots
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Judged when the response starts: no await between this check and
        # taking the slot, so two streams cannot both take the last one.
        refused = self.slots.refused(self.owner)
        if refused is not None:
            too_many = JSONResponse(
                {"error": "too many open streams", "detail": str(refused)},
                status_code=429,
                headers={**_HEADERS, "Retry-After": str(refused.retry_after)},
            )
            await too_many(scope, receive, send)
            return
        with self.slots.held(self.owner):
            await super().__call__(scope, receive, send)


def ui_routes(
    store: Store,
    sessions: Callable[[], Mapping[str, Session]],
    streams: StreamSlots | None = None,
) -> list[Route]:
    """The web view's routes over `store`; `sessions()` gives the sessions
    this server holds open (their listeners wake the streams), and each
    open stream takes a slot of `streams` (default: its own `StreamSlots`)."""
    slots = streams if streams is not None else StreamSlots()

    def _stream(request: Request, chunks: AsyncIterator[str]) -> Response:
        return _CappedStream(chunks, slots, owner_of(request))

    def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        body = _templates.get_template(name).render(
            csrf=request.scope.get(CSRF_SCOPE_KEY, ""), **context
        )
        return HTMLResponse(body, status_code=status, headers=_HEADERS)

    def missing(request: Request, what: str) -> HTMLResponse:
        return page(request, "missing.html", status=404, what=what)

    async def visible(request: Request, session_id: str) -> dict[str, Any] | None:
        session = await store.get_session(session_id)
        return session if visible_to(session, request) else None

    async def session_list(request: Request) -> list[dict[str, Any]]:
        records = [s for s in await store.list_sessions() if visible_to(s, request)]
        records.sort(key=lambda s: s.get("created_at") or 0, reverse=True)
        rows = []
        for record in records[:MAX_SESSIONS]:
            children = await store.list_children(session_id=record["id"])
            counts: dict[str, int] = {}
            for child in children:
                counts[child.status] = counts.get(child.status, 0) + 1
            told = await header(store, record)
            rows.append(
                {
                    "id": record["id"],
                    "title": told["title"],
                    "created": _when(record.get("created_at")),
                    "children": len(children),
                    "counts": ", ".join(f"{n} {status}" for status, n in sorted(counts.items())),
                    "signal": told["signal"],
                    "ending": one_line(told["failure"] or told["answer"]),
                    "elapsed": told["elapsed"],
                    "tokens": told["tokens"],
                }
            )
        return rows

    async def sessions_page(request: Request) -> Response:
        return page(request, "sessions.html", sessions=await session_list(request))

    async def sessions_stream(request: Request) -> Response:

        async def chunks() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            sent: list[dict[str, Any]] | None = None
            quiet = 0.0
            while True:
                rows = await session_list(request)
                if rows != sent:
                    yield _sse(rows, event="sessions")
                    sent, quiet = rows, 0.0
                elif quiet >= KEEPALIVE_SECONDS:
                    yield ": keep-alive\n\n"
                    quiet = 0.0
                await anyio.sleep(POLL_SECONDS)
                quiet += POLL_SECONDS

        return _stream(request, chunks())

    def questions_of(session_id: str) -> list[dict[str, str]]:
        """The questions the session's run waits on, when this server holds it."""
        session = sessions().get(session_id)
        if session is None:
            return []
        return [
            {
                "id": q.id,
                "text": q.text,
                "who": q.who,
                "child_id": q.child_id,
            }
            for q in session.questions.pending()
        ]

    async def session_page(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        record = await visible(request, session_id)
        if record is None:
            return missing(request, f"session {session_id}")
        tree = _Tree(store, session_id)
        await tree.advance()
        return page(
            request,
            "session.html",
            session=record,
            told=await header(store, record),
            rows=await tree.rows(record),
            after=tree.seq,
            questions=questions_of(session_id),
        )

    async def answer(request: Request) -> Response:
        """Answer a pending question: 200 `{"answered": true}`; 409 when it
        no longer waits (answered elsewhere first, or withdrawn)."""
        session_id = request.path_params["session_id"]
        if await visible(request, session_id) is None:
            return JSONResponse({"error": "not found"}, status_code=404, headers=_HEADERS)
        body = await request.body()
        text = ""
        if len(body) <= _ANSWER_BYTES:
            try:
                data = json.loads(body)
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("answer"), str):
                text = data["answer"].strip()
        if not text:
            detail = f'send {{"answer": TEXT}}: a non-empty string, at most {_ANSWER_BYTES} bytes'
            return JSONResponse(
                {"error": "bad request", "detail": detail}, status_code=400, headers=_HEADERS
            )
        session = sessions().get(session_id)
        question_id = request.path_params["question_id"]
        if session is None or not session.questions.answer(question_id, text):
            return JSONResponse(
                {"error": "conflict", "detail": "that question no longer waits for an answer"},
                status_code=409,
                headers=_HEADERS,
            )
        return JSONResponse({"answered": True}, headers=_HEADERS)

    async def session_stream(request: Request) -> Response:
        session_id = request.path_params["session_id"]
        if await visible(request, session_id) is None:
            return Response("not found", status_code=404, headers=_HEADERS)

        async def paint(tree: _Tree, record: Mapping[str, Any]) -> str:
            told = _sse(await header(store, record), event="told")
            return told + _sse(await tree.rows(record), event="tree", seq=tree.seq)

        async def chunks() -> AsyncIterator[str]:
            tree = _Tree(store, session_id)
            wake = _Wake(sessions, session_id)
            try:
                yield "retry: 2000\n\n"
                # Last events come from the whole log, whatever the client
                # saw: a reconnect repaints the tree from the store.
                await tree.advance()
                record = await store.get_session(session_id) or {}
                yield await paint(tree, record)
                asked = questions_of(session_id)
                yield _sse(asked, event="questions")
                quiet = 0.0
                while True:
                    await wake.wait()
                    # A question comes and goes with an event of the child
                    # that asks (its question, then the answer as its input).
                    if questions_of(session_id) != asked:
                        asked = questions_of(session_id)
                        yield _sse(asked, event="questions")
                    # The record too: a pipeline's progress (how it ended)
                    # is written there, after its last event.
                    grew, was = await tree.advance(), record
                    record = await store.get_session(session_id) or {}
                    if grew or record != was:
                        yield await paint(tree, record)
                        quiet = 0.0
                    else:
                        quiet += POLL_SECONDS
                        if quiet >= KEEPALIVE_SECONDS:
                            yield ": keep-alive\n\n"
                            quiet = 0.0
            finally:
                wake.close()

        return _stream(request, chunks())

    async def child_of(request: Request) -> tuple[dict[str, Any], ChildRecord] | None:
        session_id = request.path_params["session_id"]
        record = await visible(request, session_id)
        child_id = request.path_params["child_id"]
        if record is not None and child_id == ROOT_PATH:
            return record, root_record(record)
        child = await store.get_child(child_id)
        if record is None or child is None or child.session_id != session_id:
            return None
        return record, child

    async def child_state(child_id: str, session_id: str) -> dict[str, Any]:
        if child_id == ROOT_PATH:
            session = await store.get_session(session_id) or {"id": session_id}
            outcome = await outcome_of(store, session)
            used = (await store.child_usage(session_id)).get(ROOT_ID, Spend())
            return {
                "status": outcome.signal,
                "state": "running" if outcome.signal == "unfinished" else "completed",
                "result": outcome.failure or outcome.answer,
                "input_tokens": used.input_tokens,
                "output_tokens": used.output_tokens,
            }
        child = await store.get_child(child_id)
        used = (await store.child_usage(session_id)).get(child_id, Spend())
        return {
            "status": _status(child) if child else "",
            "state": child.status if child else "",
            "result": child.result if child else "",
            "input_tokens": used.input_tokens,
            "output_tokens": used.output_tokens,
        }

    async def child_log(
        session_id: str, child_id: str, after: int
    ) -> tuple[list[dict[str, Any]], int, bool]:
        """One page of a child's log after `after`: its lines, the seq read up
        to (the next call's `after`) and whether a whole page was read (there
        may be more). The root's lines are the events of no child, read
        among the children's: the seq read up to passes theirs too, so
        neither a page nor a stream reads them again."""
        if child_id != ROOT_PATH:
            page = await store.events(session_id, child_id=child_id, after=after, limit=_PAGE)
            lines = [summarize(e) for e in page]
        else:
            page = await store.events(session_id, after=after, limit=_PAGE)
            lines = [summarize(e) for e in page if e.child_id is None]
        return lines, page[-1].seq if page else after, len(page) == _PAGE

    async def child_page(request: Request) -> Response:
        found = await child_of(request)
        if found is None:
            return missing(request, f"child {request.path_params['child_id']}")
        record, child = found
        lines: list[dict[str, Any]] = []
        read, more = 0, True
        while more:
            page_, read, more = await child_log(record["id"], child.child_id, read)
            lines.extend(page_)
        return page(
            request,
            "child.html",
            session=record,
            child=child,
            state=await child_state(child.child_id, record["id"]),
            lines=[line for line in lines if line["kind"] != "message_delta"],
            after=read,
            # The root stops with its children (the session's Stop button).
            stoppable=child.child_id != ROOT_PATH,
        )

    async def child_stream(request: Request) -> Response:
        found = await child_of(request)
        if found is None:
            return Response("not found", status_code=404, headers=_HEADERS)
        record, child = found
        resume = _after(request)
        if resume is None:
            return Response(
                "Last-Event-ID / after: not an event number", status_code=400, headers=_HEADERS
            )
        after = resume

        async def chunks() -> AsyncIterator[str]:
            nonlocal after
            wake = _Wake(sessions, record["id"])
            try:
                yield "retry: 2000\n\n"
                yield _sse(await child_state(child.child_id, record["id"]), event="child")
                quiet = 0.0
                while True:
                    lines, after, more = await child_log(record["id"], child.child_id, after)
                    for line in lines:
                        if line["kind"] != "message_delta":
                            yield _sse(line, event="line", seq=line["seq"])
                    if lines:
                        state = await child_state(child.child_id, record["id"])
                        yield _sse(state, event="child", seq=after)
                        quiet = 0.0
                    if more:
                        continue
                    await wake.wait()
                    quiet += POLL_SECONDS
                    if quiet >= KEEPALIVE_SECONDS:
                        yield ": keep-alive\n\n"
                        quiet = 0.0
            finally:
                wake.close()

        return _stream(request, chunks())

    return [
        Route("/ui", sessions_page, methods=["GET"]),
        Route("/ui/stream", sessions_stream, methods=["GET"]),
        Route("/ui/sessions/{session_id}", session_page, methods=["GET"]),
        Route("/ui/sessions/{session_id}/stream", session_stream, methods=["GET"]),
        Route("/ui/sessions/{session_id}/questions/{question_id}", answer, methods=["POST"]),
        Route("/ui/sessions/{session_id}/children/{child_id}", child_page, methods=["GET"]),
        Route(
            "/ui/sessions/{session_id}/children/{child_id}/stream", child_stream, methods=["GET"]
        ),
    ]
