"""Sessions through the CLI: `resume` continues a killed pipeline, short ids
work everywhere, `status` says how each run ended, `.a2a/` stays out of git.

Real `run`, `resume` and `serve` processes, a real SQLite store, real
SIGKILLs and Ctrl-Cs (SIGINT); only the model is scripted (A2A_MODEL_SCRIPT). The scripted turn
that holds a pass still is a real sandboxed command waiting for a file, so
the test knows the pass is under way (the command made `reached`) and lets
it go (it makes `release`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.cli import cli
from support.servers import served_url

from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.storage.store import Store

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]
OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
    "A2A_MODEL_SCRIPT": "",
}
HOLD = "touch reached; while [ ! -e release ]; do sleep 0.1; done"


def command(text: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": text}}]}


def rows(db: Path, sql: str, *params: Any) -> list[sqlite3.Row]:
    with sqlite3.connect(db, timeout=10) as conn:
        conn.row_factory = sqlite3.Row
        return conn.execute(sql, params).fetchall()


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the run ended first: {process.communicate(timeout=10)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} after {timeout} s")
        time.sleep(0.05)


@contextmanager
def role_server(role: str, workdir: Path, env: dict[str, str]) -> Iterator[str]:
    """`a2a-orchestrator serve ROLE` on a free port; its URL."""
    process = subprocess.Popen(
        [*CLI, "serve", role, "--port", "0", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=workdir,
        env={**os.environ, **OFFLINE, **env},
    )
    try:
        yield served_url(process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def killed_run(
    work: Path, env: dict[str, str], *args: str, stop_with: signal.Signals = signal.SIGKILL
) -> str:
    """Start `run`, send it `stop_with` once a pass holds at HOLD, release
    the hold; the session id."""
    process = subprocess.Popen(
        [*CLI, "run", "Build it", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work,
        env={**os.environ, **OFFLINE, **env},
    )
    try:
        wait_for(work / "reached", process)
        process.send_signal(stop_with)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    if stop_with == signal.SIGINT:
        # Ctrl-C: quiet, and the conventional 128 + SIGINT.
        assert process.returncode == 130 and err.strip() == "interrupted", (out, err)
    else:
        assert process.returncode == -stop_with, (out, err)
    (work / "release").touch()
    match = re.search(r"session ([0-9a-f]{32})", out)
    assert match, out + err
    return match.group(1)


@pytest.mark.parametrize(
    ("transport", "stop_with"),
    [("local", signal.SIGKILL), ("remote", signal.SIGKILL), ("local", signal.SIGINT)],
    ids=["local-kill", "remote-kill", "local-ctrl-c"],
)
def test_resume_continues_a_killed_pipeline(
    transport: str, stop_with: signal.Signals, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    # Every role replays it: the architect may not run commands (its call
    # fails, then it answers); the coder holds in its command until released.
    script.write_text(json.dumps([command(HOLD), {"text": "All done.\nTASK_SKIPPED"}]))
    env = {"A2A_MODEL_SCRIPT": str(script)}
    db = work / ".a2a" / "orchestrator.db"
    with contextmanager_if(transport == "remote", role_server, "coder", work, env) as url:
        run_env = {**env, **({"A2A_AGENT_CODER_URL": url} if url else {})}
        session = killed_run(work, run_env, stop_with=stop_with)
        before = rows(db, "SELECT role, status FROM children ORDER BY created_at")
        # A short id, and no --workdir: `run` recorded it.
        resumed = cli("resume", session[:8], cwd=work, env=run_env)
    assert [tuple(r) for r in before] == [("architect", "completed"), ("coder", "running")]
    assert resumed.returncode == 3, (resumed.stdout, resumed.stderr)
    assert "resuming the pipeline" in resumed.stdout
    assert "signal: TASK_SKIPPED" in resumed.stdout
    assert "Traceback" not in resumed.stderr
    children = rows(db, "SELECT * FROM children ORDER BY created_at")
    assert [(r["role"], r["status"]) for r in children] == [
        ("architect", "completed"),
        ("coder", "completed"),
        ("reviewer", "completed"),
    ]
    assert children[1]["transport"] == transport
    # The finished architect pass was not run again: one prompt, one start.
    architect = children[0]["child_id"]
    kinds = [r["kind"] for r in rows(db, "SELECT kind FROM events WHERE child_id = ?", architect)]
    assert kinds.count("input") == 1 and kinds.count("started") == 1
    artifacts = work / ".a2a" / "tasks" / f"{session[:8]}-build-it-multiagent"
    assert sorted(p.name for p in artifacts.iterdir()) == [
        "architect.txt",
        "coder.txt",
        "reviewer.txt",
    ]
    assert (artifacts / "reviewer.txt").read_text() == "All done.\nTASK_SKIPPED"
    status = cli("status", cwd=work)
    assert re.search(rf"{session}\s+\S+ \S+\s+TASK_SKIPPED\s+3 completed", status.stdout)
    again = cli("resume", session, cwd=work, env=run_env)
    assert again.returncode == 3 and "nothing to resume" in again.stdout


@contextmanager
def contextmanager_if(condition: bool, manager: Any, *args: Any) -> Iterator[str]:
    """`manager(*args)` when `condition`, else nothing (yields "")."""
    if not condition:
        yield ""
        return
    with manager(*args) as value:
        yield value


def test_resume_continues_a_review_round_without_sending_twice(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    # First pass of each role: a quick command, then TASK_FAILED, so the
    # reviewer sends the task back; the coder's second round holds.
    script.write_text(
        json.dumps(
            [
                command("echo first look"),
                {"text": "Not yet.\nTASK_FAILED"},
                command(HOLD),
                {"text": "Fixed.\nTASK_DONE"},
            ]
        )
    )
    env = {"A2A_MODEL_SCRIPT": str(script)}
    session = killed_run(work, env, "--review-rounds", "2")
    resumed = cli("resume", session, cwd=work, env=env)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert "signal: TASK_DONE" in resumed.stdout
    db = work / ".a2a" / "orchestrator.db"
    children = rows(db, "SELECT child_id, role FROM children ORDER BY created_at")
    assert [r["role"] for r in children] == ["architect", "coder", "reviewer"]
    coder = children[1]["child_id"]
    inputs = rows(db, "SELECT payload FROM events WHERE child_id = ? AND kind = 'input'", coder)
    # Its prompt and the one follow-up of round two: the follow-up had
    # reached it before the kill, so the resume did not send it again.
    assert len(inputs) == 2 and "The reviewer sent the task back" in inputs[1]["payload"]
    artifacts = work / ".a2a" / "tasks" / f"{session[:8]}-build-it-multiagent"
    assert (artifacts / "coder.txt").read_text() == "Fixed.\nTASK_DONE"


def test_short_ids_status_and_git(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    run = cli("run", "Add a hello module", cwd=tmp_path)
    assert run.returncode == 3, (run.stdout, run.stderr)
    session = re.search(r"session ([0-9a-f]{32})", run.stdout).group(1)  # type: ignore[union-attr]
    # A model that asks, is told nobody can answer (no terminal), and has no turn left.
    ask = tmp_path.parent / "ask.json"
    ask.write_text(
        json.dumps([{"tool_calls": [{"name": "ask_parent", "arguments": {"question": "?"}}]}])
    )
    failed = cli("run", "Ask first", cwd=tmp_path, env={"A2A_MODEL_SCRIPT": str(ask)})
    assert failed.returncode == 1, (failed.stdout, failed.stderr)
    other = re.search(r"session ([0-9a-f]{32})", failed.stdout).group(1)  # type: ignore[union-attr]

    # .a2a/ (store, artifacts) carries its own .gitignore: git sees nothing.
    porcelain = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert porcelain.returncode == 0 and porcelain.stdout == ""
    assert (tmp_path / ".a2a" / ".gitignore").read_text() == "*\n"

    status = cli("status", cwd=tmp_path).stdout.splitlines()
    header = ["SESSION", "STARTED", "SIGNAL", "CHILDREN", "USAGE", "RUNNER", "TITLE"]
    assert status[0].split() == header
    lines = {line.split()[0]: line for line in status[1:]}
    # The session's tokens, summed from its children's stored turns.
    assert re.search(r"\s[1-9]\d*tok\s", lines[session]), lines[session]
    assert "TASK_SKIPPED" in lines[session] and "3 completed" in lines[session]
    assert "ended" in lines[session] and lines[session].endswith("Add a hello module")
    assert " error " in lines[other] and "1 failed" in lines[other]

    short = session[:8]  # what the live tree prints
    children = cli("children", short, cwd=tmp_path)
    child = children.stdout.splitlines()[1].split()[0]  # under the header
    events = cli("events", short, "--child", child[:6], cwd=tmp_path)
    stop = cli("stop", short, "--server", "http://127.0.0.1:9", cwd=tmp_path)
    # The header, three passes, then the session's total.
    assert children.returncode == 0 and len(children.stdout.splitlines()) == 1 + 3 + 1
    assert events.returncode == 0 and all(child in line for line in events.stdout.splitlines())
    assert "input:" in events.stdout and "done" in events.stdout
    assert stop.returncode == 0 and "stopped 0" in stop.stdout


@pytest.mark.anyio
async def test_a_session_keeps_its_state_directories_out_of_git(tmp_path: Path) -> None:
    # Through the Python API too, not only the CLI: the work directory's
    # .a2a/ and a store's own .a2a/ elsewhere each get their .gitignore.
    work = tmp_path / "work"
    work.mkdir()
    store = Store(tmp_path / "elsewhere" / ".a2a" / "orchestrator.db")
    with anyio.fail_after(30):
        async with Session(store, workdir=work):
            pass
    for state in (work / ".a2a", tmp_path / "elsewhere" / ".a2a"):
        assert (state / ".gitignore").read_text() == "*\n"


def test_run_session_takes_a_prefix_and_refuses_an_ended_session(tmp_path: Path) -> None:
    """Issue 25: `run --session PREFIX` made a new session named PREFIX, and a
    finished session's id silently took a second run."""
    first = cli("run", "Add a hello module", cwd=tmp_path)
    assert first.returncode == 3, first.stdout + first.stderr  # offline: TASK_SKIPPED
    session = re.search(r"session ([0-9a-f]{32})", first.stdout).group(1)  # type: ignore[union-attr]
    refused = cli("run", "Again", "--session", session[:8], cwd=tmp_path)
    appended = cli("run", "Again", "--session", session[:8], "--append", cwd=tmp_path)
    named = cli("run", "Elsewhere", "--session", "my-own-id", cwd=tmp_path)
    alone = cli("run", "Again", "--append", cwd=tmp_path)
    assert refused.returncode == 2
    assert f"session {session} has ended (TASK_SKIPPED)" in refused.stderr
    assert "--append" in refused.stderr
    assert appended.returncode == 3 and f"session {session}" in appended.stdout
    assert named.returncode == 3 and "session my-own-id" in named.stdout
    assert alone.returncode == 2 and "--append" in alone.stderr
    with sqlite3.connect(tmp_path / ".a2a" / "orchestrator.db") as db:
        sessions = sorted(row[0] for row in db.execute("SELECT id FROM sessions"))
        children = db.execute(
            "SELECT COUNT(*) FROM children WHERE session_id = ?", (session,)
        ).fetchone()[0]
    assert sessions == sorted([session, "my-own-id"])  # no session named by the prefix
    assert children == 6  # the refused run added none; the appended one its three
