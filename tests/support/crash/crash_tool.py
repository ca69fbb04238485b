"""An orchestrator process killed between two of its commits around a tool call.

Run as `python crash_tool.py STORE SESSION WORKDIR MOMENT`: it spawns child
`c1` (role `marker`, written to WORKDIR/roles) whose scripted model calls
the tool `mark` once (it appends a line to WORKDIR/runs.txt), then says
what the tool answered. The process SIGKILLs itself right after the commit
that records the call's start in the tool journal (MOMENT `start`) or its
close (`finish`), before anything else reaches the file (MOMENT `read`: the
tool says it only reads, and the process is killed once the tool has run): the child's events
are written behind it (`outbox.py`), so those it emitted just before may
not be on disk, as after a crash at that instant. The kill is placed by
SQLite's statement trace so that it lands at that instant every run.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools import Tool

ROLE = "---\ndescription: Marks.\ntools: [mark]\n---\nYou mark.\n"
JOURNAL_WRITES = {"start": "INSERT INTO tool_calls", "finish": "UPDATE tool_calls SET finished_at"}


def mark_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Step 0 calls `mark`; then it reports what the tool said."""
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        return {"tool_calls": [{"name": "mark", "arguments": {}}]}
    results = [m["content"] for m in messages if m["role"] == "tool"]
    return {"text": "tool said: " + (results[-1] if results else "(nothing)")}


def network() -> Network:
    return Network.of(AgentSpec(name="marker", role="marker"))


def with_mark(
    session: Session, workdir: Path, *, read_only: bool = False, crash: bool = False
) -> None:
    """Give `session`'s in-process children the role `marker` and its tool;
    `read_only`: the tool says it only reads (it is not journaled); `crash`:
    it SIGKILLs this process once it has run, before its result is recorded."""

    async def mark(arguments: dict[str, Any]) -> str:
        with (workdir / "runs.txt").open("a") as runs:
            runs.write("ran\n")
        if crash:
            os.kill(os.getpid(), signal.SIGKILL)
        return "marked"

    (workdir / "roles").mkdir(exist_ok=True)
    (workdir / "roles" / "marker.md").write_text(ROLE)
    session.local.cwd = workdir
    session.local.extra_tools["mark"] = Tool(
        name="mark", description="Mark.", run=mark, read_only=read_only
    )


def kill_after_commit_of(statement: str) -> Any:
    """A trace callback: SIGKILL at the first statement after the commit of
    the transaction that ran `statement` (that commit is done, nothing after it)."""
    state = {"seen": False, "committed": False}

    def trace(sql: str) -> None:
        if state["committed"]:
            os.kill(os.getpid(), signal.SIGKILL)
        if sql.strip().startswith(statement):
            state["seen"] = True
        elif state["seen"] and sql.strip().upper() == "COMMIT":
            state["committed"] = True

    return trace


async def main(store_path: str, session_id: str, workdir: str, moment: str) -> None:
    model = ScriptedModel(mark_script)
    store = Store(store_path)
    async with Session(
        store,
        workdir=Path(workdir),
        network=network(),
        models=lambda name: model,
        session_id=session_id,
    ) as session:
        if moment == "read":
            # A tool that only reads, killed while it runs.
            with_mark(session, Path(workdir), read_only=True, crash=True)
        else:
            with_mark(session, Path(workdir))
            store._file.conn.set_trace_callback(kill_after_commit_of(JOURNAL_WRITES[moment]))
        child = await session.spawn(ChildConfig(role="marker", prompt="mark it"), child_id="c1")
        await child.wait()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
