"""A caller gone from a forwarded stream ends the forwarding's stream too.

Two real uvicorn servers on 127.0.0.1 and a throwaway PostgreSQL
(`postgres.py`): the session's owner, a plain streaming endpoint standing
in for the owner replica (it streams until its caller goes, and records
when that happens: the forwarding's own behaviour is under test, not the
orchestrator's), and a replica whose `SessionForwarding` finds the owner's
URL in the real lease table. The caller reads the start of its stream and
hangs up: the forwarder must hang up on the owner too, else it relays into
nothing until the owner's stream ends (a whole turn), holding a connection
and, on a real owner, the caller's stream slot.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from support.postgres import Postgres
from support.servers import serving

from a2a_orchestrator.orchestrator.forwarding import SessionForwarding
from a2a_orchestrator.storage.session_leases import Leases
from a2a_orchestrator.storage.store_pg import PgStore

pytestmark = pytest.mark.anyio


BODY = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "SendStreamingMessage",
    "params": {"message": {"messageId": "m1", "contextId": "s1", "parts": [{"text": "hi"}]}},
}


@contextlib.asynccontextmanager
async def forwarder(postgres: Postgres, owner_app: Starlette) -> AsyncIterator[str]:
    """A replica's forwarding in front of a fallback app, session `s1`
    leased to `owner_app` (served); yields the replica's URL."""

    async def here(request: Request) -> JSONResponse:
        return JSONResponse({"answered": "here"})

    async def ignored(session_id: str) -> None:
        del session_id

    store = PgStore(postgres.url(postgres.database("forwarding")))
    try:
        async with serving(owner_app) as owner_url:
            await store.leases.claim("s1", "owner-replica", 60, url=owner_url)
            leases = Leases(
                store,
                url="http://127.0.0.1:1/",
                owner="this-replica",
                on_takeover=ignored,
                on_lost=lambda _session_id: None,
            )
            app = Starlette(
                routes=[Route("/", here, methods=["POST"])],
                middleware=[Middleware(SessionForwarding, leases=leases)],
            )
            async with serving(app) as url:
                yield url
    finally:
        store.close()


async def test_a_caller_hanging_up_a_forwarded_stream_ends_it_at_the_owner(
    postgres: Postgres,
) -> None:
    hung_up = anyio.Event()

    async def stream(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield b"data: {}\n\n"
                    await anyio.sleep(0.1)
            finally:
                hung_up.set()

        return StreamingResponse(events(), media_type="text/event-stream")

    owner_app = Starlette(routes=[Route("/", stream, methods=["POST"])])
    with anyio.fail_after(30):
        async with forwarder(postgres, owner_app) as url, httpx.AsyncClient(timeout=10) as http:
            async with http.stream("POST", url + "/", content=json.dumps(BODY)) as answer:
                first = await anext(answer.aiter_raw())
            # Hung up: the owner's stream ends within a few seconds.
            with anyio.move_on_after(5):
                await hung_up.wait()
            ended = hung_up.is_set()
    assert first.startswith(b"data: ")  # forwarded from the owner
    assert ended


class _AnswersLate:
    """An owner that answers only when its caller goes (a long blocking
    SendMessage); `hung_up` is set when the forwarder hangs up on it."""

    def __init__(self) -> None:
        self.asked = anyio.Event()
        self.hung_up = anyio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body", False):
            pass
        self.asked.set()
        while (await receive())["type"] != "http.disconnect":
            pass
        self.hung_up.set()


async def test_a_caller_hanging_up_before_the_owner_answers_ends_the_wait(
    postgres: Postgres,
) -> None:
    owner = _AnswersLate()
    owner_app = Starlette(routes=[Route("/", owner, methods=["POST"])])
    with anyio.fail_after(30):
        async with forwarder(postgres, owner_app) as url, httpx.AsyncClient(timeout=10) as http:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(http.post, url + "/", content=json.dumps(BODY)))
                await owner.asked.wait()
                tg.cancel_scope.cancel()  # the caller hangs up, unanswered
            with anyio.move_on_after(5):
                await owner.hung_up.wait()
            ended = owner.hung_up.is_set()
    assert ended
