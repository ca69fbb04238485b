"""Swap races against the file tools: does any call escape the work directory?

For each tool, a separate process swaps `work/sub` (a real directory) with a
symlink to a directory outside, atomically (`renameat2(RENAME_EXCHANGE)`), in
a tight loop, while the tool is called `--trials` times on paths through
`sub`. A trial escapes when it wrote outside, read the outside secret, or
listed or grepped an outside file. A refused call (`sub` was the symlink at
that moment) is counted apart: it shows the race was really run.

    python bench/races.py --trials 3000   (--quick: 100 calls per tool)

The test suite runs the same races, smaller (`tests/tools/test_confinement.py`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from a2a_orchestrator.errors import ToolError
from a2a_orchestrator.tools import Tool, Workspace, build_tools

TOOLS = ("read_file", "write_file", "edit_file", "list_files", "grep")
SECRET = "OUTSIDE-SECRET"

# The swapper runs in its own interpreter so the swaps really interleave
# with the tools' system calls (a thread would mostly wait for the GIL).
# PR_SET_PDEATHSIG ends it with the race if the runner is killed.
_SWAPPER = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
a, b = (os.fsencode(p) for p in sys.argv[1:3])
swaps = 0
def report(*_):
    print(swaps, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, report)
print("ready", flush=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
while True:
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")
    swaps += 1
"""


@dataclass
class Race:
    """One tool's race: how many calls ran, escaped, were refused; swaps done."""

    tool: str
    trials: int
    escaped: int
    refused: int
    swaps: int
    seconds: float


@dataclass
class _Layout:
    work: Path
    outside: Path


def _layout(base: Path) -> _Layout:
    """work/sub (a directory) and work/sub.swap (a symlink out), and the outside."""
    work, outside = base / "work", base / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    (work / "sub" / "f.txt").write_text("inside TOKEN\n")
    (outside / "f.txt").write_text(f"{SECRET} TOKEN\n")
    (outside / "outside-only.txt").write_text(f"{SECRET}\n")
    (work / "sub.swap").symlink_to(outside)
    return _Layout(work, outside)


def _outside_state(layout: _Layout) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(layout.outside.iterdir())}


def _leaked_inside(layout: _Layout) -> bool:
    """True when a file inside holds the secret (read outside, written inside).

    Only meaningful once the swapper stopped: one of the two names is then
    the real directory and the other the symlink out, which is skipped.
    """
    for name in ("sub", "sub.swap"):
        d = layout.work / name
        if not d.is_symlink() and SECRET in (d / "f.txt").read_text():
            return True
    return False


def _edited_outside(layout: _Layout) -> bool:
    """True when an edit landed in the outside file; puts it back for the next trial."""
    f = layout.outside / "f.txt"
    if "+" not in f.read_text():
        return False
    f.write_text(f"{SECRET} TOKEN\n")
    return True


def _trial(tool: str, i: int) -> tuple[dict[str, Any], Callable[[str, _Layout], bool]]:
    """The arguments of call `i` and the check that says whether it escaped."""
    if tool == "read_file":
        return {"path": "sub/f.txt"}, lambda out, _: SECRET in out
    if tool == "write_file":
        name = f"w{i}.txt"
        return {"path": f"sub/{name}", "content": "x"}, lambda _, lay: (lay.outside / name).exists()
    if tool == "edit_file":
        # Each edit appends one "+", so "TOKEN" stays unique in the file.
        args = {"path": "sub/f.txt", "old_text": "TOKEN", "new_text": "TOKEN+"}
        return args, lambda _, lay: _edited_outside(lay)
    # Alternate the walk through a named directory with the recursive one.
    glob = "sub/*" if i % 2 == 0 else "**/*"
    if tool == "list_files":
        return {"pattern": glob}, lambda out, _: "outside-only" in out
    # A hit reads `path:1:text`; "No matches for 'OUTSIDE-SECRET'." is no escape.
    return {"pattern": SECRET, "glob": glob}, lambda out, _: f":1:{SECRET}" in out


async def race(tool: str, trials: int, base: Path) -> Race:
    """Call `tool` `trials` times under `base` while `work/sub` is swapped."""
    layout = _layout(base)
    before = _outside_state(layout)
    tools: dict[str, Tool] = {t.name: t for t in build_tools([tool], Workspace(layout.work))}
    run: Callable[[dict[str, Any]], Awaitable[str]] = tools[tool].run
    swapper = subprocess.Popen(
        [sys.executable, "-c", _SWAPPER, str(layout.work / "sub"), str(layout.work / "sub.swap")],
        stdout=subprocess.PIPE,
        text=True,
    )
    escaped = refused = 0
    started = time.monotonic()
    try:
        assert swapper.stdout is not None
        if swapper.stdout.readline().strip() != "ready":
            raise RuntimeError("the swapper did not start")
        for i in range(trials):
            args, escapes = _trial(tool, i)
            try:
                out = await run(args)
            except ToolError:
                out = ""
                refused += 1
            if escapes(out, layout):
                escaped += 1
    finally:
        swapper.terminate()
        report, _ = swapper.communicate(timeout=10)
    seconds = time.monotonic() - started
    # Anything else that changed outside (a stray temp file, say), or an
    # inside file that took the secret in, is an escape too.
    if escaped == 0 and (_outside_state(layout) != before or _leaked_inside(layout)):
        escaped = 1
    return Race(tool, trials, escaped, refused, int(report.strip() or 0), seconds)


async def main(trials: int, tools: tuple[str, ...]) -> list[Race]:
    results = []
    for tool in tools:
        with tempfile.TemporaryDirectory(prefix=f"races-{tool}-") as base:
            result = await race(tool, trials, Path(base))
        results.append(result)
        print(
            f"{tool:<10}  trials {result.trials:>6}  escaped {result.escaped:>4}  "
            f"refused {result.refused:>5}  swaps {result.swaps:>9}  {result.seconds:6.1f} s",
            flush=True,
        )
    total = sum(r.trials for r in results)
    print(f"races: {total} trials, {sum(r.escaped for r in results)} escaped")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3000, help="calls per tool (3000)")
    parser.add_argument(
        "--tools", nargs="+", choices=TOOLS, default=list(TOOLS), help="which tools to race"
    )
    parser.add_argument("--quick", action="store_true", help="100 calls per tool: a smoke test")
    ns = parser.parse_args()
    results = anyio.run(main, 100 if ns.quick else ns.trials, tuple(ns.tools))
    sys.exit(1 if any(r.escaped for r in results) else 0)
