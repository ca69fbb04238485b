"""The web view's orchestrator, its login, its event stream, and the browser's flags."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from a2a_orchestrator.delegation.network import Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import run_orchestrator_server
from a2a_orchestrator.server.app import RunningServer
from a2a_orchestrator.server.auth.access import Access

TOKEN = "ui-test-token"


@asynccontextmanager
async def orchestrator(
    tmp_path: Path, network: Network | None = None, parent: ScriptedModel | None = None
) -> AsyncIterator[RunningServer]:
    model = parent or ScriptedModel([{"text": "Nothing to do.\nTASK_DONE"}])
    async with run_orchestrator_server(
        store_path=tmp_path / "orchestrator.db",
        workdir=tmp_path,
        network=network or Network.of(),
        models=lambda name: model,
        db=str(tmp_path / "orchestrator-tasks.db"),
        access=Access(token=TOKEN),
    ) as server:
        yield server


async def logged_in(http: httpx.AsyncClient) -> str:
    """Log `http` in through the form; the page's CSRF token."""
    answer = await http.post("/ui/login", data={"token": TOKEN})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui"
    page = await http.get("/ui")
    assert page.status_code == 200
    found = re.search(r'<meta name="csrf-token" content="([0-9a-f]+)">', page.text)
    assert found is not None
    return found.group(1)


async def sse_events(
    http: httpx.AsyncClient, url: str, headers: dict[str, str], count: int
) -> list[tuple[str, str, Any]]:
    """The first `count` events (id, name, data) of the stream at `url`."""
    found: list[tuple[str, str, Any]] = []
    async with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        async for line in response.aiter_lines():
            if line == "":
                if "event" in fields:
                    data = json.loads(fields["data"])
                    found.append((fields.get("id", ""), fields["event"], data))
                    if len(found) == count:
                        return found
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
    return found


BROWSER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
