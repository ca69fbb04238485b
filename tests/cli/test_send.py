"""`a2a-orchestrator send URL TEXT` against three kinds of A2A server: a role
server, `serve orchestrator`, and a bare a2a-sdk server this file starts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from a2a.helpers import get_message_text, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from support.cli import OFFLINE
from support.servers import role_server, serve_process

from a2a_orchestrator.cli.commands.send import CARD_SECONDS, SEND_EXIT_CODES
from a2a_orchestrator.server.serving import bind_socket, serve

pytestmark = pytest.mark.anyio

CLI = [sys.executable, "-m", "a2a_orchestrator.cli", "send"]


async def send(
    *args: str, stdin: int | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """`send` as a real process (its stdin a pipe unless given): exit code, stdout, stderr."""
    done = await anyio.run_process(
        [*CLI, *args],
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        check=False,
        env={**os.environ, **OFFLINE, **(env or {})},
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


# -- a bare a2a-sdk server ----------------------------------------------------------


class KeywordExecutor(AgentExecutor):
    """Ends each task as its text says: `reject`, `cancel`, `fail`, `ask`
    (a question, answered by the next message), `later` (the turn returns
    while the task still works; it completes in the store a moment later, as
    an agent finishing in the background), else completes echoing it."""

    def __init__(self, task_store: InMemoryTaskStore) -> None:
        self.task_store = task_store
        self.background: set[asyncio.Task[None]] = set()

    async def _complete_later(self, task_id: str, context: RequestContext) -> None:
        await asyncio.sleep(1.5)
        task = await self.task_store.get(task_id, context.call_context)
        assert task is not None
        task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED))
        task.artifacts.add().parts.append(new_text_part("finished later"))
        await self.task_store.save(task, context.call_context)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        text = get_message_text(context.message) if context.message is not None else ""
        if context.current_task is None:
            status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=status))
        updater = TaskUpdater(event_queue, task_id, context_id)
        working = updater.new_agent_message([new_text_part(f"reading {text!r}")])
        await updater.update_status(TaskState.TASK_STATE_WORKING, working)
        if text == "reject":
            await updater.reject(updater.new_agent_message([new_text_part("not my job")]))
        elif text == "cancel":
            await updater.cancel()
        elif text == "fail":
            await updater.failed(updater.new_agent_message([new_text_part("it broke")]))
        elif text == "later":
            work = asyncio.get_running_loop().create_task(self._complete_later(task_id, context))
            self.background.add(work)  # kept: the loop holds tasks weakly
            work.add_done_callback(self.background.discard)
        elif text == "ask":
            await updater.requires_input(
                updater.new_agent_message([new_text_part("Which colour?")])
            )
        else:
            await updater.add_artifact([new_text_part(f"you said {text}")], name="result")
            await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


@asynccontextmanager
async def bare_server(*, streaming: bool = True) -> AsyncIterator[str]:
    """A stock a2a-sdk server (no code of this project but the socket helper) on loopback."""
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = AgentCard(
        name="bare",
        description="a bare a2a-sdk server",
        version="1",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="keywords", tags=["test"])],
    )
    tasks = InMemoryTaskStore()
    handler = DefaultRequestHandler(
        agent_executor=KeywordExecutor(tasks), task_store=tasks, agent_card=card
    )
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    async with anyio.create_task_group() as tg:
        await tg.start(serve, app, sock)
        try:
            yield url
        finally:
            tg.cancel_scope.cancel()


async def test_send_to_a_bare_sdk_server_exits_by_the_tasks_end() -> None:
    with anyio.fail_after(90):
        async with bare_server() as url:
            done = await send(url, "hello")
            ended = {word: await send(url, word) for word in ("fail", "cancel", "reject", "ask")}
    code, out, _ = done
    assert code == 0, out
    assert "[bare] says \"reading 'hello'\"" in out
    assert "[bare] done:\nyou said hello\n" in out
    assert "completed (exit 0)" in out
    for word, ending in [
        ("fail", "failed"),
        ("cancel", "canceled"),
        ("reject", "rejected"),
        ("ask", "input-required"),
    ]:
        code, out, err = ended[word]
        assert code == SEND_EXIT_CODES[ending], (word, out, err)
        assert f"{ending} (exit {code})" in out
    assert len(set(SEND_EXIT_CODES.values())) == len(SEND_EXIT_CODES)
    assert 2 not in SEND_EXIT_CODES.values()
    # In a pipe the question cannot be answered here: it says how to answer it.
    out = ended["ask"][1]
    assert "[bare] asks: Which colour?" in out
    assert "answer it with: a2a-orchestrator send" in out and "--task " in out


async def test_a_task_that_outlives_its_answer_is_followed_to_its_end() -> None:
    # An agent that does not stream: its blocking answer is a task still
    # working, which `send` then reads back until it ends.
    with anyio.fail_after(60):
        async with bare_server(streaming=False) as url:
            code, out, err = await send(url, "later")
            plain = await send(url, "hello")
    assert code == 0, out + err
    assert "[bare] done:\nfinished later\n" in out
    assert plain[0] == 0 and "[bare] done:\nyou said hello\n" in plain[1]


async def on_terminal(
    *args: str, typed: bytes = b"", interrupt_at: bytes | None = None
) -> tuple[int, str, str]:
    """`send` with a pseudo-terminal as its stdin and stdout, as a person runs
    it: `typed` is what the person types; `interrupt_at`: Ctrl-C once this
    is shown. Exit code, what the terminal showed, stderr."""
    leader, follower = os.openpty()
    try:
        if typed:
            os.write(leader, typed)
        process = await anyio.open_process(
            [*CLI, *args],
            stdin=follower,
            stdout=follower,
            stderr=subprocess.PIPE,
            env={**os.environ, **OFFLINE},
        )
        os.close(follower)
        follower = -1
        shown, interrupted = b"", False
        while True:
            await anyio.wait_readable(leader)  # cancellable, unlike a read in a thread
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the process closed its end
                break
            if not chunk:
                break
            shown += chunk
            if interrupt_at is not None and interrupt_at in shown and not interrupted:
                process.send_signal(signal.SIGINT)
                interrupted = True
        await process.wait()
        assert process.stderr is not None and process.returncode is not None
        err = (await process.stderr.receive()).decode() if process.returncode else ""
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    return process.returncode, shown.decode().replace("\r\n", "\n"), err


async def test_a_question_is_answered_from_the_terminal() -> None:
    with anyio.fail_after(60):
        async with bare_server() as url:
            code, out, err = await on_terminal(url, "ask", typed=b"blue\n")
    assert code == 0, out + err
    assert "[bare] asks: Which colour?" in out
    assert "answer> " in out
    assert "[bare] done:\nyou said blue\n" in out


async def test_with_its_output_redirected_send_does_not_ask() -> None:
    # `send URL TEXT > out.txt` on a terminal: the question and its prompt
    # would go to the file, unseen, and the command wait for an answer
    # nobody knows is wanted. As `run`, it asks only with both ends a terminal.
    with anyio.fail_after(60):
        async with bare_server() as url:
            leader, follower = os.openpty()
            try:
                code, out, err = await send(url, "ask", stdin=follower)
            finally:
                os.close(leader)
                os.close(follower)
    assert code == SEND_EXIT_CODES["input-required"], out + err
    assert "answer> " not in out
    assert "answer it with: a2a-orchestrator send" in out


async def test_a_follow_up_answers_with_task_and_context_and_json_lines() -> None:
    with anyio.fail_after(60):
        async with bare_server() as url:
            code, out, _ = await send(url, "ask", "--json")
            assert code == SEND_EXIT_CODES["input-required"]
            lines = [json.loads(line) for line in out.splitlines()]
            end = lines[-1]
            assert end["end"] == "input-required" and end["exit"] == code
            kinds = [line["event"]["kind"] for line in lines[:-1]]
            assert kinds[-1] == "input_required"
            code, out, _ = await send(
                url, "green", "--task", end["taskId"], "--context", end["contextId"], "--json"
            )
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert lines[-1]["end"] == "completed" and lines[-1]["taskId"] == end["taskId"]
    assert lines[-2]["event"] == {**lines[-2]["event"], "kind": "done", "text": "you said green"}


# -- a role server --------------------------------------------------------------------


async def test_send_to_a_role_server_with_a_token(tmp_path: Path) -> None:
    script = [
        {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
        {"text": "Looked around. TASK_DONE"},
    ]
    token = "s3cret-token"
    with anyio.fail_after(60):
        async with role_server(tmp_path, script, token=token) as server:
            refused = await send(server.url, "look")
            wrong = await send(server.url, "look", "--token-env", "T", env={"T": "wrong"})
            code, out, err = await send(server.url, "look", "--token-env", "T", env={"T": token})
    assert refused[0] == wrong[0] == SEND_EXIT_CODES["auth-refused"], refused
    assert "auth-refused (exit 7)" in wrong[1] and "401" in wrong[2]
    assert code == 0, out + err
    assert "[coder] calls list_files ." in out
    assert "[coder] list_files ok" in out
    assert "[coder] done:\nLooked around. TASK_DONE\n" in out


async def test_send_to_a_role_server_that_asks_then_fails(tmp_path: Path) -> None:
    script = [
        {"tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which file?"}}]},
        {"error": "the model endpoint is down"},
    ]
    with anyio.fail_after(60):
        async with role_server(tmp_path, script, role="architect") as server:
            code, out, _ = await send(server.url, "plan it", "--no-input", "--json")
            end = json.loads(out.splitlines()[-1])
            failed = await send(
                server.url, "a.py", "--task", end["taskId"], "--context", end["contextId"]
            )
    assert code == SEND_EXIT_CODES["input-required"]
    assert failed[0] == SEND_EXIT_CODES["failed"], failed
    assert "[architect] failed (error)" in failed[1]


async def test_unreachable_and_bad_usage() -> None:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with anyio.fail_after(30):
        code, _, err = await send(f"http://127.0.0.1:{port}", "hi")
        usage = await send("127.0.0.1:9", "hi")
        unset = await send("http://127.0.0.1:9", "hi", "--token-env", "NO_SUCH_VARIABLE_SET")
    assert code == SEND_EXIT_CODES["unreachable"] and "unreachable" in err
    assert usage[0] == 2 and "http://" in usage[2]
    assert unset[0] == 2 and "NO_SUCH_VARIABLE_SET" in unset[2]


async def test_a_listener_that_never_answers_is_unreachable_in_bounded_time() -> None:
    # A port that accepts connections and answers nothing (a hung or stopped
    # server: the kernel still accepts). `send` waited for its card for ever.
    sock = bind_socket("127.0.0.1", 0)
    sock.listen(8)  # connections are accepted by the kernel, never read
    port = sock.getsockname()[1]
    try:
        started = time.monotonic()
        with anyio.fail_after(CARD_SECONDS + 30):
            code, out, err = await send(f"http://127.0.0.1:{port}", "hi", "--json")
        took = time.monotonic() - started
    finally:
        sock.close()
    assert code == SEND_EXIT_CODES["unreachable"], out + err
    assert f"did not answer within {CARD_SECONDS:g} s" in err
    assert json.loads(out.splitlines()[-1])["end"] == "unreachable"
    assert took < CARD_SECONDS + 20


# -- serve orchestrator ---------------------------------------------------------------


async def test_send_to_serve_orchestrator_shows_its_children(tmp_path: Path) -> None:
    with anyio.fail_after(120):
        with serve_process(tmp_path, "orchestrator", env=OFFLINE) as (_, url, _banner):
            code, out, err = await send(url, "Add a --verbose flag")
    assert code == 0, out + err
    # The pipeline's children, each named, as the orchestrator reports them.
    for role in ("architect", "coder", "reviewer"):
        assert f"[{role} " in out, out
    assert "[orchestrator] done:\nTASK_" in out
    assert "completed (exit 0)" in out


async def test_on_a_terminal_a_message_streams_as_it_is_written(tmp_path: Path) -> None:
    text = "one two three four five six seven eight nine ten. TASK_DONE"
    script = [
        {
            "text": "Reading the files first, then the tests.",
            "tool_calls": [{"name": "list_files", "arguments": {"path": "."}}],
        },
        {"text": text},
    ]
    with anyio.fail_after(60):
        async with role_server(tmp_path, script) as server:
            leader, follower = os.openpty()
            try:
                process = await anyio.open_process(
                    [*CLI, server.url, "look"],
                    stdin=subprocess.DEVNULL,
                    stdout=follower,
                    env={**os.environ, **OFFLINE},
                )
                os.close(follower)
                shown = b""
                while True:
                    try:
                        chunk = await anyio.to_thread.run_sync(os.read, leader, 65536)
                    except OSError:  # the process closed its end
                        break
                    if not chunk:
                        break
                    shown += chunk
                await process.wait()
            finally:
                os.close(leader)
    out = shown.decode().replace("\r\n", "\n")
    assert process.returncode == 0, out
    # The whole message, streamed onto one line, not the short form a log gets.
    assert "[coder] says: Reading the files first, then the tests.\n" in out
    assert 'says "' not in out
    assert "[coder] calls list_files ." in out
    assert f"[coder] done:\n{text}\n" in out


async def test_ctrl_c_at_the_question_ends_send_at_once() -> None:
    # Ctrl-C while `send` waits for the person's answer: the command ends
    # (130), not when the next line is typed. A read blocked in a thread kept
    # the process alive after "interrupted" until Enter.
    with anyio.fail_after(60):
        async with bare_server() as url:
            code, out, err = await on_terminal(url, "ask", interrupt_at=b"answer> ")
    assert "[bare] asks: Which colour?" in out
    assert code == 130, out + err
    assert "interrupted" in err
