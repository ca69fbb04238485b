"""The long-running commands set the garbage collector (heap.py); a library
caller keeps its own. Each check runs in a fresh process: the settings are
the process's, and pytest's own must stay CPython's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from support.cli import CLI, OFFLINE

from a2a_orchestrator.cli.heap import THRESHOLDS

SETTLED = re.compile(
    r"garbage collector: (\d+) start-up objects frozen, thresholds \(10000, 10, 10\)"
)


def python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_settle_freezes_start_up_and_collects_the_young_less_often() -> None:
    out = python(
        "import gc\n"
        "from a2a_orchestrator.delegation.session import Session\n"
        "print(gc.get_threshold(), gc.get_freeze_count())\n"
        "from a2a_orchestrator.cli.heap import settle\n"
        "settle()\n"
        "print(gc.get_threshold(), gc.get_freeze_count())\n"
    )
    before, after = out.splitlines()
    assert before == "(700, 10, 10) 0"
    threshold, frozen = after.rsplit(" ", 1)
    assert threshold == str(THRESHOLDS)
    # Everything the imports made is frozen: tens of thousands of objects.
    assert int(frozen) > 20_000


def test_a_library_caller_keeps_cpythons_settings() -> None:
    out = python(
        "import gc\n"
        "import a2a_orchestrator, a2a_orchestrator.delegation.session\n"
        "import a2a_orchestrator.server.app\n"
        "print(gc.get_threshold(), gc.get_freeze_count())\n"
    )
    assert out == "(700, 10, 10) 0"


def test_run_settles_the_collector_once_it_has_imported(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CLI, "-v", "run", "Add a hello module"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, **OFFLINE},
    )
    assert result.returncode == 3, result.stdout + result.stderr
    match = SETTLED.search(result.stderr)
    assert match, result.stderr
    # After the session's imports, not before: far more than the parser's.
    assert int(match.group(1)) > 60_000


def test_serve_settles_the_collector_before_it_serves(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [*CLI, "-v", "serve", "coder", "--port", "0", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env={**os.environ, **OFFLINE},
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert "serving A2A at" in first, first
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 0, err
    match = SETTLED.search(err)
    assert match, err
    assert int(match.group(1)) > 60_000
