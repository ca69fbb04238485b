"""The command line: help texts, and `serve` as a real subprocess."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import get_args

import anyio
import httpx
import pytest
from a2a.types import GetTaskRequest, SendMessageConfiguration, TaskState
from support.cli import CLI, OFFLINE, cli, subcommands
from support.messages import user_message
from support.ports import free_ports
from support.servers import a2a_client, serve_process

from a2a_orchestrator.cli import main
from a2a_orchestrator.cli.defaults import EXIT_CODES
from a2a_orchestrator.cli.parser import build_parser
from a2a_orchestrator.control.pipeline import Signal


def test_every_signal_has_its_exit_code() -> None:
    assert set(EXIT_CODES) == set(get_args(Signal))
    assert 2 not in EXIT_CODES.values()  # bad usage or configuration


def test_every_command_has_help_text() -> None:
    parser = build_parser()
    commands = subcommands(parser)
    assert "serve" in commands
    helps = {a.dest: a.help for a in parser._actions if isinstance(a, argparse._SubParsersAction)}
    assert helps
    for name, sub in commands.items():
        assert sub.description, f"{name} has no description"
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.dest} has no help"
    out = subprocess.run([*CLI, "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "--workdir" in out.stdout and "agent-card.json" in out.stdout


def test_unknown_role_is_a_clear_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["serve", "nosuchrole", "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Unknown role 'nosuchrole'" in err and "coder" in err and "Traceback" not in err


def test_missing_workdir_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["serve", "coder", "--workdir", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_serve_shows_card_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    # No model configured: the server says plainly the model is scripted.
    env = {
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
    }
    with serve_process(tmp_path, "coder", env=env) as (process, url, banner):
        card = httpx.get(url + "/.well-known/agent-card.json", timeout=10).json()
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=20)
    assert card["name"] == "coder"
    assert process.returncode == 0
    assert "coder: stopped" in out
    assert "scripted (offline)" in banner and "A2A_MODEL_BASE_URL" in banner


@pytest.mark.anyio
async def test_sigterm_fails_running_tasks_and_they_stay_failed(tmp_path: Path) -> None:
    script = tmp_path / "slow.json"
    script.write_text(json.dumps([{"text": "never", "delay": 60}]))
    env = {
        "A2A_MODEL_SCRIPT": str(script),
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
    }
    db = tmp_path / "tasks.db"
    with anyio.fail_after(40):
        with serve_process(tmp_path, "coder", "--db", str(db), env=env) as (process, url, _):
            async with a2a_client(url, streaming=False) as client:
                request = user_message("take your time")
                request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
                async for response in client.send_message(request):
                    task_id = response.task.id
                    break
            process.send_signal(signal.SIGTERM)
            await anyio.to_thread.run_sync(lambda: process.wait(20))
            assert process.returncode == 0
        with serve_process(tmp_path, "coder", "--db", str(db), env=env) as (process, url, _):
            async with a2a_client(url) as client:
                task = await client.get_task(GetTaskRequest(id=task_id))
            process.send_signal(signal.SIGTERM)
    assert task.status.state == TaskState.TASK_STATE_FAILED
    assert "shut down" in task.status.message.parts[0].text


def test_demo_runs_offline_end_to_end(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    result = cli("demo", "--workdir", str(work), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "scripted model" in result.stdout and "A2A_MODEL_BASE_URL" in result.stdout
    assert "signal: TASK_DONE" in result.stdout
    artifacts = work / ".a2a" / "tasks" / "T1-add-slugify-to-textkit-multiagent"
    assert sorted(p.name for p in artifacts.iterdir()) == [
        "architect.txt",
        "coder.txt",
        "reviewer.txt",
    ]
    assert str(artifacts) in result.stdout
    # The coder's tests really ran and pass.
    check = subprocess.run(
        [sys.executable, "-m", "unittest", "discover", "-s", "tests", "-t", "."],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0 and "Ran 7 tests" in check.stderr


def test_demo_runs_where_bubblewrap_cannot(tmp_path: Path) -> None:
    """A fresh machine may lack bubblewrap: the demo's commands come from its
    shipped script, not a model, so it runs them unsandboxed and says so."""
    # PATH with everything of /usr/bin but bwrap (faking a machine without it).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in Path("/usr/bin").iterdir():
        if program.name != "bwrap":
            (bin_dir / program.name).symlink_to(program)
    path = os.pathsep.join([str(Path(sys.executable).parent), str(bin_dir)])
    work = tmp_path / "demo"
    result = subprocess.run(
        [*CLI, "demo", "--workdir", str(work)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, **OFFLINE, "PATH": path},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sandbox: none (bubblewrap is not installed" in result.stdout
    assert "signal: TASK_DONE" in result.stdout
    # Elsewhere the refusal stands: a role server that runs a model's commands.
    serve = subprocess.run(
        [*CLI, "serve", "coder", "--port", "0", "--workdir", str(work)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        env={**os.environ, **OFFLINE, "PATH": path},
    )
    assert serve.returncode == 2 and "apt-get install bubblewrap" in serve.stderr


def test_run_then_inspect_the_session(tmp_path: Path) -> None:
    run = cli("run", "Add a hello module", cwd=tmp_path)
    # No model configured: every role says so and skips; the exit code is the signal.
    assert run.returncode == 3, run.stdout + run.stderr
    assert "model: scripted (offline)" in run.stdout and "signal: TASK_SKIPPED" in run.stdout
    session = re.search(r"session ([0-9a-f]{32})", run.stdout).group(1)  # type: ignore[union-attr]
    status = cli("status", cwd=tmp_path)
    children = cli("children", session, cwd=tmp_path)
    events = cli("events", session, cwd=tmp_path)
    jsonl = cli("events", session, "--jsonl", cwd=tmp_path)
    stop = cli("stop", session, "--server", "http://127.0.0.1:9", cwd=tmp_path)
    resume = cli("resume", session, cwd=tmp_path)
    missing = cli("children", "nope", cwd=tmp_path)
    assert session in status.stdout and "3 completed" in status.stdout
    header, *rows, total = children.stdout.splitlines()
    assert header.split() == ["CHILD", "AGENT", "STATUS", "WHERE", "USAGE", "RESULT"]
    assert [line.split()[1] for line in rows] == ["architect", "coder", "reviewer"]
    assert total.startswith("session total: ")
    assert "started" in events.stdout and "done" in events.stdout
    lines = [json.loads(line) for line in jsonl.stdout.splitlines()]
    kinds = [line["kind"] for line in lines]
    assert kinds[0] == "input" and kinds.count("done") == 3 and kinds[-1] == "subagent_result"
    assert stop.returncode == 0 and "stopped 0" in stop.stdout
    # The pipeline had ended: resume says so and exits with its signal again.
    assert resume.returncode == 3 and "nothing to resume" in resume.stdout
    assert missing.returncode == 2 and "no session 'nope'" in missing.stderr


def test_up_starts_the_network_and_stops_it(tmp_path: Path) -> None:
    ports = free_ports(5)
    agents = tmp_path / "agents"
    agents.mkdir()
    for name, port in zip(("architect", "coder", "reviewer", "observer"), ports, strict=False):
        (agents / f"{name}.toml").write_text(f'name = "{name}"\nrole = "{name}"\nport = {port}\n')
    process = subprocess.Popen(
        [*CLI, "up", "--port", str(ports[4]), "--workdir", str(tmp_path)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **OFFLINE},
    )
    try:
        assert process.stdout is not None
        lines = []
        while not lines or "network up" not in lines[-1]:
            line = process.stdout.readline()
            assert line, process.stderr.read() if process.stderr else ""
            lines.append(line)
        cards = {
            port: httpx.get(
                f"http://127.0.0.1:{port}/.well-known/agent-card.json", timeout=5
            ).json()["name"]
            for port in ports
        }
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=40)
    finally:
        if process.poll() is None:
            process.kill()
    assert sorted(cards.values()) == ["architect", "coder", "observer", "orchestrator", "reviewer"]
    assert f"http://127.0.0.1:{ports[4]}/ui\n" in "".join(lines)  # the web view
    assert process.returncode == 0 and "network stopped" in out
    for port in ports:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/.well-known/agent-card.json", timeout=2)


def test_run_reads_reactions_and_hooks_from_the_work_directory(tmp_path: Path) -> None:
    (tmp_path / ".a2a").mkdir()
    (tmp_path / ".a2a" / "reactions.toml").write_text("[[reaction]]\nsignal = 'explode'\n")
    bad_reactions = cli("run", "anything", cwd=tmp_path)
    (tmp_path / ".a2a" / "reactions.toml").unlink()
    (tmp_path / ".a2a" / "hooks.toml").write_text(
        "[[hook]]\non = 'spawn.never'\ncommand = 'true'\n"
    )
    bad_hooks = cli("run", "anything", cwd=tmp_path)
    assert bad_reactions.returncode == 2 and "reactions.toml: reaction 1" in bad_reactions.stderr
    assert bad_hooks.returncode == 2 and "hooks.toml: hook 1" in bad_hooks.stderr


def test_run_parent_with_the_observer_role_offline(tmp_path: Path) -> None:
    result = cli("run", "Watch a coder", "--parent", "--role", "observer", cwd=tmp_path)
    # Offline, the observer's model is the scripted notice, which skips.
    assert result.returncode == 3, result.stdout + result.stderr
    assert "[observer] started" in result.stdout and "TASK_SKIPPED" in result.stdout


def test_bad_input_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy_port = taken.getsockname()[1]
    try:
        cases = {
            "session": cli("run", "x", "--session", "/tmp/escape", cwd=tmp_path),
            "role": cli("run", "x", "--parent", "--role", "nosuch", cwd=tmp_path),
            "port": cli("serve", "coder", "--port", "70000", cwd=tmp_path),
            "db": cli("serve", "coder", "--port", "0", "--db", "postgresql://h/db", cwd=tmp_path),
            "busy": cli("serve", "coder", "--port", str(busy_port), cwd=tmp_path),
        }
    finally:
        taken.close()
    expected = {
        "session": "session id '/tmp/escape'",
        "role": "Unknown role 'nosuch'",
        "port": "port 70000 is not in 0..65535",
        "db": "task store URL 'postgresql://h/db' cannot be used",
        "busy": f"cannot listen on 127.0.0.1:{busy_port}",
    }
    for name, result in cases.items():
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert expected[name] in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.stderr, name
    assert not Path("/tmp/escape-x-multiagent").exists()


def test_stop_never_acts_behind_a_server_that_refuses(tmp_path: Path) -> None:
    env = {**OFFLINE, "A2A_AUTH_TOKEN": "s3cret"}
    with serve_process(tmp_path, "orchestrator", env=env) as (process, url, banner):
        # The banner says where the web view is, and how to get in.
        assert f"  web view: {url}/ui  (log in with a caller token)\n" in banner, banner
        refused = subprocess.run(
            [*CLI, "stop", "some-session", "--server", url],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
            env={**os.environ, **OFFLINE, "A2A_AUTH_TOKEN": ""},
        )
        allowed = subprocess.run(
            [*CLI, "stop", "some-session", "--server", url],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=30,
            env={**os.environ, **env},
        )
        process.send_signal(signal.SIGTERM)
    assert refused.returncode == 2 and "answered 401" in refused.stderr
    # With the token the server answers; an unknown session there is a 404,
    # and the store here has none either.
    assert allowed.returncode == 2 and "no session 'some-session'" in allowed.stderr


@pytest.mark.anyio
async def test_events_shows_every_kind_of_record(tmp_path: Path) -> None:
    from a2a_orchestrator.storage.store import Store

    store = Store(tmp_path / ".a2a" / "orchestrator.db")
    await store.create_session("s1", title="records")
    await store.append_event("s1", "input", {"text": "do it"}, child_id="c1")
    await store.append_event(
        "s1", "started", {"kind": "started", "role": "coder", "model": "m"}, child_id="c1"
    )
    await store.append_event("s1", "control", {"action": "pause"}, child_id="c1")
    await store.append_event("s1", "inject", {"text": "coder failed"})
    await store.append_event("s1", "inject_failed", {"error": "bad template"})
    store.close()
    result = cli("events", "s1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(maxsplit=2)[2] for line in lines] == [
        "input: do it",
        "started (m)",
        "control: pause",
        "inject: coder failed",
        "inject_failed: bad template",
    ]
