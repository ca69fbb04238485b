"""Tools against real directories and real subprocesses."""

from __future__ import annotations

import contextlib
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.tools import call

from a2a_orchestrator.errors import ConfigError, PathOutsideWorkdirError, ToolError
from a2a_orchestrator.tools import TOOL_NAMES, Tool, Workspace, build_tools
from a2a_orchestrator.tools.base import CallScope, current_call
from a2a_orchestrator.tools.command import run_command_tool
from a2a_orchestrator.tools.files import grep_tool, list_files_tool, read_file_tool
from a2a_orchestrator.tools.procs import marked_processes

pytestmark = pytest.mark.anyio

SECRET = "TOP-SECRET-OUTSIDE"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text(f"{SECRET}\n")
    return d


@pytest.fixture
def tools(ws: Workspace) -> dict[str, Tool]:
    return {t.name: t for t in build_tools(TOOL_NAMES, ws)}


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


async def read_pid(path: Path) -> int:
    apath = anyio.Path(path)
    while True:
        text = await apath.read_text() if await apath.exists() else ""
        if text.strip():
            return int(text)
        await anyio.sleep(0.02)


# --- workspace ---------------------------------------------------------------


def test_workspace_uses_the_real_root(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    ws = Workspace(tmp_path / "alias")
    assert ws.root == real.resolve()
    assert ws.resolve("a/b.txt") == real.resolve() / "a" / "b.txt"
    assert ws.relative(ws.resolve("a/b.txt")) == "a/b.txt"
    assert ws.relative(ws.root) == "."
    # An absolute path through the alias still lands inside the real root.
    assert ws.resolve(str(tmp_path / "alias" / "x")) == real.resolve() / "x"


def test_workspace_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Workspace(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        Workspace(tmp_path / "file")


def test_resolve_refuses_escapes(ws: Workspace, outside: Path) -> None:
    (ws.root / "link").symlink_to(outside / "secret.txt")
    (ws.root / "dirlink").symlink_to(outside)
    for path in (
        "../outside/secret.txt",
        "a/../../outside",
        str(outside / "secret.txt"),
        "link",
        "dirlink/secret.txt",
        "dirlink/new.txt",
    ):
        with pytest.raises(PathOutsideWorkdirError) as info:
            ws.resolve(path)
        assert repr(path) in str(info.value)
        assert "outside the work directory" in str(info.value)
    # `..` that stays inside is fine.
    assert ws.resolve("a/../b") == ws.root / "b"


# --- read_file ---------------------------------------------------------------


async def test_read_file(tools: dict[str, Tool], ws: Workspace) -> None:
    (ws.root / "f.txt").write_text("one\ntwo\nthree\nfour\n")
    assert await call(tools["read_file"], path="f.txt") == "one\ntwo\nthree\nfour\n"
    out = await call(tools["read_file"], path="f.txt", offset=2, limit=2)
    assert out.startswith("two\nthree\n")
    assert "continue with offset=4" in out
    assert await call(tools["read_file"], path="f.txt", offset=4) == "four\n"
    assert "has 4 lines" in await call(tools["read_file"], path="f.txt", offset=9)


async def test_read_file_is_bounded(ws: Workspace) -> None:
    (ws.root / "big.txt").write_text("".join(f"line {i:04}\n" for i in range(1, 101)))
    tool = read_file_tool(ws, max_bytes=100)  # 10 lines of 10 bytes
    out = await call(tool, path="big.txt")
    assert out.startswith("line 0001\n")
    assert "line 0010\n" in out and "line 0011" not in out
    assert "output cut at 100 bytes; continue with offset=11" in out
    assert (await call(tool, path="big.txt", offset=11)).startswith("line 0011\n")
    # One line longer than the bound is cut inside the line.
    (ws.root / "wide.txt").write_text("x" * 500 + "\nnext\n")
    out = await call(tool, path="wide.txt")
    # 400 bytes of the line and "\nnext\n" are not shown.
    note = "\n[line cut at 100 bytes; 406 more bytes in the file; continue with offset=2]"
    assert out == "x" * 100 + note


async def test_read_file_errors(tools: dict[str, Tool], ws: Workspace) -> None:
    (ws.root / "d").mkdir()
    (ws.root / "b.bin").write_bytes(b"\x89PNG\0\0\0")
    with pytest.raises(ToolError, match="does not exist"):
        await call(tools["read_file"], path="nope.txt")
    with pytest.raises(ToolError, match="is a directory"):
        await call(tools["read_file"], path="d")
    with pytest.raises(ToolError, match="binary"):
        await call(tools["read_file"], path="b.bin")
    with pytest.raises(ToolError, match="Missing required argument 'path'"):
        await call(tools["read_file"])


# --- list_files ----------------------------------------------------------------


async def test_list_files(tools: dict[str, Tool], ws: Workspace) -> None:
    for rel in ("b.py", "a.txt", "src/z.py", "src/deep/y.py", ".git/config"):
        (ws.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws.root / rel).write_text("x\n")
    out = await call(tools["list_files"])
    assert out.splitlines() == ["a.txt", "b.py", "src/deep/y.py", "src/z.py"]
    assert (await call(tools["list_files"], pattern="*.py")).splitlines() == ["b.py"]
    assert (await call(tools["list_files"], pattern="**/*.py")).splitlines() == [
        "b.py",
        "src/deep/y.py",
        "src/z.py",
    ]
    assert await call(tools["list_files"], pattern=".git/*") == ".git/config"
    assert "No files match" in await call(tools["list_files"], pattern="*.rs")


async def test_list_files_is_bounded(ws: Workspace) -> None:
    for i in range(5):
        (ws.root / f"f{i}.txt").write_text("x")
    out = await call(list_files_tool(ws, max_results=3), pattern="*")
    assert out.splitlines()[:3] == ["f0.txt", "f1.txt", "f2.txt"]
    assert "2 more files not shown (5 in all)" in out


# --- grep --------------------------------------------------------------------


async def test_grep(tools: dict[str, Tool], ws: Workspace) -> None:
    (ws.root / "src").mkdir()
    (ws.root / "src/a.py").write_text("import os\ndef main():\n    return OS\n")
    (ws.root / "notes.txt").write_text("os is an operating system\n")
    (ws.root / "blob.bin").write_bytes(b"os\0os\n")
    out = await call(tools["grep"], pattern=r"\bos\b")
    assert out.splitlines() == ["notes.txt:1:os is an operating system", "src/a.py:1:import os"]
    out = await call(tools["grep"], pattern=r"\bos\b", glob="**/*.py", ignore_case=True)
    assert out.splitlines() == ["src/a.py:1:import os", "src/a.py:3:    return OS"]
    assert "No matches" in await call(tools["grep"], pattern="zebra")
    with pytest.raises(ToolError, match="Invalid regular expression"):
        await call(tools["grep"], pattern="(unclosed")


async def test_grep_is_bounded(ws: Workspace) -> None:
    (ws.root / "many.txt").write_text("hit\n" * 50)
    out = await call(grep_tool(ws, max_matches=3), pattern="hit")
    assert out.splitlines()[:3] == ["many.txt:1:hit", "many.txt:2:hit", "many.txt:3:hit"]
    assert "stopped after 3 matches" in out
    out = await call(grep_tool(ws, max_bytes=40), pattern="hit")
    assert len(out.splitlines()) == 3  # two 15-byte hits fit, then the note
    assert "stopped after 2 matches" in out


# --- write_file and edit_file ------------------------------------------------


async def test_write_file(tools: dict[str, Tool], ws: Workspace) -> None:
    out = await call(tools["write_file"], path="new/dir/f.txt", content="héllo\n")
    assert out == "Created new/dir/f.txt (7 bytes written)"
    assert (ws.root / "new/dir/f.txt").read_text() == "héllo\n"
    script = ws.root / "run.sh"
    script.write_text("old")
    script.chmod(0o755)
    out = await call(tools["write_file"], path="run.sh", content="#!/bin/sh\n")
    assert out.startswith("Overwrote run.sh")
    assert script.read_text() == "#!/bin/sh\n"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    # The temp file went away with the rename.
    assert names(ws.root) == ["new", "run.sh"]


async def test_edit_file(tools: dict[str, Tool], ws: Workspace) -> None:
    f = ws.root / "f.py"
    f.write_text("a = 1\nb = 2\nb = 2\n")
    out = await call(tools["edit_file"], path="f.py", old_text="a = 1", new_text="a = 10")
    assert out == "Edited f.py: replaced 1 occurrence"
    assert f.read_text() == "a = 10\nb = 2\nb = 2\n"
    with pytest.raises(ToolError, match="not found"):
        await call(tools["edit_file"], path="f.py", old_text="c = 3", new_text="c = 4")
    with pytest.raises(ToolError, match="occurs 2 times"):
        await call(tools["edit_file"], path="f.py", old_text="b = 2", new_text="b = 3")
    assert f.read_text() == "a = 10\nb = 2\nb = 2\n"
    with pytest.raises(ToolError, match="does not exist"):
        await call(tools["edit_file"], path="nope.py", old_text="x", new_text="y")


# --- confinement, tool by tool -----------------------------------------------


def _escapes(ws: Workspace, outside: Path) -> list[str]:
    (ws.root / "link.txt").symlink_to(outside / "secret.txt")
    return ["../outside/secret.txt", str(outside / "secret.txt"), "link.txt"]


async def test_read_write_edit_refuse_paths_outside(
    tools: dict[str, Tool], ws: Workspace, outside: Path
) -> None:
    for path in _escapes(ws, outside):
        calls: list[dict[str, Any]] = [
            {"tool": "read_file", "path": path},
            {"tool": "write_file", "path": path, "content": "pwned"},
            {"tool": "edit_file", "path": path, "old_text": SECRET, "new_text": "pwned"},
        ]
        for args in calls:
            tool = tools[args.pop("tool")]
            with pytest.raises(PathOutsideWorkdirError, match="outside the work directory"):
                await call(tool, **args)
    with pytest.raises(PathOutsideWorkdirError):
        await call(tools["write_file"], path="../outside/new.txt", content="x")
    assert (outside / "secret.txt").read_text() == f"{SECRET}\n"
    assert names(outside) == ["secret.txt"]


async def test_list_and_grep_stay_inside(
    tools: dict[str, Tool], ws: Workspace, outside: Path
) -> None:
    (ws.root / "link.txt").symlink_to(outside / "secret.txt")
    (ws.root / "dirlink").symlink_to(outside)
    (ws.root / "inside.txt").write_text("fine\n")
    (ws.root / "alias.txt").symlink_to(ws.root / "inside.txt")  # inside: allowed
    for pattern in ("../outside/*", str(outside / "*")):
        with pytest.raises(PathOutsideWorkdirError):
            await call(tools["list_files"], pattern=pattern)
        with pytest.raises(PathOutsideWorkdirError):
            await call(tools["grep"], pattern=SECRET, glob=pattern)
    assert (await call(tools["list_files"], pattern="**/*")).splitlines() == [
        "alias.txt",
        "inside.txt",
    ]
    assert await call(tools["list_files"], pattern="dirlink/*") == "No files match 'dirlink/*'."
    for glob in ("**/*", "*", "dirlink/*", "link.txt"):
        out = await call(tools["grep"], pattern=SECRET, glob=glob)
        assert out == f"No matches for {SECRET!r}."


# --- run_command ---------------------------------------------------------------


async def test_run_command(tools: dict[str, Tool], ws: Workspace) -> None:
    out = await call(tools["run_command"], command="pwd; echo out; echo err >&2")
    assert out == f"{ws.root}\nout\nerr\n[exit code 0]"
    assert await call(tools["run_command"], command="true") == "(no output)\n[exit code 0]"


async def test_run_command_nonzero_exit_is_an_error(tools: dict[str, Tool]) -> None:
    with pytest.raises(ToolError) as info:
        await call(tools["run_command"], command="echo boom; exit 3")
    assert "boom" in str(info.value)
    assert "exit code 3" in str(info.value)


async def test_run_command_output_is_bounded(ws: Workspace) -> None:
    tool = run_command_tool(ws, max_output=1000)
    out = await call(
        tool, command="printf START; head -c 100000 /dev/zero | tr '\\0' x; printf END"
    )
    assert out.startswith("START")
    assert out.endswith("END\n[exit code 0]")
    assert f"[{5 + 100000 + 3 - 1000} bytes of output omitted]" in out
    assert len(out) < 1100


@contextlib.contextmanager
def tagged() -> Iterator[str]:
    """Run the block as a tool call whose processes carry a fresh marker.

    Commands run in their own PID namespace, so a pid they print means
    nothing out here; the marker finds their processes from outside.
    """
    marker = uuid.uuid4().hex

    async def record(pgid: int, ticks: int) -> None:
        pass

    token = current_call.set(CallScope(marker=marker, record_process=record))
    try:
        yield marker
    finally:
        current_call.reset(token)


async def test_run_command_timeout_kills_the_process_group(ws: Workspace) -> None:
    tool = run_command_tool(ws, timeout=0.5)
    started = time.monotonic()
    with tagged() as marker, pytest.raises(ToolError, match=r"timed out after 0\.5 s"):
        # Asking for more than the configured maximum still gets the maximum.
        await call(tool, command="sleep 30 & echo $! > pid; wait", timeout=100)
    assert time.monotonic() - started < 5
    assert (ws.root / "pid").exists()
    assert marked_processes(marker) == []


async def test_run_command_sigkills_what_ignores_sigterm(ws: Workspace) -> None:
    tool = run_command_tool(ws, timeout=0.3, grace=0.3)
    started = time.monotonic()
    with tagged() as marker, pytest.raises(ToolError, match="timed out"):
        await call(tool, command="trap '' TERM; sleep 30 & echo $! > pid; wait")
    assert time.monotonic() - started < 5
    assert (ws.root / "pid").exists()
    assert marked_processes(marker) == []


async def test_run_command_leaves_nothing_running(tools: dict[str, Tool], ws: Workspace) -> None:
    # The background job lets go of stdout, so the command "finishes" at once.
    with tagged() as marker:
        out = await call(tools["run_command"], command="sleep 30 >/dev/null 2>&1 & echo $! > pid")
    assert out.endswith("[exit code 0]")
    assert (ws.root / "pid").exists()
    assert marked_processes(marker) == []


@pytest.mark.parametrize("prelude", ["", "trap '' TERM; "], ids=["plain", "ignores-sigterm"])
async def test_run_command_cancelled_kills_the_process_group(ws: Workspace, prelude: str) -> None:
    # A group that ignores SIGTERM needs the SIGKILL after the grace period,
    # which only happens if the cleanup is shielded from the cancellation.
    tool = run_command_tool(ws, grace=0.3)
    finished = False

    async def cancel_once_started(scope: anyio.CancelScope) -> None:
        await read_pid(ws.root / "pid")
        scope.cancel()

    with tagged() as marker, anyio.fail_after(10):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_once_started, scope)
                await tool.run(
                    {"command": prelude + "echo $$ > shell; sleep 30 & echo $! > pid; wait"}
                )
                finished = True
    # The cancellation reached us (not swallowed, not turned into a result) ...
    assert scope.cancelled_caught
    assert not finished
    # ... and only after the whole group was gone.
    assert marked_processes(marker) == []


async def test_run_command_argument_errors(tools: dict[str, Tool]) -> None:
    with pytest.raises(ToolError, match="'command'"):
        await call(tools["run_command"])
    with pytest.raises(ToolError, match="'timeout' must be positive"):
        await call(tools["run_command"], command="true", timeout=0)


# --- build_tools -----------------------------------------------------------------


def test_build_tools_in_the_given_order(ws: Workspace) -> None:
    built = build_tools(["grep", "read_file", "grep"], ws)
    assert [t.name for t in built] == ["grep", "read_file"]
    assert build_tools([], ws) == []


def test_build_tools_unknown_name(ws: Workspace) -> None:
    with pytest.raises(ConfigError) as info:
        build_tools(["read_file", "rm_rf"], ws)
    message = str(info.value)
    assert "'rm_rf'" in message
    assert all(name in message for name in TOOL_NAMES)


def test_tool_schemas(ws: Workspace) -> None:
    built = build_tools(TOOL_NAMES, ws)
    assert tuple(t.name for t in built) == TOOL_NAMES
    for tool in built:
        schema = tool.spec.parameters
        assert schema["type"] == "object"
        assert set(schema["required"]) <= set(schema["properties"])
        for prop in schema["properties"].values():
            assert prop["type"] in {"string", "integer", "number", "boolean"}
            assert prop["description"]
        assert tool.spec.description == tool.description


def test_tools_are_built_once_per_workspace_object_and_settings(tmp_path: Path) -> None:
    """Every spawn builds its tools: one set serves a workspace object and
    its settings. Another object on the same directory gets its own (the
    first may be closed meanwhile)."""
    workspace = Workspace(tmp_path)
    first = build_tools(["read_file", "grep"], workspace)
    again = build_tools(["read_file", "grep"], workspace)
    assert [a is b for a, b in zip(first, again, strict=True)] == [True, True]
    assert again is not first  # each caller's own list
    assert build_tools(["grep"], workspace, max_output=10)[0] is not first[1]
    twin = Workspace(tmp_path)
    workspace.close()
    fresh = build_tools(["read_file", "grep"], twin)
    assert fresh[0] is not first[0]
    (tmp_path / "f.txt").write_text("x\n")
    assert anyio.run(fresh[0].run, {"path": "f.txt"}) == "x\n"
    # A workspace made for one conversation: its set is neither kept nor reused.
    own = build_tools(["read_file"], twin, reuse=False)
    assert own[0] is not fresh[0]
    assert build_tools(["read_file"], twin, reuse=False)[0] is not own[0]
