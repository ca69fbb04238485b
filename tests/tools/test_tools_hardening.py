"""The file tools against the server's own names, catastrophic patterns and huge files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from support.tools import call

from a2a_orchestrator.errors import PathOutsideWorkdirError, ToolError
from a2a_orchestrator.tools import TOOL_NAMES, Tool, Workspace, build_tools, reserved, sandbox
from a2a_orchestrator.tools.files import edit_file_tool, grep_tool, read_file_tool

pytestmark = pytest.mark.anyio

SECRET = "PRIVATE-STATE-SECRET"
FILE_TOOLS = [name for name in TOOL_NAMES if name != "run_command"]


@pytest.fixture
def tools(ws: Workspace) -> dict[str, Tool]:
    return {t.name: t for t in build_tools(FILE_TOOLS, ws)}


def tree(directory: Path) -> dict[str, str]:
    """Every file under `directory` (symlinks not followed) and its text."""
    return {
        str(p.relative_to(directory)): p.read_text()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def test_sandbox_and_file_tools_share_the_reserved_names() -> None:
    assert sandbox.STATE_DIR is reserved.STATE_DIR == ".a2a"
    assert sandbox.READ_ONLY_DIRS is reserved.READ_ONLY_DIRS == ("roles", "agents")


# --- .a2a/: the server's private state is outside -----------------------------


@pytest.fixture
def state(ws: Workspace) -> Path:
    state = ws.root / ".a2a"
    (state / "roles").mkdir(parents=True)
    (state / "hooks.toml").write_text(f"# {SECRET}\n")
    (state / "roles/coder.md").write_text(f"{SECRET}\n")
    (ws.root / "sub").mkdir()
    (ws.root / "sub/ok.txt").write_text("fine\n")
    (ws.root / "x").symlink_to(".a2a")
    (ws.root / "abs").symlink_to(state)
    (ws.root / "h.toml").symlink_to(".a2a/hooks.toml")
    (ws.root / "sub/up").symlink_to("../.a2a")
    (ws.root / "self").symlink_to(".")
    return state


STATE_PATHS = [
    ".a2a/hooks.toml",
    "./.a2a/hooks.toml",
    ".a2a//roles/coder.md",
    "sub/../.a2a/hooks.toml",
    ".a2a/../.a2a/hooks.toml",
    "x/hooks.toml",
    "x/roles/coder.md",
    "abs/hooks.toml",
    "h.toml",
    "sub/up/hooks.toml",
    "self/.a2a/hooks.toml",
    "self/x/new.toml",
    ".a2a/new.toml",
    ".a2a/new/dir/f.md",
    ".a2a",
    "x",
]


@pytest.mark.parametrize("path", STATE_PATHS)
async def test_file_tools_refuse_the_state_dir(
    tools: dict[str, Tool], ws: Workspace, state: Path, path: str
) -> None:
    before = tree(ws.root)
    for name, args in (
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": "[hooks]\n"}),
        ("edit_file", {"path": path, "old_text": SECRET, "new_text": "pwned"}),
    ):
        with pytest.raises(PathOutsideWorkdirError) as info:
            await call(tools[name], **args)
        assert repr(path) in str(info.value)
        assert ".a2a/, the server's private state" in str(info.value)
    # Also as an absolute path spelled through the root.
    with pytest.raises(PathOutsideWorkdirError, match="private state"):
        await call(tools["write_file"], path=str(ws.root / path), content="x")
    assert tree(ws.root) == before


async def test_the_state_dir_is_not_created_either(tools: dict[str, Tool], ws: Workspace) -> None:
    for path in (".a2a/hooks.toml", ".a2a/roles/coder.md", ".a2a"):
        with pytest.raises(PathOutsideWorkdirError, match="private state"):
            await call(tools["write_file"], path=path, content="x")
    (ws.root / "later").symlink_to(".a2a")  # dangling, until the server makes it
    with pytest.raises(PathOutsideWorkdirError, match="private state"):
        await call(tools["write_file"], path="later/hooks.toml", content="x")
    # Made on the way (as `mkdir -p` would), then refused.
    with pytest.raises(PathOutsideWorkdirError, match="private state"):
        await call(tools["write_file"], path="missing/../.a2a/hooks.toml", content="x")
    assert sorted(os.listdir(ws.root)) == ["later", "missing"]
    with pytest.raises(PathOutsideWorkdirError, match="private state"):
        ws.resolve(".a2a/anything")


@pytest.mark.parametrize(
    "pattern",
    ["**/*", "*", "**", ".a2a/*", ".a2a/**", ".a2a/**/*", "**/hooks.toml", "*/hooks.toml",
     "*/*/coder.md", ".*/*", "x/*", "abs/**/*", "sub/*/*", "self/.a2a/*", "h.toml", "**/*.toml"],
)  # fmt: skip
async def test_list_and_grep_never_see_the_state_dir(
    tools: dict[str, Tool], ws: Workspace, state: Path, pattern: str
) -> None:
    for glob in (pattern, str(ws.root / pattern)):
        listed = await call(tools["list_files"], pattern=glob)
        assert listed in ("sub/ok.txt", f"No files match {glob!r}.")
        hits = await call(tools["grep"], pattern=SECRET, glob=glob)
        assert hits == f"No matches for {SECRET!r}."


async def test_only_the_roots_state_dir_is_reserved(
    tools: dict[str, Tool], ws: Workspace, state: Path
) -> None:
    # A `.a2a` deeper down is the project's own (a fixture, a vendored tree).
    out = await call(tools["write_file"], path="sub/.a2a/notes.md", content=f"{SECRET}\n")
    assert out.startswith("Created sub/.a2a/notes.md")
    assert await call(tools["list_files"]) == "sub/.a2a/notes.md\nsub/ok.txt"
    assert await call(tools["grep"], pattern=SECRET) == f"sub/.a2a/notes.md:1:{SECRET}"
    # A name that only starts like it is an ordinary name.
    await call(tools["write_file"], path=".a2a-notes/x.md", content="ok\n")
    assert await call(tools["read_file"], path=".a2a-notes/x.md") == "ok\n"


# --- roles/ and agents/: read-only ---------------------------------------------


@pytest.fixture
def config(ws: Workspace) -> dict[str, str]:
    (ws.root / "roles").mkdir()
    (ws.root / "agents").mkdir()
    (ws.root / "roles/coder.md").write_text("role: coder\n")
    (ws.root / "agents/net.yaml").write_text("agents: []\n")
    (ws.root / "r").symlink_to("roles")
    (ws.root / "coder.md").symlink_to("roles/coder.md")
    (ws.root / "sub").mkdir()
    (ws.root / "sub/a").symlink_to("../agents")
    return tree(ws.root)


async def test_config_dirs_can_be_read(
    tools: dict[str, Tool], ws: Workspace, config: dict[str, str]
) -> None:
    assert await call(tools["read_file"], path="roles/coder.md") == "role: coder\n"
    assert await call(tools["read_file"], path="r/coder.md") == "role: coder\n"
    assert (await call(tools["list_files"])).splitlines() == [
        "agents/net.yaml",
        "coder.md",
        "roles/coder.md",
    ]
    assert await call(tools["grep"], pattern="agents:") == "agents/net.yaml:1:agents: []"


WRITES = [
    "roles/coder.md",
    "roles/new.md",
    "roles/deep/new.md",
    "./roles/../roles/coder.md",
    "agents/net.yaml",
    "agents/other.yaml",
    "r/coder.md",
    "r/new.md",
    "coder.md",
    "sub/a/net.yaml",
    "sub/../agents/x.yaml",
    "roles",
    "r",
]


@pytest.mark.parametrize("path", WRITES)
async def test_config_dirs_are_read_only(
    tools: dict[str, Tool], ws: Workspace, config: dict[str, str], path: str
) -> None:
    for name, args in (
        ("write_file", {"path": path, "content": "tools: [run_command]\n"}),
        ("write_file", {"path": str(ws.root / path), "content": "x"}),
        ("edit_file", {"path": path, "old_text": "coder", "new_text": "admin"}),
    ):
        with pytest.raises(ToolError) as info:
            await call(tools[name], **args)
        assert not isinstance(info.value, PathOutsideWorkdirError)
        if name == "edit_file" and not (ws.root / path).parent.exists():
            assert "does not exist" in str(info.value)  # nothing to edit, nothing made
            continue
        assert "role and agent configuration and is read-only to agents" in str(info.value)
    assert tree(ws.root) == config


@pytest.mark.parametrize("path", ["roles/coder.md", "agents/x.yaml", "roles", "dangling/x.md"])
async def test_config_dirs_cannot_be_created(
    tools: dict[str, Tool], ws: Workspace, path: str
) -> None:
    (ws.root / "dangling").symlink_to("roles")
    with pytest.raises(ToolError, match="read-only to agents"):
        await call(tools["write_file"], path=path, content="tools: [run_command]\n")
    assert sorted(os.listdir(ws.root)) == ["dangling"]


async def test_writes_beside_the_config_dirs_work(tools: dict[str, Tool], ws: Workspace) -> None:
    (ws.root / "roles").mkdir()
    # Passing through roles/ to land elsewhere, or a roles/ deeper down, is fine.
    assert (await call(tools["write_file"], path="roles/../ok.txt", content="a\n")).startswith(
        "Created ok.txt"
    )
    await call(tools["write_file"], path="docs/roles/how.md", content="b\n")
    await call(tools["edit_file"], path="docs/roles/how.md", old_text="b", new_text="c")
    assert (ws.root / "docs/roles/how.md").read_text() == "c\n"
    await call(tools["write_file"], path="rolesx.md", content="d\n")


# --- grep: catastrophic patterns -----------------------------------------------


async def test_grep_nested_quantifier_answers_promptly(ws: Workspace) -> None:
    (ws.root / "a.txt").write_text("a" * 30 + "!\n")
    start = time.monotonic()
    out = await call(grep_tool(ws), pattern="(a+)+$")
    assert out == "No matches for '(a+)+$'."
    assert time.monotonic() - start < 2


async def test_grep_catastrophic_pattern_stops_and_the_loop_keeps_running(
    ws: Workspace,
) -> None:
    (ws.root / "a.txt").write_text("aa\n")  # matches at once
    (ws.root / "b.txt").write_text("a" * 40 + "!\n")  # would take hours
    tool = grep_tool(ws, deadline=1.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await anyio.sleep(0.01)
            ticks += 1

    start = time.monotonic()
    with anyio.move_on_after(10) as scope:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            with pytest.raises(ToolError) as info:
                await tool.run({"pattern": "(a|aa)+$"})
            tg.cancel_scope.cancel()
    elapsed = time.monotonic() - start
    assert not scope.cancel_called
    assert 0.9 <= elapsed < 5.0  # the deadline (clocks differ a little), and slack for load
    # The loop ran all along (about 100 ticks a second); a frozen one ticks once or twice.
    assert ticks >= 20
    message = str(info.value)
    assert message.startswith("Pattern '(a|aa)+$' took too long")
    assert "stopped after 1 s, at b.txt:1" in message
    assert message.endswith("Matches found so far:\na.txt:1:aa")


async def test_grep_is_cancelled_between_lines(ws: Workspace) -> None:
    # Each line takes tens of milliseconds; all of them, minutes.
    (ws.root / "slow.txt").write_text(("a" * 24 + "!\n") * 2000)
    tool = grep_tool(ws, deadline=300)
    start = time.monotonic()
    with anyio.move_on_after(0.5) as scope:
        await tool.run({"pattern": "(a|aa)+$"})
    assert scope.cancel_called
    assert time.monotonic() - start < 5  # not the minutes the whole file would take


async def test_grep_total_deadline_covers_many_files(ws: Workspace) -> None:
    for i in range(30):
        (ws.root / f"f{i:02}.txt").write_text("a" * 22 + "!\n")
    with pytest.raises(ToolError, match=r"took too long: the search stopped after 0\.05 s"):
        await call(grep_tool(ws, deadline=0.05), pattern="(a|aa)+$")


# --- huge files ----------------------------------------------------------------


async def test_grep_skips_large_files_and_cuts_long_lines(ws: Workspace) -> None:
    (ws.root / "big.log").write_text("needle\n" * 200)  # 1400 bytes
    (ws.root / "wide.txt").write_text("x" * 250 + "needle\nneedle\n")
    (ws.root / "small.txt").write_text("needle\n")
    tool = grep_tool(ws, max_file_bytes=1000, max_line=100)
    out = await call(tool, pattern="needle")
    assert out.splitlines() == [
        "small.txt:1:needle",
        "wide.txt:2:needle",  # line 1's needle lies past what is searched
        "[skipped 1 file over 1000 bytes: big.log; read them with read_file, "
        "which takes offset and limit]",
        "[1 line longer than 100 characters: searched in the first 100 characters only]",
    ]
    out = await call(tool, pattern="zebra", glob="big.log")
    assert out.startswith("No matches for 'zebra'.\n[skipped 1 file over 1000 bytes: big.log")


async def test_edit_file_refuses_large_files(ws: Workspace) -> None:
    f = ws.root / "big.txt"
    f.write_text("a\n" * 600)
    with pytest.raises(ToolError, match=r"too large to edit \(1200 bytes; .* up to 1000 bytes\)"):
        await call(edit_file_tool(ws, max_bytes=1000), path="big.txt", old_text="a", new_text="b")
    assert f.read_text() == "a\n" * 600


async def test_read_file_long_first_line_says_what_is_left(ws: Workspace) -> None:
    (ws.root / "one.txt").write_text("é" * 100 + "\nnext\n")  # 2 bytes each
    assert await call(read_file_tool(ws), path="one.txt") == "é" * 100 + "\nnext\n"
    small = read_file_tool(ws, max_bytes=51)
    out = await call(small, path="one.txt")
    # Cut at a character boundary: 50 bytes shown; 150 of the line and "\nnext\n" left.
    note = "\n[line cut at 51 bytes; 156 more bytes in the file; continue with offset=2]"
    assert out == "é" * 25 + note
    assert await call(small, path="one.txt", offset=2) == "next\n"
    assert "the file has 2 lines" in await call(small, path="one.txt", offset=5)


_PROBE = textwrap.dedent(
    """
    import json, resource, sys, time

    import anyio

    from a2a_orchestrator.errors import ToolError
    from a2a_orchestrator.tools import Workspace, build_tools

    workspace = Workspace(sys.argv[1])
    tools = {t.name: t for t in build_tools(["read_file", "edit_file", "grep"], workspace)}
    CALLS = [
        ("read_file", {"path": "huge.txt"}),
        ("read_file", {"path": "huge.txt", "offset": 2}),
        ("read_file", {"path": "huge.txt", "limit": 1}),
        ("edit_file", {"path": "huge.txt", "old_text": "a", "new_text": "b"}),
        ("edit_file", {"path": "mid.txt", "old_text": "b", "new_text": "c"}),
        ("grep", {"pattern": "zebra"}),
        ("grep", {"pattern": "b+", "glob": "mid.txt"}),
    ]

    def peak_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    async def main():
        await tools["read_file"].run({"path": "small.txt"})  # threads and imports warm
        base = peak_kib()
        results = []
        for name, args in CALLS:
            start = time.monotonic()
            try:
                out = await tools[name].run(args)
            except ToolError as exc:
                out = "ERROR " + str(exc)
            results.append({"seconds": time.monotonic() - start, "len": len(out),
                            "head": out[:20], "tail": out[-300:]})
        print(json.dumps({"growth_mib": (peak_kib() - base) / 1024, "results": results}))

    anyio.run(main)
    """
)


def test_huge_files_stay_in_bounded_memory_and_time(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    (root / "small.txt").write_text("hello\n")
    # Sparse: text for the binary sniff, then NULs (valid UTF-8), one 200 MB line.
    with open(root / "huge.txt", "wb") as f:
        f.write(b"a" * 8192)
        f.truncate(200 * 1024 * 1024)
    with open(root / "mid.txt", "wb") as f:  # under grep's file limit, one 12 MiB line
        f.write(b"b" * 8192)
        f.truncate(12 * 1024 * 1024)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(root)],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["growth_mib"] < 100, report
    results = report["results"]
    for r in results:
        assert r["seconds"] < 15, results
    read, skipped, limited, edit_huge, edit_mid, grep_all, grep_mid = results
    assert read["head"] == "a" * 20
    assert read["len"] < 256 * 1024 + 200
    assert read["tail"].endswith(
        f"\n[line cut at {256 * 1024} bytes; {200 * 1024 * 1024 - 256 * 1024} more bytes "
        "in the file; continue with offset=2]"
    )
    assert skipped["tail"] == "(no lines from offset 2; the file has 1 lines)"
    assert limited["tail"] == read["tail"]
    assert edit_huge["tail"].startswith("ERROR 'huge.txt' is too large to edit (200 MiB; ")
    assert "edit_file handles files up to 8 MiB" in edit_huge["tail"]
    assert edit_mid["tail"].startswith("ERROR 'mid.txt' is too large to edit (12 MiB; ")
    assert grep_all["tail"] == (
        "No matches for 'zebra'.\n"
        "[skipped 1 file over 16 MiB: huge.txt; read them with read_file, "
        "which takes offset and limit]\n"
        "[1 line longer than 1048576 characters: searched in the first 1048576 characters only]"
    )
    # The match is shown cut to 500 characters.
    assert grep_mid["head"] == "mid.txt:1:bbbbbbbbbb"
    assert grep_mid["len"] < 1000
