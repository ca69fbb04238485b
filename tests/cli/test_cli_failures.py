"""The CLI under bad input, as a new user meets it: a clear message and the
documented exit code, never a traceback.

Each case runs the real `a2a-orchestrator` as a subprocess, in a fresh
directory, with a real SQLite store where one is needed. Exit codes (the
README's table): TASK_DONE 0, TASK_FAILED 1, TASK_SKIPPED 3, and 2 for bad
usage or configuration. A run whose pass fails at run time (an agent that
cannot be used, a model endpoint that is down) is a failed task: 1.
Only the model is scripted, where a case needs one.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from support.cli import cli
from support.ports import closed_port

from a2a_orchestrator import __version__
from a2a_orchestrator.storage.store import Store

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]
OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
    "A2A_MODEL_SCRIPT": "",
}


@contextmanager
def card_server(body: bytes | Callable[[str], bytes]) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 whose agent card is `body` (or
    `body(its own URL)`): what a peer that is not, or not quite, an A2A
    agent answers. A POST gets 501, as from a plain web server."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    card = body(url) if callable(body) else body

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/.well-known/agent-card.json":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(card)))
            self.end_headers()
            self.wfile.write(card)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test's output stays the CLI's

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@dataclass
class Case:
    args: list[str]
    code: int
    message: str
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    stream: str = "stderr"
    """Where the message is: expected failures print to stderr, except a
    failed run, whose pipeline says how it failed on stdout."""


def _write(relative: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(root: Path) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)

    return setup


def _sessions(*ids: str) -> Callable[[Path], None]:
    """A store holding these sessions (written through the real Store)."""

    def setup(root: Path) -> None:
        async def create() -> None:
            store = Store(root / ".a2a" / "orchestrator.db")
            try:
                for session_id in ids:
                    await store.create_session(session_id, title=f"session {session_id}")
            finally:
                store.close()

        anyio.run(create)

    return setup


CASES: dict[str, Case] = {
    # -- usage (argparse): exit 2 with the usage line --------------------------
    "unknown command": Case(["launch"], 2, "invalid choice: 'launch'"),
    "no command": Case([], 2, "the following arguments are required: COMMAND"),
    "review rounds zero": Case(
        ["run", "x", "--review-rounds", "0"], 2, "--review-rounds: must be at least 1, got 0"
    ),
    "review rounds negative": Case(
        ["run", "x", "--review-rounds", "-3"], 2, "--review-rounds: must be at least 1, got -3"
    ),
    "review rounds not a number": Case(
        ["run", "x", "--review-rounds", "two"], 2, "'two' is not a whole number"
    ),
    "serve port out of range": Case(
        ["serve", "coder", "--port", "70000"], 2, "port 70000 is not in 0..65535"
    ),
    "up port negative": Case(["up", "--port", "-1"], 2, "port -1 is not in 0..65535"),
    "stop wait zero": Case(
        ["stop", "s", "--wait", "0"], 2, "--wait: must be a positive number of seconds"
    ),
    "stop wait nan": Case(
        ["stop", "s", "--wait", "nan"], 2, "--wait: must be a positive number of seconds"
    ),
    "memory limit zero": Case(
        ["serve", "coder", "--max-memory-mb", "0"], 2, "--max-memory-mb: must be positive"
    ),
    "body timeout negative": Case(
        ["serve", "coder", "--body-timeout", "-1"], 2, "--body-timeout: must be positive"
    ),
    # -- configuration: exit 2, one line, before anything runs -----------------
    "empty task": Case(["run", "  "], 2, "TASK is empty"),
    "unknown role": Case(
        ["run", "x", "--parent", "--role", "wizard"], 2, "Unknown role 'wizard'. Known roles:"
    ),
    "serve unknown role": Case(["serve", "wizard"], 2, "Unknown role 'wizard'"),
    "missing workdir": Case(["run", "x", "--workdir", "nowhere"], 2, "nowhere does not exist"),
    "missing store": Case(["status", "--store", "none.db"], 2, "no store at none.db"),
    "demo into a file": Case(
        ["demo", "--workdir", "notes.txt"],
        2,
        "--workdir notes.txt is not a directory",
        setup=_write("notes.txt", "mine\n"),
    ),
    "store is not SQLite": Case(
        ["status", "--store", "notes.db"],
        2,
        "cannot open store notes.db: file is not a database",
        setup=_write("notes.db", "these are my notes, not a database\n" * 50),
    ),
    "store is a directory": Case(
        ["run", "x", "--store", "."], 2, "cannot open store .: unable to open database file"
    ),
    "unknown session": Case(
        ["children", "nope"],
        2,
        "no session 'nope' in .a2a/orchestrator.db",
        setup=_sessions("aaa111"),
    ),
    "ambiguous session prefix": Case(
        ["events", "aa"],
        2,
        "session 'aa' is ambiguous in .a2a/orchestrator.db: it starts 2 sessions "
        "(aaa111, aab222); give more of the id",
        setup=_sessions("aaa111", "aab222"),
    ),
    "ambiguous prefix for stop": Case(
        ["stop", "aa", "--server", f"http://127.0.0.1:{closed_port()}"],
        2,
        "session 'aa' is ambiguous",
        setup=_sessions("aaa111", "aab222"),
    ),
    "unknown child": Case(
        ["events", "aaa", "--child", "c9"],
        2,
        "session aaa111 has no child 'c9'",
        setup=_sessions("aaa111", "aab222"),
    ),
    "agent file not TOML": Case(
        ["run", "x"],
        2,
        "agents/coder.toml: not valid TOML",
        setup=_write("agents/coder.toml", "name = \n"),
    ),
    "agent with an unknown role": Case(
        ["run", "x"],
        2,
        "Unknown role 'wizard'",
        setup=_write("agents/coder.toml", 'name = "coder"\nrole = "wizard"\n'),
    ),
    "agent URL not http": Case(
        ["run", "x"],
        2,
        "A2A_AGENT_CODER_URL",
        env={"A2A_AGENT_CODER_URL": "ftp://files.example"},
    ),
    "role file with an unknown tool": Case(
        ["run", "x"],
        2,
        "lists unknown tools ['teleport']",
        setup=_write("roles/coder.md", "---\nname: coder\ntools: [teleport]\n---\nCode.\n"),
    ),
    "model script missing": Case(
        ["run", "x"], 2, "cannot read model script", env={"A2A_MODEL_SCRIPT": "no-such.json"}
    ),
    "model script not JSON": Case(
        ["run", "x"],
        2,
        "does not parse",
        env={"A2A_MODEL_SCRIPT": "turns.json"},
        setup=_write("turns.json", "[{"),
    ),
    "hooks file missing": Case(
        ["run", "x", "--hooks", "hooks.toml"], 2, "cannot read hook file hooks.toml"
    ),
    "session id with a path": Case(
        ["run", "x", "--session", "../../etc"], 2, "session id '../../etc': use 1-128"
    ),
    # -- a pass that fails at run time: the task failed, exit 1 ---------------
    "model endpoint down": Case(
        ["run", "x"],
        1,
        "pipeline failed: architect pass: error: model endpoint http://127.0.0.1:",
        env={"A2A_MODEL_BASE_URL": f"http://127.0.0.1:{closed_port()}/v1"},
        stream="stdout",
    ),
    "agent unreachable": Case(
        ["run", "x"],
        1,
        "architect pass: agent at http://127.0.0.1:",
        env={"A2A_AGENT_ARCHITECT_URL": f"http://127.0.0.1:{closed_port()}"},
        stream="stdout",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_gets_a_message_and_its_exit_code(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    if case.setup is not None:
        case.setup(tmp_path)
    result = cli(*case.args, cwd=tmp_path, env=case.env)
    shown = result.stderr if case.stream == "stderr" else result.stdout
    assert result.returncode == case.code, (result.stdout, result.stderr)
    assert case.message in shown, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "ExceptionGroup" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        # Not UTF-8: a2a-sdk let this out as a bare UnicodeDecodeError.
        (b'{"name": "\xc3\x28"}', "can't decode byte 0xc3"),
        (b"<html>It works!</html>", "Failed to parse JSON for agent card"),
        (b'{"name": 5}', "Failed to validate agent card structure"),
        # A card with no interface this client speaks: a2a-sdk's ValueError.
        (b"{}", "no compatible transports found"),
    ],
    ids=["not utf-8", "not json", "not a card", "no interface"],
)
def test_a_garbage_agent_card_names_the_agent(body: bytes, detail: str, tmp_path: Path) -> None:
    with card_server(body) as url:
        result = cli("run", "x", cwd=tmp_path, env={"A2A_AGENT_ARCHITECT_URL": url})
    assert result.returncode == 1, (result.stdout, result.stderr)
    expected = f"pipeline failed: architect pass: agent at {url} has no usable agent card"
    assert expected in result.stdout and detail in result.stdout, result.stdout
    assert "Traceback" not in result.stderr, result.stderr


def test_a_peer_that_fails_a_child_is_logged_in_one_line(tmp_path: Path) -> None:
    # A card that offers JSON-RPC at an address that answers 501: the child
    # fails with ProtocolError, which the runtime logs. Without -v the log
    # keeps to one line per failure; -v brings the traceback back.
    def card(url: str) -> bytes:
        interface = {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}
        return json.dumps({"name": "impostor", "supportedInterfaces": [interface]}).encode()

    with card_server(card) as url:
        env = {"A2A_AGENT_ARCHITECT_URL": url}
        brief = cli("run", "x", cwd=tmp_path, env=env)
        verbose = cli("-v", "run", "x", cwd=tmp_path, env=env)
    assert brief.returncode == 1 and f"agent at {url} answered HTTP 501" in brief.stdout
    assert "Traceback" not in brief.stderr and "-v shows the traceback" in brief.stderr
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr


def test_version() -> None:
    result = subprocess.run(
        [*CLI, "--version"], capture_output=True, text=True, timeout=30, env=os.environ
    )
    assert result.returncode == 0 and result.stdout.strip() == f"a2a-orchestrator {__version__}"
