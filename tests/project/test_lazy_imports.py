"""Light entry points stay light: importing the package, `--help` and `status`
do not load the SDK's server side, SQLAlchemy, openai, uvicorn, starlette or
OpenTelemetry.

Each case runs in a fresh interpreter (a subprocess), because this test
process has long since imported everything; the child reports which of those
packages ended up in its `sys.modules`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio

from a2a_orchestrator.storage.store import Store

HEAVY = ("openai", "a2a.server", "sqlalchemy", "uvicorn", "starlette", "opentelemetry")

# Runs `code`, then prints the heavy packages loaded as a JSON list on the last line.
_PROBE = """
import contextlib, io, json, sys
out = io.StringIO()
with contextlib.redirect_stdout(out):
{code}
heavy = {heavy!r}
loaded = sorted({{h for h in heavy for m in sys.modules if m == h or m.startswith(h + ".")}})
print(out.getvalue())
print(json.dumps(loaded))
"""


def loaded_after(code: str, cwd: Path) -> tuple[list[str], str]:
    """The heavy packages a fresh interpreter holds after running `code`, and what it printed."""
    body = "\n".join("    " + line for line in code.strip().splitlines())
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code=body, heavy=HEAVY)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    *printed, last = done.stdout.rstrip("\n").splitlines()
    return json.loads(last), "\n".join(printed)


def test_importing_the_package_and_the_cli_loads_no_server_side(tmp_path: Path) -> None:
    loaded, _ = loaded_after("import a2a_orchestrator, a2a_orchestrator.cli", tmp_path)
    assert loaded == []


def test_help_loads_no_server_side(tmp_path: Path) -> None:
    code = """
from a2a_orchestrator.cli import main
try:
    main(["--help"])
except SystemExit as exit:
    assert exit.code == 0, exit.code
"""
    loaded, printed = loaded_after(code, tmp_path)
    assert "usage: a2a-orchestrator" in printed
    assert loaded == []


def test_status_loads_no_server_side(tmp_path: Path) -> None:
    async def make() -> None:
        store = Store(tmp_path / "orchestrator.db")
        try:
            await store.create_session("lazy-check", title="a session to list")
        finally:
            store.close()

    anyio.run(make)
    code = """
from a2a_orchestrator.cli import main
assert main(["status", "--store", "orchestrator.db"]) == 0
"""
    loaded, printed = loaded_after(code, tmp_path)
    assert "lazy-check" in printed
    assert loaded == []


def test_exported_names_still_load_what_they_need(tmp_path: Path) -> None:
    # The other side of laziness: the probe does see the server side once a
    # name that needs it is used, so the empty lists above mean something.
    code = """
import a2a_orchestrator
assert a2a_orchestrator.build_app.__name__ == "build_app"
assert a2a_orchestrator.OpenAIModel.__name__ == "OpenAIModel"
"""
    loaded, _ = loaded_after(code, tmp_path)
    assert {"a2a.server", "openai", "starlette"} <= set(loaded)
