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
from support.postgres import Postgres
from support.servers import serving

from a2a_orchestrator.orchestrator.forwarding import SessionForwarding
from a2a_orchestrator.storage.session_leases import Leases
from a2a_orchestrator.storage.store_pg import PgStore

pytestmark = pytest.mark.anyio


async def test_a_caller_hanging_up_a_forwarded_stream_ends_it_at_the_owner(
    postgres: Postgres,
) -> None:
    store = PgStore(postgres.url(postgres.database("forwarding")))
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

    async def here(request: Request) -> JSONResponse:
        return JSONResponse({"answered": "here"})

    owner_app = Starlette(routes=[Route("/", stream, methods=["POST"])])
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendStreamingMessage",
        "params": {"message": {"messageId": "m1", "contextId": "s1", "parts": [{"text": "hi"}]}},
    }
    try:
        with anyio.fail_after(30):
            async with serving(owner_app) as owner_url:
                await store.leases.claim("s1", "owner-replica", 60, url=owner_url)

                async def ignored(session_id: str) -> None:
                    del session_id

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
                async with serving(app) as url, httpx.AsyncClient(timeout=10) as http:
                    async with http.stream("POST", url + "/", content=json.dumps(body)) as answer:
                        first = await anext(answer.aiter_raw())
                    # Hung up: the owner's stream ends within a few seconds.
                    with anyio.move_on_after(5):
                        await hung_up.wait()
                    ended = hung_up.is_set()
    finally:
        store.close()
    assert first.startswith(b"data: ")  # forwarded from the owner
    assert ended
