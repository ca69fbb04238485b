"""The web view (`/ui`): HTTP-level checks against a real orchestrator server,
and a real headless Chromium driving a live session.

Sessions for the HTTP checks are written straight into the orchestrator's
SQLite store, as a CLI run sharing that store would write them: the view
reads the store, whoever wrote it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.routing import BaseRoute, Mount, Route
from support.messages import collect, user_message
from support.servers import a2a_client, role_server
from support.ui import BROWSER_ARGS, TOKEN, logged_in, orchestrator, sse_events

from a2a_orchestrator.cli.commands.common import PIPELINE_PASSES
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.api import OWNER_KEY
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    Done,
    Failed,
    Started,
    ToolCalled,
    event_to_dict,
)
from a2a_orchestrator.runtime.records import RecordKind
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer
from a2a_orchestrator.server.auth.access import Access
from a2a_orchestrator.server.auth.callers import DEFAULT_CALLER, CallerFile, add_caller
from a2a_orchestrator.storage.store import ChildRecord, Store

pytestmark = pytest.mark.anyio

HOSTILE = '<script>window.__xss = 1</script><img src="x" onerror="window.__xss = 2">'
CHROMIUM = Path("/usr/bin/chromium")
# The README's screenshots: `A2A_UI_SCREENSHOTS=docs python -m pytest tests/orchestrator/test_ui.py`
# writes them there; otherwise they go to the test's temporary directory.
SHOTS = os.environ.get("A2A_UI_SCREENSHOTS", "")


async def seed(path: Path, *, owner: str = DEFAULT_CALLER, text: str = HOSTILE) -> tuple[str, str]:
    """A finished session with one child whose answer is `text`."""
    session_id, child_id = uuid.uuid4().hex, uuid.uuid4().hex
    store = Store(path)
    try:
        await store.create_session(session_id, title="seeded", metadata={OWNER_KEY: owner})
        await store.add_child(
            ChildRecord(
                child_id=child_id,
                session_id=session_id,
                role="coder",
                agent="coder",
                status="completed",
                transport="remote",
                trace_id=uuid.uuid4().hex,
                created_at=time.time(),
                result=text,
            )
        )
        for event in (
            Started(role="coder"),
            ToolCalled(call_id="1", tool="read_file", arguments={"path": "<b>x</b>.py"}),
            Done(text=text),
        ):
            await store.append_event(
                session_id, event.kind, event_to_dict(event), child_id=child_id
            )
    finally:
        store.close()
    return session_id, child_id


async def test_login_cookie_opens_the_view_and_the_api_but_not_the_a2a_endpoint(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            first = await http.get("/ui")
            style = await http.get("/ui/static/ui.css")
            form = await http.get("/ui/login")
            refused = await http.post("/ui/login", data={"token": "wrong"})
            api_without = await http.get("/api/sessions")
            login = await http.post("/ui/login", data={"token": TOKEN})
            page = await http.get("/ui")
            api = await http.get("/api/sessions")
            rpc = await http.post(
                "/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
            )
            logout = await http.post("/ui/logout")
            http.cookies.clear()
            http.cookies.set("a2a_ui", "bm90LXRoZS10b2tlbg==")  # a revoked or wrong token
            stale = await http.get("/ui")
    assert first.status_code == 303 and first.headers["location"] == "/ui/login"
    assert form.status_code == 200 and 'name="token"' in form.text
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert refused.status_code == 401 and "not accepted" in refused.text
    assert api_without.status_code == 401
    cookie = login.headers["set-cookie"]
    assert cookie.startswith("a2a_ui=") and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert page.status_code == 200 and "<h1>Sessions</h1>" in page.text
    assert "script-src" not in page.headers["content-security-policy"]  # default-src 'self'
    assert api.status_code == 200 and api.json() == {"sessions": []}
    # The cookie is the browser's way into /ui and /api, never the A2A endpoint.
    assert rpc.status_code == 401
    assert logout.status_code == 303 and "Max-Age=0" in logout.headers["set-cookie"]
    assert stale.status_code == 303 and stale.headers["location"] == "/ui/login"
    assert "Max-Age=0" in stale.headers["set-cookie"]


def _a2a_routes(routes: Sequence[BaseRoute], prefix: str = "") -> list[tuple[str, str]]:
    """(path pattern, method) of every route but the view's, its login and
    the public ones (card, push webhook)."""
    found: list[tuple[str, str]] = []
    for route in routes:
        if isinstance(route, Mount):
            found += _a2a_routes(route.routes, prefix + route.path)
            continue
        assert isinstance(route, Route)
        path = prefix + route.path
        if path.startswith(("/ui", "/api/", "/.well-known/", "/a2a/push/")):
            continue
        found += [(path, method) for method in sorted(route.methods or ()) if method != "HEAD"]
    return found


async def test_the_login_cookie_alone_opens_no_a2a_route(tmp_path: Path) -> None:
    # Issue 26 finding 8: a prefix match on "/ui" and "/api/" let the cookie
    # through to the A2A routes of tenants named ui, api or uix.
    with anyio.fail_after(60):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            csrf = await logged_in(http)
            assert server.app is not None
            routes = _a2a_routes(server.app.routes)
            assert ("/", "POST") in routes and ("/{tenant}/rest/tasks", "GET") in routes
            answers: dict[tuple[str, str], int] = {}
            for pattern, method in routes:
                for tenant in ("ui", "api", "uix"):
                    path = re.sub(r"\{\w+\}", "x", pattern.replace("{tenant}", tenant))
                    answer = await http.request(
                        method,
                        path,
                        json={} if method in ("POST", "PUT") else None,
                        headers={"X-CSRF-Token": csrf, "Origin": server.url},
                    )
                    answers[path, method] = answer.status_code
            sessions = await http.get("/api/sessions")
    assert sessions.status_code == 200  # the cookie itself works
    assert "/ui/rest/tasks" in {path for path, _ in answers}
    assert {key: status for key, status in answers.items() if status != 401} == {}


async def test_without_auth_the_view_is_open_and_there_is_no_login(tmp_path: Path) -> None:
    model = ScriptedModel([{"text": "TASK_DONE"}])
    with anyio.fail_after(30):
        async with (
            run_orchestrator_server(
                store_path=tmp_path / "orchestrator.db",
                workdir=tmp_path,
                network=Network.of(),
                models=lambda name: model,
                db=str(tmp_path / "orchestrator-tasks.db"),
            ) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            session_id, _ = await seed(tmp_path / "orchestrator.db", owner="", text="ok")
            login = await http.get("/ui/login")
            listing = await http.get("/ui")
            stop = await http.post(f"/api/sessions/{session_id}/subagents/stop")
    assert login.status_code == 303 and login.headers["location"] == "/ui"
    assert listing.status_code == 200 and session_id in listing.text
    assert stop.status_code == 200 and stop.json() == {"stopped": 0}


async def test_stop_posts_need_the_csrf_token_and_the_same_origin(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            session_id, child_id = await seed(tmp_path / "orchestrator.db")
            csrf = await logged_in(http)
            stop_all = f"/api/sessions/{session_id}/subagents/stop"
            stop_one = f"/api/sessions/{session_id}/children/{child_id}/stop"
            forged = await http.post(stop_all)
            stale = await http.post(stop_all, headers={"X-CSRF-Token": "0" * 64})
            cross = await http.post(
                stop_all, headers={"X-CSRF-Token": csrf, "Origin": "http://evil.example"}
            )
            good = await http.post(stop_all, headers={"X-CSRF-Token": csrf, "Origin": server.url})
            one = await http.post(stop_one, headers={"X-CSRF-Token": csrf})
            unknown = await http.post(
                f"/api/sessions/{session_id}/children/nope/stop", headers={"X-CSRF-Token": csrf}
            )
            # A client with its own header needs no CSRF token: no ambient credential.
            http.cookies.clear()
            bearer = await http.post(stop_all, headers={"Authorization": f"Bearer {TOKEN}"})
    assert forged.status_code == 403 and "x-csrf-token" in forged.json()["detail"]
    assert stale.status_code == 403
    assert cross.status_code == 403 and "cross-origin" in cross.json()["detail"]
    assert good.status_code == 200 and good.json() == {"stopped": 0}
    # Not held by this server: nothing here runs to stop.
    assert one.status_code == 200 and one.json() == {"child_id": child_id, "stopped": False}
    assert unknown.status_code == 404
    assert bearer.status_code == 200


async def test_child_text_is_rendered_inert_and_sessions_stay_their_callers(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            session_id, child_id = await seed(tmp_path / "orchestrator.db")
            other, _ = await seed(tmp_path / "orchestrator.db", owner="someone-else")
            await logged_in(http)
            listing = await http.get("/ui")
            tree = await http.get(f"/ui/sessions/{session_id}")
            child = await http.get(f"/ui/sessions/{session_id}/children/{child_id}")
            theirs = await http.get(f"/ui/sessions/{other}")
            script = await http.get("/ui/static/ui.js")
    assert session_id in listing.text and other not in listing.text
    for page in (tree, child):
        assert page.status_code == 200
        assert "<script>window" not in page.text and "<img" not in page.text
        assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page.text
    assert "<b>x</b>" not in child.text and "&lt;b&gt;x&lt;/b&gt;.py" in child.text
    assert "calls read_file" in child.text
    assert theirs.status_code == 404 and "coder" not in theirs.text
    assert script.status_code == 200 and "innerHTML" not in script.text


async def test_streams_resume_after_the_last_event_id(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            session_id, child_id = await seed(tmp_path / "orchestrator.db", text="the answer")
            auth = {"Authorization": f"Bearer {TOKEN}"}
            url = f"/ui/sessions/{session_id}/children/{child_id}/stream"
            everything = await sse_events(http, url, auth, 5)
            started_seq = everything[1][0]
            resumed = await sse_events(http, url, {**auth, "Last-Event-ID": started_seq}, 3)
            tree = await sse_events(http, f"/ui/sessions/{session_id}/stream", auth, 2)
    names = [name for _, name, _ in everything]
    assert names == ["child", "line", "line", "line", "child"]
    assert [data["kind"] for _, name, data in everything if name == "line"] == [
        "started",
        "tool_called",
        "done",
    ]
    assert everything[0][2]["result"] == "the answer"
    # A reconnect gets only what came after the last event it saw.
    assert [data["kind"] for _, name, data in resumed if name == "line"] == ["tool_called", "done"]
    # The session's header first (how it ended), then its tree.
    (_, told_name, told), (_, name, rows) = tree
    assert told_name == "told" and told["signal"] == "-"
    assert name == "tree" and [r["child_id"] for r in rows] == [child_id]
    assert rows[0]["status"] == "completed" and rows[0]["last"] == 'done "the answer"'


async def test_a_stream_asked_to_resume_after_no_event_number_is_a_bad_request(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(30):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            session_id, child_id = await seed(tmp_path / "orchestrator.db")
            auth = {"Authorization": f"Bearer {TOKEN}"}
            url = f"/ui/sessions/{session_id}/children/{child_id}/stream"
            # "²" is a digit to str.isdigit; 2**63 and beyond overflow the store's seq.
            bad = ["²", "9" * 5000, "9" * 30, str(2**63), "-1", "1e3"]
            by_query = [(await http.get(url, params={"after": q}, headers=auth)) for q in bad]
            by_header = [
                (await http.get(url, headers={**auth, "Last-Event-ID": q})) for q in bad[1:]
            ]
            # The largest seq still resumes (after everything: only the state).
            good = await sse_events(http, url, {**auth, "Last-Event-ID": str(2**63 - 1)}, 1)
    assert [r.status_code for r in by_query] == [400] * len(bad)
    assert [r.status_code for r in by_header] == [400] * (len(bad) - 1)
    assert "not an event number" in by_query[0].text
    assert [name for _, name, _ in good] == ["child"]


# -- a real browser ----------------------------------------------------------------


def _last_user_text(messages: Sequence[Any]) -> str:
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


def child_script(messages: Sequence[Any]) -> dict[str, Any]:
    """The architect: a quick turn answering with hostile text, or a slow one."""
    if "quick" in _last_user_text(messages):
        return {"delay": 2, "text": f"Designed. {HOSTILE}"}
    return {"delay": 120, "text": "too late"}


def parent_script(messages: Sequence[Any]) -> dict[str, Any]:
    if not any(m["role"] == "assistant" for m in messages):
        agents = [
            {"role": "architect", "prompt": "quick: design slugify"},
            {"role": "architect", "prompt": "slow: design everything"},
        ]
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": agents}}]}
    answers = sum(1 for m in messages if m["role"] == "user" and "FINAL_ANSWER" in m["content"])
    if answers >= 2:
        return {"text": "Both children answered.\nTASK_DONE"}
    return {"tool_calls": [{"name": "agent_manage", "arguments": {}}]}


@pytest.mark.timeout(180)
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's `chromium` package (/usr/bin/chromium): apt-get install chromium",
)
async def test_a_browser_follows_a_live_session_and_stops_a_child(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright, expect

    with anyio.fail_after(150):
        async with AsyncExitStack() as stack:
            architect = await stack.enter_async_context(
                role_server(tmp_path, child_script, role="architect", db=tmp_path / "arch.db")
            )
            network = Network.of(AgentSpec(name="architect", role="architect", url=architect.url))
            server = await stack.enter_async_context(
                orchestrator(tmp_path, network, ScriptedModel(parent_script))
            )
            playwright = await stack.enter_async_context(async_playwright())
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=BROWSER_ARGS
            )
            stack.push_async_callback(browser.close)
            page = await browser.new_page(viewport={"width": 1200, "height": 640})
            expect.set_options(timeout=30_000)

            # Log in through the form; the empty sessions list opens live.
            await page.goto(f"{server.url}/ui")
            assert page.url.endswith("/ui/login")
            await page.fill('input[name="token"]', TOKEN)
            await page.click('button[type="submit"]')
            await expect(page.locator("#no-sessions")).to_be_visible()
            await expect(page.locator("#live")).to_have_text("live")
            await page.evaluate("window.__loaded = true")

            # A task arrives over A2A; its session shows up without a reload.
            outcome: list[Any] = []

            async def run_task() -> None:
                async with a2a_client(server.url, token=TOKEN) as client:
                    request = user_message("Design slugify and everything")
                    request.message.metadata.update({MODE_KEY: "delegate"})
                    outcome.append(await collect(client, request))

            tg = await stack.enter_async_context(anyio.create_task_group())
            tg.start_soon(run_task)
            row = page.locator("#sessions tbody tr")
            await expect(row).to_have_count(1)
            await expect(row.first).to_contain_text("running")
            assert await page.evaluate("window.__loaded") is True
            session_id = await row.first.get_attribute("data-session-id")
            assert session_id

            # The session's tree: the parent agent at its root, both children
            # run; the quick one finishes on the page while it stays open.
            await row.first.locator("a").click()
            children = page.locator("#tree tbody tr")
            await expect(children).to_have_count(3)
            await page.evaluate("window.__loaded = true")
            await expect(children.nth(0)).to_contain_text("parent agent")
            quick, slow = children.nth(1), children.nth(2)
            await expect(quick.locator(".status")).to_have_text("completed")
            await expect(slow.locator(".status")).to_have_text("running")
            # The hostile answer is text on the page, and nothing ran.
            await expect(quick.locator(".last")).to_contain_text("<script>window.__xss")
            assert await page.evaluate("window.__loaded === true && window.__xss === undefined")

            # Stop the slow child from its row.
            slow_id = await slow.get_attribute("data-child-id")
            await slow.locator("button.stop").click()
            await expect(slow.locator(".status")).to_have_text("failed (aborted)")
            await expect(page.locator("#notice")).to_have_text("stopped")
            assert await page.evaluate("window.__loaded === true")

            # The child's page: its log and its result, written as text.
            await quick.locator("a").click()
            await expect(page.locator("#status")).to_have_text("completed")
            await expect(page.locator("#result")).to_contain_text(HOSTILE)
            await expect(page.locator("#log tbody tr").last).to_contain_text("done")
            assert await page.evaluate("window.__xss === undefined")
            await browser.close()

            # The parent got both answers; the stop is in the store.
            with anyio.fail_after(30):
                while not outcome:
                    await anyio.sleep(0.1)
    _, events = outcome[0]
    assert isinstance(events[-1], Done) and events[-1].text.endswith("TASK_DONE")
    store = Store(tmp_path / "orchestrator.db")
    try:
        stopped = await store.get_child(slow_id or "")
        controls = await store.events(session_id, child_id=slow_id, kinds=["control"])
    finally:
        store.close()
    assert stopped is not None and (stopped.status, stopped.reason) == ("failed", "aborted")
    assert [e.payload for e in controls] == [{"action": "terminate"}]


# -- the story of a real run -------------------------------------------------------

PROMPTS = {name: find_role(name).prompt.strip()[:60] for name in PIPELINE_PASSES}
STORY_TASK = "Add a slugify(title) helper to utils.py, with tests"
PARENT_ANSWER = "The coder added slugify() and its tests; they pass."


def story_script(messages: Sequence[Any]) -> dict[str, Any]:
    """Every conversation of the story runs: a parent agent that spawns a coder
    (and asks for an agent nobody offers, which the policy refuses), and the
    pipeline's three passes, the architect's slow enough to watch."""
    system = str(messages[0].get("content", ""))
    call = {"input_tokens": 1200, "output_tokens": 150}
    if "Agents you can delegate to" in system:
        if not any(m["role"] == "assistant" for m in messages):
            agents = [
                {"role": "coder", "prompt": "Implement slugify in utils.py with tests"},
                {"role": "designer", "prompt": "Draw a logo"},
            ]
            spawn = {"name": "agent", "arguments": {"agents": agents}}
            return {"tool_calls": [spawn], "usage": call}
        if any(m["role"] == "user" and "FINAL_ANSWER" in str(m["content"]) for m in messages):
            return {"text": f"{PARENT_ANSWER}\nTASK_DONE", "usage": call}
        return {"tool_calls": [{"name": "agent_manage", "arguments": {}}], "usage": call}
    if PROMPTS["architect"] in system:
        return {"delay": 2, "text": "## Approach\nA regex slug; tests for spaces.", "usage": call}
    if PROMPTS["reviewer"] in system:
        return {"text": "Reviewed: correct and tested.\nTASK_DONE", "usage": call}
    return {"delay": 1, "text": "Implemented slugify; 3 tests pass.\nTASK_DONE", "usage": call}


async def run_story(server: RunningServer, mode: str) -> list[Any]:
    async with a2a_client(server.url, token=TOKEN) as client:
        request = user_message(STORY_TASK if mode == "delegate" else f"Pipeline: {STORY_TASK}")
        request.message.metadata.update({MODE_KEY: mode})
        _, events = await collect(client, request)
    return events


async def open_session(page: Any, title: str) -> None:
    await page.locator("#sessions tbody tr", has_text=title).locator("a").first.click()


@pytest.mark.timeout(180)
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
async def test_a_browser_reads_the_title_outcome_and_tree_of_real_runs(tmp_path: Path) -> None:
    from playwright.async_api import async_playwright, expect

    with anyio.fail_after(150):
        async with AsyncExitStack() as stack:
            server = await stack.enter_async_context(
                orchestrator(tmp_path, parent=ScriptedModel(story_script))
            )
            playwright = await stack.enter_async_context(async_playwright())
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=BROWSER_ARGS
            )
            stack.push_async_callback(browser.close)
            page = await browser.new_page(viewport={"width": 1280, "height": 720})
            expect.set_options(timeout=30_000)
            await page.goto(f"{server.url}/ui/login")
            await page.fill('input[name="token"]', TOKEN)
            await page.click('button[type="submit"]')
            shots = Path(SHOTS) if SHOTS else tmp_path

            # A pipeline, watched while it runs: its root and the passes to come.
            tg = await stack.enter_async_context(anyio.create_task_group())
            pipeline_events: list[Any] = []

            async def pipeline() -> None:
                pipeline_events.extend(await run_story(server, "pipeline"))

            tg.start_soon(pipeline)
            await expect(page.locator("#sessions tbody tr")).to_have_count(1)
            await open_session(page, "Pipeline:")
            rows = page.locator("#tree tbody tr")
            await expect(page.locator("#task")).to_have_text(f"Pipeline: {STORY_TASK}")
            await expect(rows.nth(0)).to_contain_text("pipeline")
            await expect(page.locator('#tree tr[data-state="pending"]')).to_have_count(2)
            await expect(page.locator("#signal")).to_have_text("TASK_DONE")
            await expect(rows).to_have_count(4)
            for row, name in zip(range(1, 4), PIPELINE_PASSES, strict=True):
                await expect(rows.nth(row)).to_contain_text(name)
                await expect(rows.nth(row).locator(".status")).to_have_text("completed")
            await expect(page.locator("#ending")).to_contain_text("Reviewed: correct and tested.")
            await page.screenshot(path=str(shots / "ui-pipeline.png"), full_page=True)

            # A parent agent's run: the agent at the root with its own tokens,
            # its child, and the spawn refused with its reason.
            parent_events = await run_story(server, "delegate")
            await page.goto(f"{server.url}/ui")
            await expect(page.locator("#sessions tbody tr")).to_have_count(2)
            await expect(page.locator("#sessions tbody tr").first).to_contain_text(STORY_TASK)
            await expect(page.locator("#sessions tbody tr").first).to_contain_text("TASK_DONE")
            await page.screenshot(path=str(shots / "ui-sessions.png"))
            await open_session(page, STORY_TASK)
            await expect(page.locator("#task")).to_have_text(STORY_TASK)
            await expect(page.locator("#signal")).to_have_text("TASK_DONE")
            await expect(page.locator("#ending")).to_contain_text(PARENT_ANSWER)
            root, child, refused = rows.nth(0), rows.nth(1), rows.nth(2)
            await expect(rows).to_have_count(3)
            await expect(root).to_contain_text("parent agent")
            # Its own three calls (spawn, wait, answer).
            await expect(root).to_contain_text("3600 / 450")
            await expect(child).to_contain_text("coder")
            await expect(child.locator(".status")).to_have_text("completed")
            await expect(refused.locator(".status")).to_have_text("refused")
            await expect(refused.locator(".last")).to_contain_text("designer")
            await page.screenshot(path=str(shots / "ui-session.png"), full_page=True)

            # The root's own page: the parent's events.
            await root.locator("a").click()
            await expect(page.locator("#log tbody tr").first).to_contain_text("input")
            await expect(page.locator("#log")).to_contain_text("calls agent")
    assert isinstance(pipeline_events[-1], Done) and isinstance(parent_events[-1], Done)


@pytest.mark.timeout(120)
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs /usr/bin/chromium")
async def test_a_person_reading_the_page_finds_what_was_asked_how_it_ended_and_who_did_it(
    tmp_path: Path,
) -> None:
    from playwright.async_api import async_playwright

    with anyio.fail_after(100):
        async with AsyncExitStack() as stack:
            server = await stack.enter_async_context(
                orchestrator(tmp_path, parent=ScriptedModel(story_script))
            )
            await run_story(server, "delegate")
            playwright = await stack.enter_async_context(async_playwright())
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=BROWSER_ARGS
            )
            stack.push_async_callback(browser.close)
            page = await browser.new_page()
            await page.goto(f"{server.url}/ui/login")
            await page.fill('input[name="token"]', TOKEN)
            await page.click('button[type="submit"]')
            listing = await page.inner_text("main")
            await open_session(page, STORY_TASK)
            await page.wait_for_selector("#tree tbody tr")
            text = await page.inner_text("main")
    # The list says what was asked and how it ended.
    assert STORY_TASK in listing and "TASK_DONE" in listing
    # The page, as read top to bottom: the task, how it ended and the answer,
    # then who did the work (each found after the one before).
    at = 0
    for phrase in (STORY_TASK, "TASK_DONE", PARENT_ANSWER, "parent agent", "coder", "refused"):
        assert phrase in text[at:], f"{phrase!r} not after position {at} of:\n{text}"
        at = text.index(phrase, at) + len(phrase)
    assert "unknown" in text.lower() or "designer" in text  # the refusal's reason


async def test_an_operator_sees_the_sessions_run_from_the_command_line(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "Checked.\nTASK_DONE"}]))
    store_path = tmp_path / "orchestrator.db"
    ran = subprocess.run(
        [
            *(sys.executable, "-m", "a2a_orchestrator.cli", "run", "Check the CLI session"),
            *("--parent", "--store", str(store_path)),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "A2A_MODEL_SCRIPT": str(script)},
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    callers = tmp_path / "callers.toml"
    ops_token = add_caller(callers, "ops")
    team_token = add_caller(callers, "team")
    # The operator's marking, as the README says to write it.
    marked = callers.read_text().replace("[callers.ops]\n", "[callers.ops]\noperator = true\n")
    callers.write_text(marked)
    seen: dict[str, tuple[int, bool]] = {}
    with anyio.fail_after(30):
        async with (
            run_orchestrator_server(
                store_path=store_path,
                workdir=tmp_path,
                network=Network.of(),
                models=lambda name: ScriptedModel([]),
                db=str(tmp_path / "orchestrator-tasks.db"),
                access=Access(token=TOKEN, callers=CallerFile(callers)),
            ) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            for who, token in {"server token": TOKEN, "ops": ops_token, "team": team_token}.items():
                auth = {"Authorization": f"Bearer {token}"}
                api = (await http.get("/api/sessions", headers=auth)).json()["sessions"]
                page = await http.get("/ui", headers=auth)
                seen[who] = (len(api), "Check the CLI session" in page.text)
            (session,) = api_sessions = (
                await http.get("/api/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
            ).json()["sessions"]
            tree = await http.get(
                f"/ui/sessions/{session['id']}", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            theirs = await http.get(
                f"/ui/sessions/{session['id']}", headers={"Authorization": f"Bearer {team_token}"}
            )
            # Seeing is all the marking gives: over A2A the operator cannot
            # add a turn to the session (it belongs to no caller).
            async with a2a_client(server.url, token=ops_token) as client:
                _, sent = await collect(
                    client, user_message("Take it over", context_id=session["id"])
                )
    store = Store(store_path)
    try:
        inputs = await store.events(session["id"], kinds=[RecordKind.INPUT])
    finally:
        store.close()
    assert isinstance(sent[-1], Failed) and "cannot be used by this caller" in sent[-1].message
    assert [e.payload["text"] for e in inputs] == ["Check the CLI session"]
    # The server's own token and a caller marked operator see it; another caller does not.
    assert seen == {"server token": (1, True), "ops": (1, True), "team": (0, False)}
    assert api_sessions[0]["title"] == "Check the CLI session"
    assert tree.status_code == 200 and "TASK_DONE" in tree.text
    assert theirs.status_code == 404


def slow_child_script(messages: Sequence[Any]) -> dict[str, Any]:
    """A parent that spawns a coder and waits; the coder's first call is
    quick (a tool call), its second slow: its turn runs with one call spent."""
    system = str(messages[0].get("content", ""))
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if "Agents you can delegate to" in system:
        if steps == 0:
            agents = [{"role": "coder", "prompt": "implement slugify"}]
            return {"tool_calls": [{"name": "agent", "arguments": {"agents": agents}}]}
        return {"tool_calls": [{"name": "agent_manage", "arguments": {}}]}
    if steps == 0:
        call = {"name": "read_file", "arguments": {"path": "README.md"}}
        return {"tool_calls": [call], "usage": {"input_tokens": 700, "output_tokens": 70}}
    return {"delay": 60, "text": "too late"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["local", "remote"])
async def test_a_running_childs_tokens_move_before_its_turn_ends(
    tmp_path: Path, transport: str
) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with anyio.fail_after(45):
        async with AsyncExitStack() as stack:
            network = None
            if transport == "remote":
                coder = await stack.enter_async_context(
                    role_server(tmp_path, slow_child_script, db=tmp_path / "coder.db")
                )
                network = Network.of(AgentSpec(name="coder", role="coder", url=coder.url))
            parent = ScriptedModel(slow_child_script)
            server = await stack.enter_async_context(orchestrator(tmp_path, network, parent))
            http = await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.url, timeout=10)
            )
            tg = await stack.enter_async_context(anyio.create_task_group())

            async def run() -> None:
                async with a2a_client(server.url, token=TOKEN) as client:
                    request = user_message("Implement slugify")
                    request.message.metadata.update({MODE_KEY: "delegate"})
                    await collect(client, request)

            tg.start_soon(run)
            sessions: list[Any] = []
            while not sessions:
                await anyio.sleep(0.1)
                sessions = (await http.get("/api/sessions", headers=auth)).json()["sessions"]
            session_id = sessions[0]["id"]
            seen: list[dict[str, Any]] = []
            async with http.stream(
                "GET", f"/ui/sessions/{session_id}/stream", headers=auth
            ) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data: ["):
                        continue
                    rows = json.loads(line.removeprefix("data: "))
                    seen = [r for r in rows if r["role"] == "coder" and r["state"] == "running"]
                    if seen and seen[0]["input_tokens"]:
                        break
            stopped = await http.post(f"/api/sessions/{session_id}/subagents/stop", headers=auth)
    # The coder is still in its turn, and its first call's tokens show.
    assert (seen[0]["input_tokens"], seen[0]["output_tokens"]) == (700, 70)
    assert stopped.status_code == 200


async def test_the_root_page_shows_every_root_event_among_many_of_its_childrens(
    tmp_path: Path,
) -> None:
    """The parent agent's page reads its events (those of no child) among
    its children's, past more than a page of theirs between two of its own;
    its stream goes on from where the page read to."""
    session_id, child_id = await seed(tmp_path / "orchestrator.db", text="ok")
    store = Store(tmp_path / "orchestrator.db")
    try:
        entries: list[Any] = [(session_id, None, RecordKind.INPUT, {"text": "go"}, None)]
        chatter = event_to_dict(AssistantMessage(text="child chatter"))
        for marker in ("first-note", "second-note"):
            entries += [(session_id, child_id, "message", chatter, None)] * 700
            note = event_to_dict(AssistantMessage(text=marker))
            entries.append((session_id, None, "message", note, None))
        done = event_to_dict(Done(text="All done.\nTASK_DONE"))
        entries += [(session_id, child_id, "message", chatter, None)] * 700
        entries.append((session_id, None, "done", done, None))
        stored = await store.append_events(entries)
    finally:
        store.close()
    last_seq = max(e.seq for e in stored if e is not None)
    with anyio.fail_after(30):
        async with (
            orchestrator(tmp_path) as server,
            httpx.AsyncClient(base_url=server.url, timeout=10) as http,
        ):
            await logged_in(http)
            root = await http.get(f"/ui/sessions/{session_id}/children/root")
    assert root.status_code == 200
    for text in ("first-note", "second-note", "All done."):
        assert text in root.text, text
    assert "child chatter" not in root.text
    # The stream starts after everything the page read, the children's too.
    assert f'data-after="{last_seq}"' in root.text
