"""`stop SESSION` without a server tells the truth about who runs the session.

Real `run` processes, a real SQLite store and real signals; only the model is
scripted. `stop` is pointed at a closed port, so no orchestrator server is
reachable and it must find the session's runner through the store.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.cli import cli
from support.processes import journaled_processes, running_with_text, until_none_blocking

from a2a_orchestrator.delegation.runner import boot_id
from a2a_orchestrator.storage.store import ChildRecord, RunnerRecord, Store
from a2a_orchestrator.tools.procs import start_ticks

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]
OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
}
# Port 9 (discard) is closed on loopback: the API path gets "connection refused".
NO_SERVER = "http://127.0.0.1:9"
# Long enough that `status` and `stop` (two Python start-ups, seconds each on
# a busy machine) surely land while it sleeps.
SLOW_COMMAND = "sleep 15 && touch after.txt"


def rows(db: Path, sql: str, *params: Any) -> list[sqlite3.Row]:
    # A second reader of the live store, as `stop` and `status` are.
    with sqlite3.connect(db, timeout=10) as conn:
        conn.row_factory = sqlite3.Row
        return conn.execute(sql, params).fetchall()


def poll(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def running_pipeline(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """A real `run` whose first child (the architect) runs SLOW_COMMAND."""
    work = tmp_path / "work"
    (work / "roles").mkdir(parents=True)
    # An operator's role file (first in the lookup order) gives the architect
    # run_command, so the pipeline's first child is the one running a command.
    (work / "roles" / "architect.md").write_text(
        "---\nname: architect\ndescription: designs\nmodel: default\n"
        "tools: [run_command]\nmax_turns: 4\ntimeout: 60\n---\nDesign it.\n"
    )
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"tool_calls": [{"name": "run_command", "arguments": {"command": SLOW_COMMAND}}]},
                {"text": "Design done.\nTASK_DONE"},
            ]
        )
    )
    db = tmp_path / "orchestrator.db"
    process = subprocess.Popen(
        [*CLI, "run", "Build it", "--store", str(db), "--workdir", str(work)],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **OFFLINE, "A2A_MODEL_SCRIPT": str(script)},
    )
    try:
        yield process, db, work
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def test_stop_signals_the_live_run_which_aborts_its_child(tmp_path: Path) -> None:
    with running_pipeline(tmp_path) as (process, db, work):

        def command_started() -> Any:
            try:
                found = rows(
                    db,
                    "SELECT session_id, child_id FROM events WHERE kind = 'tool_called' "
                    "AND payload LIKE '%run_command%'",
                )
            except sqlite3.OperationalError:
                return None  # the run has not created its store yet
            return found[0] if found else None

        started = poll(command_started, 30, "the child to start its command")
        command_at = time.monotonic()
        session, child = started["session_id"], started["child_id"]
        status = cli("status", "--store", str(db), cwd=work)
        stop = cli("stop", session, "--store", str(db), "--server", NO_SERVER, cwd=work)
        out, err = process.communicate(timeout=20)
        # Until nothing of the command runs, at most past the time it would
        # have touched its file: a survivor would touch it.
        until_none_blocking(
            lambda: journaled_processes(db) + running_with_text(SLOW_COMMAND),
            command_at + 16.5 - time.monotonic(),
        )
        record = rows(db, "SELECT * FROM children WHERE child_id = ?", child)[0]
        runner = rows(db, "SELECT * FROM runners WHERE session_id = ?", session)[0]
        kinds = [r["kind"] for r in rows(db, "SELECT kind FROM events WHERE child_id = ?", child)]
    assert f"pid {process.pid} on {socket.gethostname()}: live" in status.stdout
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert f"stopped 1 (by its runner, pid {process.pid}" in stop.stdout
    # The run noticed, cancelled its pipeline, and failed as a stopped run does.
    assert process.returncode == 1, out + err
    assert "stopped by `a2a-orchestrator stop`" in out
    assert "architect pass: cancelled" in out and "TASK_DONE" not in out
    assert (record["status"], record["reason"]) == ("failed", "aborted")
    assert kinds[-1] == "failed" and "done" not in kinds
    # The runner itself carried out the request and confirmed it, then ended.
    assert runner["stop_request"] and runner["stop_confirmed"] == runner["stop_request"]
    assert runner["stopped"] == 1 and runner["ended_at"] is not None
    assert runner["stop_signal"] == signal.SIGUSR1  # `run` listens, so stop woke it at once
    # Only the architect ever ran, and its command was killed before it finished.
    assert len(rows(db, "SELECT * FROM children")) == 1
    assert not (work / "after.txt").exists()


async def _session_with_a_running_child(db: Path, runner: RunnerRecord) -> None:
    store = Store(db)
    await store.create_session("s1", title="stop me")
    await store.add_child(
        ChildRecord(
            child_id="c1",
            session_id="s1",
            role="coder",
            status="running",
            transport="local",
            trace_id="t",
            created_at=time.time(),
        )
    )
    await store.put_runner(runner)
    store.close()


def runner_row(pid: int, **changes: Any) -> RunnerRecord:
    values: dict[str, Any] = dict(
        session_id="s1",
        token="token-1",
        pid=pid,
        host=socket.gethostname(),
        boot_id=boot_id(),
        start_ticks=start_ticks(pid),
        started_at=time.time(),
        heartbeat_at=time.time(),
    )
    values.update(changes)
    return RunnerRecord(**values)


@pytest.mark.anyio
async def test_a_dead_runner_leaves_nothing_running_so_stop_marks_aborted(
    tmp_path: Path,
) -> None:
    # A runner that crashed: its pid is dead (a process that ran and exited),
    # though its last heartbeat is recent.
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    db = tmp_path / "o.db"
    with anyio.fail_after(60):
        await _session_with_a_running_child(db, runner_row(gone.pid, start_ticks=12345))
        stop = await anyio.to_thread.run_sync(
            lambda: cli("stop", "s1", "--store", str(db), "--server", NO_SERVER, cwd=tmp_path)
        )
    assert stop.returncode == 0, stop.stderr
    assert "no live runner; marked 1 children aborted" in stop.stdout
    record = rows(db, "SELECT status, reason FROM children WHERE child_id = 'c1'")[0]
    assert (record["status"], record["reason"]) == ("failed", "aborted")
    assert [r["kind"] for r in rows(db, "SELECT kind FROM events WHERE child_id = 'c1'")] == [
        "failed"
    ]


@pytest.mark.anyio
async def test_a_runner_on_another_host_is_not_stopped_from_here(tmp_path: Path) -> None:
    # A second machine sharing the store cannot be had in a test, so the row
    # names another host; everything else about it looks alive (a fresh
    # heartbeat, and even a live pid here), which stop must not be fooled by:
    # that pid on this host is some other process.
    db = tmp_path / "o.db"
    with anyio.fail_after(60):
        await _session_with_a_running_child(db, runner_row(os.getpid(), host="build-box-2.example"))
        stop = await anyio.to_thread.run_sync(
            lambda: cli("stop", "s1", "--store", str(db), "--server", NO_SERVER, cwd=tmp_path)
        )
    assert stop.returncode == 1
    assert "build-box-2.example" in stop.stderr and "nothing was recorded" in stop.stderr
    assert rows(db, "SELECT status FROM children WHERE child_id = 'c1'")[0]["status"] == "running"
    assert rows(db, "SELECT * FROM events") == []
    assert rows(db, "SELECT stop_request FROM runners")[0]["stop_request"] in (None, "")


@pytest.mark.anyio
async def test_a_live_runner_that_does_not_confirm_is_reported_not_recorded(
    tmp_path: Path,
) -> None:
    # A live process on this host that is not a session runner (it never reads
    # the store), recorded as one that takes no signal: stop must wait, then
    # say it could not stop it, and take its request back.
    sleeper = subprocess.Popen(["sleep", "60"])
    db = tmp_path / "o.db"
    try:
        with anyio.fail_after(60):
            await _session_with_a_running_child(db, runner_row(sleeper.pid))
            stop = await anyio.to_thread.run_sync(
                lambda: cli(
                    "stop",
                    "s1",
                    "--store",
                    str(db),
                    "--server",
                    NO_SERVER,
                    "--wait",
                    "1",
                    cwd=tmp_path,
                )
            )
        alive = sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
    assert stop.returncode == 1
    assert "did not confirm the stop within 1 s" in stop.stderr
    assert alive  # no signal was sent to a process whose row does not ask for one
    assert rows(db, "SELECT status FROM children WHERE child_id = 'c1'")[0]["status"] == "running"
    assert rows(db, "SELECT * FROM events") == []
    assert rows(db, "SELECT stop_request FROM runners")[0]["stop_request"] == ""


def _started_command(db: Path) -> Any:
    try:
        found = rows(
            db,
            "SELECT session_id, child_id FROM events WHERE kind = 'tool_called' "
            "AND payload LIKE '%run_command%'",
        )
    except sqlite3.OperationalError:
        return None  # the run has not created its store yet
    return found[0] if found else None


@pytest.mark.parametrize("runner", ["live", "killed"])
def test_resume_after_stop_starts_the_stopped_pass_again(runner: str, tmp_path: Path) -> None:
    """Issue 25: `resume` after `stop` refused ("the pipeline had failed").
    A stop that reached the live run, and one that found its runner dead and
    marked the child aborted, both leave a pipeline `resume` continues."""
    with running_pipeline(tmp_path) as (process, db, work):
        started = poll(lambda: _started_command(db), 30, "the child to start its command")
        session, stopped_child = started["session_id"], started["child_id"]
        if runner == "killed":
            process.kill()  # a crash: nothing of the run records the stop
            process.wait(timeout=10)
        stop = cli("stop", session, "--store", str(db), "--server", NO_SERVER, cwd=work)
        out, _ = process.communicate(timeout=20)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    if runner == "live":
        assert f"a2a-orchestrator resume {session}` continues it" in out
    # Every pass answers at once now (the slow command is not asked again).
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps([{"text": "Done.\nTASK_DONE"}]))
    resume = cli(
        "resume", session[:8], "--store", str(db), cwd=work, env={"A2A_MODEL_SCRIPT": str(quick)}
    )
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "the pipeline was stopped; its architect pass starts again" in resume.stdout
    assert "signal: TASK_DONE" in resume.stdout
    children = rows(db, "SELECT child_id, role, status, reason FROM children ORDER BY created_at")
    # The stopped child stays as it ended; a new architect did the pass.
    assert [(c["role"], c["status"]) for c in children] == [
        ("architect", "failed"),
        ("architect", "completed"),
        ("coder", "completed"),
        ("reviewer", "completed"),
    ]
    assert children[0]["child_id"] == stopped_child and children[0]["reason"] == "aborted"


def test_resume_of_a_failed_pipeline_says_what_to_run(tmp_path: Path) -> None:
    script = tmp_path / "broken.json"
    script.write_text(json.dumps([{"error": "the endpoint is down"}]))
    run = cli("run", "Build it", cwd=tmp_path, env={"A2A_MODEL_SCRIPT": str(script)})
    assert run.returncode == 1, run.stdout + run.stderr
    session = run.stdout.split("session ", 1)[1].split()[0]
    resume = cli("resume", session, cwd=tmp_path)
    assert resume.returncode == 1
    assert "nothing to resume: the pipeline had failed: architect pass" in resume.stdout
    assert 'its task can run again as a new session: a2a-orchestrator run "Build it"' in (
        resume.stdout
    )


@pytest.mark.anyio
async def test_resume_of_a_stopped_parent_session_says_how_to_carry_on(tmp_path: Path) -> None:
    """A parent run's stopped children are not resumed (a stop is for good):
    `resume` says so and names the run that gives the parent a new turn,
    which then works."""
    db = tmp_path / "o.db"
    store = Store(db)
    await store.create_session("s1", title="delegate it")
    await store.add_child(
        ChildRecord(
            child_id="c1",
            session_id="s1",
            role="coder",
            status="failed",
            reason="aborted",
            transport="local",
            trace_id="t",
            created_at=time.time(),
        )
    )
    store.close()

    def resume_then_carry_on() -> tuple[subprocess.CompletedProcess[str], ...]:
        resume = cli("resume", "s1", "--store", str(db), cwd=tmp_path)
        hint = resume.stdout.rsplit("a2a-orchestrator ", 1)[1].split()
        assert hint[:5] == ["run", "--parent", "--session", "s1", "--append"], resume.stdout
        carry_on = cli(
            "run",
            "--parent",
            "--session",
            "s1",
            "--append",
            "go on",
            "--store",
            str(db),
            cwd=tmp_path,
        )
        return resume, carry_on

    with anyio.fail_after(120):
        resume, carry_on = await anyio.to_thread.run_sync(resume_then_carry_on)
    assert resume.returncode == 0
    assert "nothing to resume: every child had finished" in resume.stdout
    assert "1 of them stopped (aborted)" in resume.stdout
    # The offline parent skips the task: its signal, TASK_SKIPPED, is the exit code.
    assert carry_on.returncode == 3, carry_on.stdout + carry_on.stderr
    inputs = rows(db, "SELECT payload FROM events WHERE kind = 'input' AND child_id IS NULL")
    assert [json.loads(r["payload"])["text"] for r in inputs] == ["go on"]


def test_hints_name_the_whole_session_id(tmp_path: Path) -> None:
    """The commands a hint gives name the session whole: eight characters of
    a named session ("issue-25-b") are another session's id ("issue-25"),
    which `resume` or `run --append` would then take."""
    db = tmp_path / "o.db"
    store = Store(db)

    async def make() -> None:
        for session_id, status, reason in [
            ("issue-25", "completed", ""),
            ("issue-25-b", "failed", "aborted"),
            ("issue-25-c", "running", ""),
        ]:
            await store.create_session(session_id, title="delegate it")
            await store.add_child(
                ChildRecord(
                    child_id=f"{session_id}-c1",
                    session_id=session_id,
                    role="coder",
                    status=status,
                    reason=reason,
                    transport="local",
                    trace_id="t",
                    created_at=time.time(),
                )
            )
        store.close()

    anyio.run(make)
    resume = cli("resume", "issue-25-b", "--store", str(db), cwd=tmp_path)
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert "run --parent --session issue-25-b --append" in resume.stdout
    again = cli("run", "again", "--session", "issue-25-c", "--store", str(db), cwd=tmp_path)
    assert again.returncode == 2
    assert "`a2a-orchestrator resume issue-25-c` continues it" in again.stderr
