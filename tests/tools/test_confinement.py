"""Confinement of the file tools: symlinks, `..`, odd names, and real swap races."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from support.tools import call

from a2a_orchestrator.errors import ConfigError, PathOutsideWorkdirError, ToolError
from a2a_orchestrator.tools import TOOL_NAMES, Tool, Workspace, build_tools

pytestmark = pytest.mark.anyio

SECRET = "TOP-SECRET-OUTSIDE"
FILE_TOOLS = [name for name in TOOL_NAMES if name != "run_command"]


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text(f"{SECRET}\n")
    return d


@pytest.fixture
def tools(ws: Workspace) -> dict[str, Tool]:
    return {t.name: t for t in build_tools(FILE_TOOLS, ws)}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- symlinks out, `..`, absolute paths, NUL ---------------------------------


@pytest.mark.parametrize("absolute", [False, True])
async def test_symlinks_out_are_refused_naming_the_path(
    tools: dict[str, Tool], ws: Workspace, outside: Path, absolute: bool
) -> None:
    target = outside if absolute else Path("../outside")
    (ws.root / "out").symlink_to(target)
    (ws.root / "secret.txt").symlink_to(target / "secret.txt")
    for path in ("out/secret.txt", "secret.txt", "out/new.txt"):
        for name, args in (
            ("read_file", {"path": path}),
            ("write_file", {"path": path, "content": "pwned"}),
            ("edit_file", {"path": path, "old_text": SECRET, "new_text": "pwned"}),
        ):
            with pytest.raises(PathOutsideWorkdirError) as info:
                await call(tools[name], **args)
            assert repr(path) in str(info.value)
    for glob in ("out/*", "*", "**/*"):
        hits = await call(tools["grep"], pattern=SECRET, glob=glob)
        assert hits == f"No matches for {SECRET!r}."
        assert "secret.txt" not in await call(tools["list_files"], pattern=glob)
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == f"{SECRET}\n"


async def test_dot_dot_that_leaves_is_refused(
    tools: dict[str, Tool], ws: Workspace, outside: Path
) -> None:
    (ws.root / "a").mkdir()
    (ws.root / "a" / "f.txt").write_text("inside\n")
    # `..` that stays inside is plain navigation.
    assert await call(tools["read_file"], path="a/../a/f.txt") == "inside\n"
    # A symlink to `..` from the root is a way out like any other.
    (ws.root / "up").symlink_to("..")
    for path in ("../outside/secret.txt", "a/../../outside/secret.txt", "up/outside/secret.txt"):
        with pytest.raises(PathOutsideWorkdirError, match="outside the work directory"):
            await call(tools["read_file"], path=path)
        with pytest.raises(PathOutsideWorkdirError):
            await call(tools["write_file"], path=path, content="pwned")
    with pytest.raises(PathOutsideWorkdirError, match=re.escape("'..'")):
        await call(tools["list_files"], pattern="../outside/*")
    assert (outside / "secret.txt").read_text() == f"{SECRET}\n"


async def test_absolute_paths_inside_are_accepted(tools: dict[str, Tool], ws: Workspace) -> None:
    path = str(ws.root / "sub" / "f.txt")
    assert await call(tools["write_file"], path=path, content="abs\n") == (
        "Created sub/f.txt (4 bytes written)"
    )
    assert await call(tools["read_file"], path=path) == "abs\n"
    assert await call(tools["list_files"], pattern=str(ws.root / "sub" / "*")) == "sub/f.txt"


async def test_nul_bytes_are_refused(tools: dict[str, Tool]) -> None:
    for name, args in (
        ("read_file", {"path": "a\0b"}),
        ("write_file", {"path": "a\0b", "content": "x"}),
        ("edit_file", {"path": "a\0b", "old_text": "x", "new_text": "y"}),
        ("list_files", {"pattern": "a\0*"}),
        ("grep", {"pattern": "x", "glob": "a\0*"}),
    ):
        with pytest.raises(PathOutsideWorkdirError, match="NUL byte"):
            await call(tools[name], **args)


# --- symlinks that stay inside -------------------------------------------------


async def test_symlinks_inside_are_followed(tools: dict[str, Tool], ws: Workspace) -> None:
    (ws.root / "real").mkdir()
    (ws.root / "real" / "f.txt").write_text("hello\n")
    (ws.root / "dir").symlink_to("real")  # relative, to a directory
    (ws.root / "rel.txt").symlink_to("real/f.txt")
    (ws.root / "abs.txt").symlink_to(ws.root / "real" / "f.txt")  # absolute, inside
    (ws.root / "real" / "back.txt").symlink_to("../rel.txt")  # a chain through `..`
    for path in ("dir/f.txt", "rel.txt", "abs.txt", "real/back.txt"):
        assert await call(tools["read_file"], path=path) == "hello\n"
    # Writing and editing through a link change the target and keep the link;
    # the model is told where the bytes went.
    assert await call(tools["write_file"], path="abs.txt", content="v2\n") == (
        "Overwrote real/f.txt (3 bytes written)"
    )
    assert await call(tools["edit_file"], path="dir/f.txt", old_text="v2", new_text="v3") == (
        "Edited real/f.txt: replaced 1 occurrence"
    )
    assert (ws.root / "abs.txt").is_symlink()
    assert (ws.root / "real" / "f.txt").read_text() == "v3\n"
    # A named (or wildcard) component follows a directory link inside; `**`
    # never descends one, so nothing is listed twice through it.
    assert (await call(tools["list_files"], pattern="dir/*")).splitlines() == [
        "dir/back.txt",
        "dir/f.txt",
    ]
    assert (await call(tools["list_files"])).splitlines() == [
        "abs.txt",
        "real/back.txt",
        "real/f.txt",
        "rel.txt",
    ]
    assert await call(tools["grep"], pattern="v3", glob="*.txt") == "abs.txt:1:v3\nrel.txt:1:v3"


async def test_dangling_symlinks(tools: dict[str, Tool], ws: Workspace, outside: Path) -> None:
    (ws.root / "ghost.txt").symlink_to("missing/new.txt")
    with pytest.raises(ToolError, match="does not exist"):
        await call(tools["read_file"], path="ghost.txt")
    assert "No files match" in await call(tools["list_files"], pattern="ghost.txt")
    # Writing through a dangling link inside creates its target, as open(2) would.
    assert await call(tools["write_file"], path="ghost.txt", content="x") == (
        "Created missing/new.txt (1 bytes written)"
    )
    assert (ws.root / "ghost.txt").read_text() == "x"
    # A dangling link out is refused before anything is created.
    (ws.root / "away.txt").symlink_to(outside / "made.txt")
    with pytest.raises(PathOutsideWorkdirError, match=re.escape("'away.txt'")):
        await call(tools["write_file"], path="away.txt", content="pwned")
    assert sorted(os.listdir(outside)) == ["secret.txt"]


async def test_final_symlink_out_is_never_written_through(
    tools: dict[str, Tool], ws: Workspace, outside: Path
) -> None:
    (ws.root / "dir").mkdir()
    (ws.root / "dir" / "f.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(PathOutsideWorkdirError, match=re.escape("'dir/f.txt'")):
        await call(tools["write_file"], path="dir/f.txt", content="pwned")
    with pytest.raises(PathOutsideWorkdirError):
        await call(tools["edit_file"], path="dir/f.txt", old_text=SECRET, new_text="pwned")
    assert (outside / "secret.txt").read_text() == f"{SECRET}\n"
    assert (ws.root / "dir" / "f.txt").is_symlink()
    assert os.listdir(ws.root / "dir") == ["f.txt"]  # no temp file left behind


async def test_symlink_loops_end(tools: dict[str, Tool], ws: Workspace) -> None:
    (ws.root / "a").symlink_to("b")
    (ws.root / "b").symlink_to("a")
    with pytest.raises(ToolError, match="Too many levels of symbolic links"):
        await call(tools["read_file"], path="a")
    with pytest.raises(ToolError, match="Too many levels of symbolic links"):
        await call(tools["write_file"], path="a/x.txt", content="x")
    assert "No files match" in await call(tools["list_files"], pattern="a/*")


async def test_a_fifo_is_refused_without_blocking(tools: dict[str, Tool], ws: Workspace) -> None:
    os.mkfifo(ws.root / "pipe")
    with pytest.raises(ToolError, match="not a regular file"):
        await call(tools["read_file"], path="pipe")
    assert "No matches" in await call(tools["grep"], pattern="x")


# --- the directory descriptor --------------------------------------------------


async def test_tools_leave_no_descriptor_open(
    tools: dict[str, Tool], ws: Workspace, outside: Path
) -> None:
    (ws.root / "d").mkdir()
    (ws.root / "d" / "f.txt").write_text("x TOKEN\n")
    (ws.root / "out").symlink_to(outside)
    before = open_fds()
    for i in range(20):
        await call(tools["read_file"], path="d/f.txt")
        await call(tools["write_file"], path=f"d/e/w{i}.txt", content="x")
        await call(tools["edit_file"], path="d/f.txt", old_text="TOKEN", new_text="TOKEN+")
        await call(tools["list_files"])
        await call(tools["grep"], pattern="TOKEN")
        for name in ("read_file", "write_file"):
            with pytest.raises(ToolError):
                await call(tools[name], path="out/secret.txt", content="x")
    # Twenty rounds of a leak would show; the event loop's own descriptors may
    # only have gone down since.
    assert open_fds() <= before


def test_workspace_holds_its_descriptor_until_closed(ws: Workspace) -> None:
    twin = copy.copy(ws)
    assert twin == ws
    ws.close()
    ws.close()  # closing twice is harmless
    with pytest.raises(ConfigError, match="was closed"):
        ws.locate("x")
    # The copy opened its own descriptor, untouched by the original's close.
    with twin.locate("x") as entry:
        assert entry.parts == ("x",)
    twin.close()


# --- the swap race, for real ----------------------------------------------------


def _races() -> ModuleType:
    """bench/races.py, the race the benchmark reports, run smaller here."""
    path = Path(__file__).resolve().parents[2] / "bench" / "races.py"
    spec = importlib.util.spec_from_file_location("bench_races", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


races = _races()


@pytest.mark.parametrize("tool", races.TOOLS)
async def test_no_call_escapes_a_swap_race(tool: str, tmp_path: Path) -> None:
    # A separate process swaps work/sub with a symlink out while the tool
    # runs; 2,000 calls take about a second on an idle machine.
    with anyio.fail_after(45):
        result = await races.race(tool, 2000, tmp_path)
    assert result.escaped == 0
    assert result.swaps > 0
    if tool in ("read_file", "write_file", "edit_file"):
        # Some calls met the symlink and were refused: the race really ran.
        assert result.refused > 0
