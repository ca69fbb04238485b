"""An agent's question (`ask_parent`) in `run`: answered on a terminal, told
nobody can answer in a pipe; the run goes on to TASK_DONE either way.

Over A2A (`serve orchestrator`, a stock a2a-sdk client) the task goes
INPUT_REQUIRED with the question and the caller's next message answers it;
in the web view a box answers it.

Real subprocesses of the CLI; the only fake is the model (each role of the
pipeline replays its own script, from role files in the work directory)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.helpers import get_message_text
from a2a.types import CancelTaskRequest, SubscribeToTaskRequest, TaskState
from support.messages import collect, user_message
from support.servers import a2a_client, serve_process
from support.ui import BROWSER_ARGS, sse_events

from a2a_orchestrator.control.pipeline import Brief, Pipeline, TaskSpec
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.questions import NO_ANSWER, Questions
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import MODE_KEY
from a2a_orchestrator.protocol.decoding import StreamDecoder
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.runtime.records import RecordKind
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]

OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
    "A2A_MODEL_SCRIPT": "",
}

QUESTION = "Should the greeting be in English or in French?"
DESIGN = (
    "## Approach\nA hello module, as the requester answered.\n\n## Components\n- hello.py\n\n"
    "## Design decisions\n- the language the requester chose\n\n## Risks\n- none"
)

DESIGN_TURN = {"text": DESIGN}
SCRIPTS = {
    "architect": [
        {"tool_calls": [{"name": "ask_parent", "arguments": {"question": QUESTION}}]},
        DESIGN_TURN,
    ],
    "coder": [{"text": "Implemented the design.\nTASK_DONE"}],
    "reviewer": [{"text": "It matches the design.\nTASK_DONE"}],
}
TOOLS = {"architect": "[list_files, ask_parent]", "coder": "[list_files]", "reviewer": "[grep]"}


def project(root: Path, *, delay: float = 0) -> Path:
    """A work directory whose roles replay their scripts (the architect asks
    first, after `delay` seconds)."""
    roles = root / "roles"
    roles.mkdir(parents=True)
    scripts = {**SCRIPTS, "architect": [{**SCRIPTS["architect"][0], "delay": delay}, DESIGN_TURN]}
    for role, turns in scripts.items():
        script = root / f"{role}.json"
        script.write_text(json.dumps(turns))
        (roles / f"{role}.md").write_text(
            f"---\nname: {role}\ndescription: the {role} of this test\n"
            f"model: scripted:{script}\ntools: {TOOLS[role]}\nmax_turns: 4\ntimeout: 60\n---\n"
            f"You are the {role}.\n"
        )
    return root


async def session_tokens(root: Path, session: str) -> int:
    """The session's tokens as every view sums them (`Store.session_usage`)."""
    store = Store(root / ".a2a" / "orchestrator.db")
    try:
        return (await store.session_usage(session)).tokens
    finally:
        store.close()


def architect_inputs(root: Path, session: str) -> list[str]:
    """The architect's inputs as the store has them: its task, then the answer."""
    events = subprocess.run(
        [*CLI, "events", session, "--jsonl"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        env={**os.environ, **OFFLINE},
    )
    assert events.returncode == 0, events.stderr
    rows = [json.loads(line) for line in events.stdout.splitlines()]
    architect = next(r["child_id"] for r in rows if r.get("kind") == "started" and r["child_id"])
    return [
        r["payload"]["text"] for r in rows if r["child_id"] == architect and r["kind"] == "input"
    ]


@pytest.mark.anyio
async def test_the_first_answer_counts_and_a_canceled_ask_withdraws_its_question() -> None:
    questions = Questions()
    answers: list[str] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def ask(text: str, child_id: str) -> None:
                answers.append(await questions.ask(text, child_id=child_id, agent="a", role="r"))

            tg.start_soon(ask, "first?", "child-1")
            theirs = await questions.wait_pending(lambda q: q.child_id == "child-1")
            tg.start_soon(ask, "second?", "child-2")
            other = await questions.wait_pending(lambda q: q.child_id == "child-2")
            assert [q.text for q in questions.pending()] == ["first?", "second?"]
            assert theirs.describe() == "a (r, child-) asks: first?"
            assert questions.answer(theirs.id, "yes") is True
            assert questions.answer(theirs.id, "no") is False  # answered already
            while not answers:
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()  # the second ask is withdrawn
    assert answers == ["yes"]
    assert questions.pending() == [] and questions.answer(other.id, "late") is False


def _by_role(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The turn of the role whose prompt the conversation has (in-process passes)."""
    role = next(r for r in SCRIPTS if f"You are the {r}" in messages[0]["content"])
    return SCRIPTS[role][sum(1 for m in messages if m["role"] == "assistant")]


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["remote", "local"])
async def test_a_pipeline_pass_asks_and_the_answer_goes_back_on_either_transport(
    tmp_path: Path, transport: str
) -> None:
    """The same question, answered through `session.questions`, whether the
    architect is a role server or an in-process child."""
    workdir = tmp_path / "project"
    workdir.mkdir()
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            specs = []
            for name in SCRIPTS:
                url = ""
                if transport == "remote":
                    server = await stack.enter_async_context(
                        run_role_server(
                            find_role(name),
                            ScriptedModel(SCRIPTS[name]),
                            workdir,
                            db=str(tmp_path / f"{name}.db"),
                        )
                    )
                    url = server.url
                specs.append(AgentSpec(name=name, role=name, url=url or None))
            store = Store(tmp_path / "orchestrator.db")
            stack.callback(store.close)
            session = await stack.enter_async_context(
                Session(
                    store,
                    workdir=workdir,
                    network=Network.of(*specs),
                    models=lambda _name: ScriptedModel(_by_role),
                )
            )
            brief = Brief(task=TaskSpec(id="T1", title="hello", description="Add a hello module"))
            asked = []

            async def answer() -> None:
                question = await session.questions.wait_pending()
                asked.append(question)
                session.questions.answer(question.id, "French, please")

            async with anyio.create_task_group() as tg:
                tg.start_soon(answer)
                result = await Pipeline(session, brief).run()
            inputs = await store.events(session.id, child_id=asked[0].child_id, kinds=["input"])
    assert result.signal == "TASK_DONE" and result.architect_output == DESIGN
    assert (asked[0].text, asked[0].agent, asked[0].role) == (QUESTION, "architect", "architect")
    assert inputs[-1].kind == RecordKind.INPUT and inputs[-1].payload["text"] == "French, please"


def test_a_question_in_a_pipe_is_told_nobody_answers_and_the_run_goes_on(tmp_path: Path) -> None:
    root = project(tmp_path)
    run = subprocess.run(
        [*CLI, "run", "Add a hello module"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        env={**os.environ, **OFFLINE},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "signal: TASK_DONE" in run.stdout
    assert "architect (architect, " in run.stdout and f"asks: {QUESTION}" in run.stdout
    session = re.search(r"session ([0-9a-f]{32})", run.stdout).group(1)  # type: ignore[union-attr]
    inputs = architect_inputs(root, session)
    # Its second input is the `ask_parent` call's result: nobody could answer.
    assert len(inputs) == 2 and inputs[1] == NO_ANSWER
    design = root / ".a2a" / "tasks"
    assert DESIGN in next(design.glob("*/architect.txt")).read_text()


def test_no_input_answers_for_nobody_even_on_a_terminal(tmp_path: Path) -> None:
    root = project(tmp_path)
    output, code = on_terminal(root, ["run", "Add a hello module", "--no-input"], answer=None)
    assert code == 0, output
    assert f"asks: {QUESTION}" in output and "signal: TASK_DONE" in output
    session = re.search(r"session ([0-9a-f]{32})", output).group(1)  # type: ignore[union-attr]
    assert architect_inputs(root, session)[1:] == [NO_ANSWER]


def test_a_question_on_a_terminal_is_answered_by_the_person(tmp_path: Path) -> None:
    root = project(tmp_path)
    output, code = on_terminal(root, ["run", "Add a hello module"], answer="French, please")
    assert code == 0, output
    assert f"asks: {QUESTION}" in output and "signal: TASK_DONE" in output
    session = re.search(r"session ([0-9a-f]{32})", output).group(1)  # type: ignore[union-attr]
    # The answer went back as the call's result: the architect's next turn read it.
    assert architect_inputs(root, session)[1:] == ["French, please"]


def test_end_of_input_at_the_prompt_is_no_answer(tmp_path: Path) -> None:
    # Ctrl-D at the start of the line: the read sees the end of input.
    root = project(tmp_path)
    output, code = on_terminal(root, ["run", "Add a hello module"], answer="\x04")
    assert code == 0, output
    assert "(no answer: the agent goes on with its own assumption)" in output
    assert "signal: TASK_DONE" in output
    session = re.search(r"session ([0-9a-f]{32})", output).group(1)  # type: ignore[union-attr]
    assert architect_inputs(root, session)[1:] == [NO_ANSWER]


def on_terminal(root: Path, args: list[str], *, answer: str | None) -> tuple[str, int]:
    """Run the CLI on a pseudo-terminal; type `answer` when it asks. Its
    whole output (escape sequences stripped) and exit code."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [*CLI, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=root,
        env={**os.environ, **OFFLINE, "TERM": "xterm", "COLUMNS": "160", "LINES": "40"},
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    typed = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal (EIO)
                    break
                if not data:
                    break
                chunks.append(data)
            seen = b"".join(chunks)
            if answer is not None and not typed and b"answer (one line" in seen:
                os.write(master, answer.encode() + b"\n")
                typed = True
            if process.poll() is not None and not ready:
                break
        process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")
    assert answer is None or typed, f"it never asked:\n{text}"
    return text, process.returncode


def test_a_parent_agents_own_question_in_a_pipe_goes_on(tmp_path: Path) -> None:
    """`run --parent`: the parent is the root, so its question is the person's."""
    root = project(tmp_path)
    script = root / "asker.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "ask_parent", "arguments": {"question": QUESTION}}]},
                {"text": "Went on with English.\nTASK_DONE"},
            ]
        )
    )
    (root / "roles" / "asker.md").write_text(
        # The parent plays `default` (A2A_MODEL_SCRIPT offline), not its role's model.
        "---\nname: asker\ndescription: a parent that asks\nmodel: default\n"
        "tools: [agent, ask_parent]\nmax_turns: 4\ntimeout: 60\n---\nYou delegate.\n"
    )
    run = subprocess.run(
        [*CLI, "run", "Add a hello module", "--parent", "--role", "asker"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        env={**os.environ, **OFFLINE, "A2A_MODEL_SCRIPT": str(script)},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"asker asks: {QUESTION}" in run.stdout and "Went on with English." in run.stdout
    session = re.search(r"session ([0-9a-f]{32})", run.stdout).group(1)  # type: ignore[union-attr]
    events = subprocess.run(
        [*CLI, "events", session, "--jsonl"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        env={**os.environ, **OFFLINE},
    )
    rows = [json.loads(line) for line in events.stdout.splitlines()]
    inputs = [r["payload"]["text"] for r in rows if not r["child_id"] and r["kind"] == "input"]
    assert inputs == ["Add a hello module", NO_ANSWER]


TOKEN = "questions-test-token"


def _asked(responses: list) -> tuple[str, str, dict]:  # type: ignore[type-arg]
    """The task and context of a stream that ended INPUT_REQUIRED, and its question's data."""
    last = responses[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, last
    message = last.status.message
    assert get_message_text(message).endswith(f"asks: {QUESTION}")
    data = {k: v.string_value for k, v in message.parts[1].data.struct_value.fields.items()}
    return last.task_id, last.context_id, data


@pytest.mark.anyio
async def test_over_a2a_a_question_is_input_required_and_the_next_message_answers(
    tmp_path: Path,
) -> None:
    root = project(tmp_path)
    env = {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN}
    with anyio.fail_after(90):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                first, _ = await collect(client, user_message("Add a hello module"))
                task_id, context_id, data = _asked(first)
                answer = user_message("French, please", task_id=task_id, context_id=context_id)
                second, events = await collect(client, answer)
    assert data["question"] == QUESTION and data["agent"] == "architect"
    assert data["role"] == "architect" and data["childId"]
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    done = events[-1]
    assert isinstance(done, Done) and done.text.startswith("TASK_DONE")
    # The answer was the architect's `ask_parent` result, in its own conversation.
    assert architect_inputs(root, context_id)[1:] == ["French, please"]
    # The task's ending reports every call of the run, those before the
    # question too (its INPUT_REQUIRED reported none), each once.
    assert done.spent.tokens == await session_tokens(root, context_id) > 0


@pytest.mark.anyio
async def test_the_web_view_shows_a_question_and_its_box_answers_it(tmp_path: Path) -> None:
    root = project(tmp_path)
    env = {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN}
    with anyio.fail_after(90):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                first, _ = await collect(client, user_message("Add a hello module"))
            task_id, context_id, data = _asked(first)
            async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                login = await http.post("/ui/login", data={"token": TOKEN})
                assert login.status_code == 303
                page = await http.get(f"/ui/sessions/{context_id}")
                csrf = re.search(r'<meta name="csrf-token" content="([0-9a-f]+)">', page.text)
                box = re.search(r'<form class="question" [^>]*data-answer="([^"]+)"', page.text)
                assert csrf is not None and box is not None, page.text
                target = box.group(1)
                forged = await http.post(target, json={"answer": "German"})
                empty = await http.post(
                    target, json={"answer": "  "}, headers={"X-CSRF-Token": csrf.group(1)}
                )
                answered = await http.post(
                    target,
                    json={"answer": "French, please"},
                    headers={"X-CSRF-Token": csrf.group(1)},
                )
                again = await http.post(
                    target, json={"answer": "English"}, headers={"X-CSRF-Token": csrf.group(1)}
                )
                # The run goes on without the A2A caller: it ends, and its
                # task's next message finds it ended.
                async with a2a_client(url, token=TOKEN) as client:
                    follow = user_message("thanks", task_id=task_id, context_id=context_id)
                    second, events = await collect(client, follow)
                after = await http.get(f"/ui/sessions/{context_id}")
    assert f'asks: <span class="text">{QUESTION}</span>' in page.text
    assert "architect (architect, " in page.text
    assert target.endswith(f"/questions/{data['questionId']}")
    assert forged.status_code == 403 and empty.status_code == 400
    assert answered.status_code == 200 and answered.json() == {"answered": True}
    assert again.status_code == 409
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert isinstance(events[-1], Done) and events[-1].text.startswith("TASK_DONE")
    assert 'class="question"' not in after.text
    assert architect_inputs(root, context_id)[1:] == ["French, please"]


@pytest.mark.anyio
async def test_canceling_a_task_that_asked_stops_its_run(tmp_path: Path) -> None:
    root = project(tmp_path)
    env = {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN}
    with anyio.fail_after(90):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                first, _ = await collect(client, user_message("Add a hello module"))
                task_id, context_id, _data = _asked(first)
                canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    headers = {"Authorization": f"Bearer {TOKEN}"}
                    # The architect stops as its run is canceled (not at once).
                    for _ in range(100):
                        listed = await http.get(
                            f"/api/sessions/{context_id}/children", headers=headers
                        )
                        states = {c["role"]: c["status"] for c in listed.json()["children"]}
                        if states.get("architect") != "input_required":
                            break
                        await anyio.sleep(0.1)
                    page = await http.get(f"/ui/sessions/{context_id}", headers=headers)
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    # Only the architect had started, and it is stopped; no later pass ran.
    assert states == {"architect": "failed"}
    assert 'class="question"' not in page.text


def test_resume_asks_again_a_question_left_unanswered(tmp_path: Path) -> None:
    """`run` interrupted at the question; `resume` in a pipe asks it again,
    is told nobody can answer, and the pipeline ends TASK_DONE."""
    root = project(tmp_path)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [*CLI, "run", "Add a hello module"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=root,
        env={**os.environ, **OFFLINE, "TERM": "xterm", "COLUMNS": "160"},
        close_fds=True,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"answer (one line" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                seen += os.read(master, 65536)
        assert b"answer (one line" in seen, seen.decode(errors="replace")
        process.send_signal(signal.SIGINT)  # Ctrl-C while it waits for the person
        while process.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 65536)
                except OSError:  # the child closed the terminal (EIO)
                    break
        assert process.wait(timeout=30) == 130, seen.decode(errors="replace")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    session = re.search(rb"session ([0-9a-f]{32})", seen).group(1).decode()  # type: ignore[union-attr]
    resumed = subprocess.run(
        [*CLI, "resume", session],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        env={**os.environ, **OFFLINE},
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"asks: {QUESTION}" in resumed.stdout and "signal: TASK_DONE" in resumed.stdout
    assert architect_inputs(root, session)[1:] == [NO_ANSWER]


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.anyio
@pytest.mark.timeout(180)
@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's `chromium` package (/usr/bin/chromium): apt-get install chromium",
)
async def test_a_browser_answers_a_question_that_arrives_while_the_page_is_open(
    tmp_path: Path,
) -> None:
    from playwright.async_api import async_playwright, expect

    # The architect asks after ten seconds: the page is open by then (its
    # HTML has no box), so the box comes over the page's stream, built by
    # its script.
    root = project(tmp_path, delay=10)
    env = {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN}
    responses: list = []  # type: ignore[type-arg]
    with anyio.fail_after(150):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client, anyio.create_task_group() as tg:

                async def send() -> None:
                    async for response in client.send_message(user_message("Add a hello module")):
                        responses.append(response)

                tg.start_soon(send)
                while not responses:
                    await anyio.sleep(0.05)
                first = responses[0]
                context_id = first.task.context_id if first.HasField("task") else ""
                context_id = context_id or first.status_update.context_id
                async with async_playwright() as playwright:
                    browser = await playwright.chromium.launch(
                        executable_path=str(CHROMIUM), args=BROWSER_ARGS
                    )
                    page = await browser.new_page()
                    expect.set_options(timeout=30_000)
                    await page.goto(f"{url}/ui/sessions/{context_id}")
                    await page.fill('input[name="token"]', TOKEN)
                    await page.click('button[type="submit"]')
                    opened = await page.goto(f"{url}/ui/sessions/{context_id}")
                    assert opened is not None and 'class="question"' not in await opened.text()
                    await expect(page.locator("#live")).to_have_text("live")
                    box = page.locator("form.question")
                    await expect(box).to_have_count(1)
                    await expect(box.locator(".text")).to_have_text(QUESTION)
                    await expect(box.locator(".who")).to_contain_text("architect (architect, ")
                    await box.locator("textarea").fill("French, please")
                    await box.locator("button").click()
                    await expect(page.locator("#notice")).to_have_text("answered")
                    await expect(box).to_have_count(0)
                    # The pipeline's own row first, then its three passes.
                    rows = page.locator("#tree tbody tr")
                    await expect(rows).to_have_count(4)
                    await expect(rows.nth(0).locator(".agent")).to_contain_text("pipeline")
                    for index in range(1, 4):
                        await expect(rows.nth(index).locator(".status")).to_have_text("completed")
                    await browser.close()
                # The caller's stream ended at the question; the run went on.
                tg.cancel_scope.cancel()
    assert responses[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert architect_inputs(root, context_id)[1:] == ["French, please"]


@pytest.mark.anyio
async def test_stopping_the_session_while_a_pass_asks_ends_its_run(tmp_path: Path) -> None:
    """The web view's stop (the control API) ends the asking pass: its
    question goes, and the run ends failed instead of waiting for an answer
    that a stopped pass could never take."""
    root = project(tmp_path)
    env = {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with anyio.fail_after(90):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                first, _ = await collect(client, user_message("Add a hello module"))
                task_id, context_id, _data = _asked(first)
                async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
                    stopped = await http.post(f"/api/sessions/{context_id}/subagents/stop")
                    with anyio.move_on_after(10) as waited:
                        while True:
                            page = await http.get(f"/ui/sessions/{context_id}")
                            if 'class="question"' not in page.text:
                                break
                            await anyio.sleep(0.1)
                follow = user_message("French, please", task_id=task_id, context_id=context_id)
                second, events = await collect(client, follow)
    assert stopped.json() == {"stopped": 1}
    assert not waited.cancel_called, "the stopped pass's question still waits for an answer"
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_FAILED
    assert isinstance(events[-1], Failed) and "architect pass: aborted" in events[-1].message


@pytest.mark.anyio
async def test_a_parent_agents_question_over_a2a_is_answered_by_the_next_message(
    tmp_path: Path,
) -> None:
    """Delegate mode: the parent agent at the root asks; the task goes
    INPUT_REQUIRED and a stock client's next message (no metadata of ours)
    is its answer, in the parent's own conversation."""
    root = tmp_path / "project"
    (root / "roles").mkdir(parents=True)
    (root / "roles" / "orchestrator.md").write_text(
        "---\nname: orchestrator\ndescription: a parent that asks\nmodel: default\n"
        "tools: [agent, ask_parent]\nmax_turns: 4\ntimeout: 60\n---\nYou delegate.\n"
    )
    script = tmp_path / "parent.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "ask_parent", "arguments": {"question": QUESTION}}]},
                {"text": "Went on in French.\nTASK_DONE"},
            ]
        )
    )
    env = {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN, "A2A_MODEL_SCRIPT": str(script)}
    with anyio.fail_after(90):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                request = user_message("Add a hello module")
                request.message.metadata.update({MODE_KEY: "delegate"})
                first, _ = await collect(client, request)
                asked = first[-1].status_update
                answer = user_message(
                    "French, please", task_id=asked.task_id, context_id=asked.context_id
                )
                second, events = await collect(client, answer)
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert get_message_text(asked.status.message) == QUESTION
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert isinstance(events[-1], Done) and events[-1].text == "Went on in French.\nTASK_DONE"


def asking_parent(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A work directory whose parent agent (delegate mode) asks, then goes
    on with the answer; and the server's environment."""
    root = tmp_path / "project"
    (root / "roles").mkdir(parents=True)
    (root / "roles" / "orchestrator.md").write_text(
        "---\nname: orchestrator\ndescription: a parent that asks\nmodel: default\n"
        "tools: [agent, ask_parent]\nmax_turns: 4\ntimeout: 60\n---\nYou delegate.\n"
    )
    script = tmp_path / "parent.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "ask_parent", "arguments": {"question": QUESTION}}]},
                {"text": "Went on in French.\nTASK_DONE"},
            ]
        )
    )
    return root, {**OFFLINE, "A2A_AUTH_TOKEN": TOKEN, "A2A_MODEL_SCRIPT": str(script)}


def parent_inputs(root: Path, session: str) -> list[str]:
    """The parent agent's inputs as the store has them."""
    events = subprocess.run(
        [*CLI, "events", session, "--jsonl"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=60,
        env={**os.environ, **OFFLINE},
    )
    assert events.returncode == 0, events.stderr
    rows = [json.loads(line) for line in events.stdout.splitlines()]
    return [r["payload"]["text"] for r in rows if not r["child_id"] and r["kind"] == "input"]


@pytest.mark.anyio
async def test_the_web_view_answers_a_parent_agents_question_and_its_task_goes_on(
    tmp_path: Path,
) -> None:
    """Delegate mode: the root parent's question shows on the session page
    (its HTML and its stream) with a box; the box's answer is the parent's
    next input, as the caller's next message would be, and the task goes on
    to COMPLETED for a caller re-subscribing to it; the caller's message
    that comes later is refused, as for any task that has ended."""

    root, env = asking_parent(tmp_path)
    followed: list = []  # type: ignore[type-arg]
    with anyio.fail_after(45):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                request = user_message("Add a hello module")
                request.message.metadata.update({MODE_KEY: "delegate"})
                first, _ = await collect(client, request)
                asked = first[-1].status_update
                task_id, context_id = asked.task_id, asked.context_id
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    login = await http.post("/ui/login", data={"token": TOKEN})
                    assert login.status_code == 303
                    page = await http.get(f"/ui/sessions/{context_id}")
                    streamed = await sse_events(http, f"/ui/sessions/{context_id}/stream", {}, 3)
                    csrf = re.search(r'<meta name="csrf-token" content="([0-9a-f]+)">', page.text)
                    box = re.search(r'<form class="question" [^>]*data-answer="([^"]+)"', page.text)
                    assert csrf is not None and box is not None, page.text
                    async with anyio.create_task_group() as tg:

                        async def follow() -> None:
                            subscription = client.subscribe(SubscribeToTaskRequest(id=task_id))
                            async for response in subscription:
                                followed.append(response)

                        tg.start_soon(follow)
                        while not followed:  # subscribed: it has the task
                            await anyio.sleep(0.05)
                        answered = await http.post(
                            box.group(1),
                            json={"answer": "French, please"},
                            headers={"X-CSRF-Token": csrf.group(1)},
                        )
                    again = await http.post(
                        box.group(1),
                        json={"answer": "English"},
                        headers={"X-CSRF-Token": csrf.group(1)},
                    )
                    after = await http.get(f"/ui/sessions/{context_id}")
                late = user_message("English", task_id=task_id, context_id=context_id)
                with pytest.raises(Exception, match="terminal state") as refused:
                    await collect(client, late)
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert (
        f'<strong class="who">orchestrator</strong> asks: <span class="text">{QUESTION}</span>'
        in page.text
    )
    questions = [data for _id, name, data in streamed if name == "questions"]
    assert len(questions) == 1 and len(questions[0]) == 1, streamed
    assert questions[0][0]["text"] == QUESTION and questions[0][0]["who"] == "orchestrator"
    assert box.group(1).endswith(f"/questions/{questions[0][0]['id']}")
    assert answered.status_code == 200 and again.status_code == 409
    assert 'class="question"' not in after.text
    states = [r.status_update.status.state for r in followed if r.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED, followed
    decoder = StreamDecoder()
    ended = [event for response in followed for event in decoder.decode(response)]
    assert "terminal state" in str(refused.value)
    assert parent_inputs(root, context_id) == ["Add a hello module", "French, please"]
    assert isinstance(ended[-1], Done) and ended[-1].text == "Went on in French.\nTASK_DONE"


@pytest.mark.anyio
async def test_a_parent_agents_question_answered_by_its_caller_is_gone_from_the_web_view(
    tmp_path: Path,
) -> None:
    """The caller's message answers first: the box's answer is refused (409)."""
    root, env = asking_parent(tmp_path)
    with anyio.fail_after(45):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                request = user_message("Add a hello module")
                request.message.metadata.update({MODE_KEY: "delegate"})
                first, _ = await collect(client, request)
                asked = first[-1].status_update
                context_id = asked.context_id
                async with httpx.AsyncClient(base_url=url, timeout=30) as http:
                    login = await http.post("/ui/login", data={"token": TOKEN})
                    assert login.status_code == 303
                    page = await http.get(f"/ui/sessions/{context_id}")
                    csrf = re.search(r'<meta name="csrf-token" content="([0-9a-f]+)">', page.text)
                    box = re.search(r'<form class="question" [^>]*data-answer="([^"]+)"', page.text)
                    assert csrf is not None and box is not None, page.text
                    answer = user_message(
                        "French, please", task_id=asked.task_id, context_id=context_id
                    )
                    second, events = await collect(client, answer)
                    late = await http.post(
                        box.group(1),
                        json={"answer": "English"},
                        headers={"X-CSRF-Token": csrf.group(1)},
                    )
                    after = await http.get(f"/ui/sessions/{context_id}")
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert isinstance(events[-1], Done) and events[-1].text == "Went on in French.\nTASK_DONE"
    assert late.status_code == 409 and 'class="question"' not in after.text
    assert parent_inputs(root, context_id) == ["Add a hello module", "French, please"]


@pytest.mark.anyio
async def test_a_parent_agents_question_outlives_a_restart_of_the_server(tmp_path: Path) -> None:
    """The question's box goes with the server, not the question: after a
    restart the caller's next message is still the parent's answer."""
    root, env = asking_parent(tmp_path)
    with anyio.fail_after(50):
        with serve_process(root, "orchestrator", env=env) as (process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                request = user_message("Add a hello module")
                request.message.metadata.update({MODE_KEY: "delegate"})
                first, _ = await collect(client, request)
            process.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: process.wait(20))
        asked = first[-1].status_update
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                answer = user_message(
                    "French, please", task_id=asked.task_id, context_id=asked.context_id
                )
                second, events = await collect(client, answer)
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert isinstance(events[-1], Done) and events[-1].text == "Went on in French.\nTASK_DONE"
    assert parent_inputs(root, asked.context_id) == ["Add a hello module", "French, please"]


@pytest.mark.anyio
async def test_canceling_a_task_whose_parent_agent_asked_withdraws_its_question(
    tmp_path: Path,
) -> None:
    root, env = asking_parent(tmp_path)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with anyio.fail_after(45):
        with serve_process(root, "orchestrator", env=env) as (_process, url, _banner):
            async with a2a_client(url, token=TOKEN) as client:
                request = user_message("Add a hello module")
                request.message.metadata.update({MODE_KEY: "delegate"})
                first, _ = await collect(client, request)
                asked = first[-1].status_update
                async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
                    before = await http.get(f"/ui/sessions/{asked.context_id}")
                    canceled = await client.cancel_task(CancelTaskRequest(id=asked.task_id))
                    with anyio.move_on_after(10) as waited:
                        while True:
                            page = await http.get(f"/ui/sessions/{asked.context_id}")
                            if 'class="question"' not in page.text:
                                break
                            await anyio.sleep(0.1)
    assert 'class="question"' in before.text
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert not waited.cancel_called, "the canceled task's question still waits for an answer"
    assert parent_inputs(root, asked.context_id) == ["Add a hello module"]
