"""`demo`: it never writes over a person's files, can be watched on a terminal,
starts only the servers it uses, and ends saying what to run next (issue 25)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from support.cli import OFFLINE, cli

from a2a_orchestrator.orchestrator.demo import DEMO_ROLES, TERMINAL_PACE, paced_model

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]


def test_a_directory_with_files_is_refused_and_left_alone(tmp_path: Path) -> None:
    work = tmp_path / "mine"
    work.mkdir()
    (work / "README.md").write_text("my own notes\n")
    result = cli("demo", "--workdir", str(work), cwd=tmp_path)
    assert result.returncode == 2
    assert f"--workdir {work} is not empty" in result.stderr
    assert "leave --workdir out" in result.stderr
    assert [p.name for p in work.iterdir()] == ["README.md"]
    assert (work / "README.md").read_text() == "my own notes\n"


def test_a_pipe_gets_every_event_the_servers_used_and_what_to_run_next(tmp_path: Path) -> None:
    work = tmp_path / "empty"
    work.mkdir()  # an empty directory is fine
    result = cli("demo", "--workdir", str(work), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    servers = re.findall(r"^  (\w+)\s+A2A server at", out, flags=re.MULTILINE)
    assert servers == list(DEMO_ROLES) == ["architect", "coder", "reviewer"]  # no observer
    session = re.search(r"session ([0-9a-f]{8})", out).group(1)  # type: ignore[union-attr]
    store = work / ".a2a" / "orchestrator.db"
    assert f"a2a-orchestrator status --store {store}" in out
    assert f"a2a-orchestrator events {session} --store {store}" in out
    assert f"a2a-orchestrator serve orchestrator --workdir {work}" in out
    assert "http://127.0.0.1:9100/ui" in out
    assert "A2A_MODEL_BASE_URL" in out.split("What it left", 1)[1]  # a real model, last
    # What it says to run works.
    status = cli("status", "--store", str(store), cwd=tmp_path)
    assert status.returncode == 0 and "TASK_DONE" in status.stdout
    assert "Add slugify to textkit" in status.stdout  # the session has its title


def test_pace_holds_each_turn(tmp_path: Path) -> None:
    async def first_item(pace: float) -> float:
        model = paced_model("architect", pace)
        started = time.monotonic()
        with anyio.fail_after(10):
            async for _item in model.stream([{"role": "user", "content": "go"}], []):
                break
        return time.monotonic() - started

    assert anyio.run(first_item, 0.5) >= 0.5
    assert anyio.run(first_item, 0.0) < 0.5
    assert paced_model("coder", 0.5).name == paced_model("coder", 0).name == "scripted:coder"
    refused = cli("demo", "--pace", "-1", cwd=tmp_path)
    assert refused.returncode == 2 and "--pace" in refused.stderr


@pytest.mark.timeout(180)
def test_a_terminal_gets_the_event_lines_above_the_tree_at_a_pace(tmp_path: Path) -> None:
    # stdout a pseudo-terminal, as a person's: the live tree, a default pace,
    # and the event lines a pipe gets.
    leader, follower = os.openpty()
    started = time.monotonic()
    process = subprocess.Popen(
        [*CLI, "demo", "--workdir", str(tmp_path / "demo")],
        stdout=follower,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, **OFFLINE, "COLUMNS": "160"},
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the process closed its end
            break
        if not chunk:
            break
        shown += chunk
    process.wait(timeout=120)
    elapsed = time.monotonic() - started
    os.close(leader)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    assert process.returncode == 0, text[-2000:]
    assert "[architect " in text and "] calls list_files" in text
    assert "[coder " in text and "] calls write_file textkit/slug.py" in text
    assert "What it left" in text
    # Each model turn of the recorded scenario was held (a dozen and more of them).
    assert elapsed >= 12 * TERMINAL_PACE
