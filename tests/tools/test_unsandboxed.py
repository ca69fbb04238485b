"""Commands under `--no-sandbox`: a process that detaches still dies with its command.

Real processes throughout: the command runs `env -i setsid sleep TOKEN`, a
process that leaves the command's group and clears its environment (so
neither the group nor the call's marker finds it), and the test looks for
it in the host's /proc by its unique argument.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from a2a_orchestrator.errors import ToolError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.tools import Sandbox, Tool, Workspace, build_tools
from a2a_orchestrator.tools.sandbox import pid_namespace

pytestmark = pytest.mark.anyio

WHY_NOT = pid_namespace()[1]
needs_unshare = pytest.mark.skipif(
    bool(WHY_NOT),
    reason=f"needs util-linux's unshare able to make a PID namespace (as root): {WHY_NOT}",
)
OFF = Sandbox(enabled=False, bwrap="/nonexistent/bwrap")
"""The operator's opt-out, on a machine where bubblewrap is not even installed."""


def sleepers(token: str) -> list[int]:
    """Live processes (zombies aside) running `sleep TOKEN`, by host pid."""
    found = []
    wanted = b"sleep\0" + token.encode() + b"\0"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        if cmdline == wanted and stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


@pytest.fixture
def token() -> Iterator[str]:
    """A unique `sleep` argument; whatever still runs it afterwards is killed."""
    value = f"600.{uuid.uuid4().int % 10**9:09d}"
    yield value
    for pid in sleepers(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def detach(token: str) -> str:
    return f"env -i setsid sleep {token} > /dev/null 2>&1 &"


def command_tool(work: Path, sandbox: Sandbox = OFF) -> Tool:
    (tool,) = build_tools(["run_command"], Workspace(work), sandbox=sandbox)
    return tool


async def until_running(token: str) -> None:
    with anyio.fail_after(10):
        while not sleepers(token):
            await anyio.sleep(0.02)


@needs_unshare
async def test_a_detached_process_dies_when_its_command_ends(tmp_path: Path, token: str) -> None:
    # $! is the sleep itself (env and setsid exec it); the command reads its
    # command line through its own /proc.
    out = await command_tool(tmp_path).run(
        {"command": f"{detach(token)} sleep 0.5; tr '\\0' ' ' < /proc/$!/cmdline"}
    )
    assert f"sleep {token}" in out
    assert sleepers(token) == []


@needs_unshare
async def test_a_detached_process_dies_on_timeout(tmp_path: Path, token: str) -> None:
    tool = command_tool(tmp_path)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:

            async def timed_out() -> None:
                with pytest.raises(ToolError, match="timed out"):
                    await tool.run({"command": f"{detach(token)} sleep 60", "timeout": 1})

            tg.start_soon(timed_out)
            await until_running(token)
    assert sleepers(token) == []


@needs_unshare
async def test_a_detached_process_dies_on_cancel(tmp_path: Path, token: str) -> None:
    tool = command_tool(tmp_path)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(tool.run, {"command": f"{detach(token)} sleep 60"})
            await until_running(token)
            tg.cancel_scope.cancel()
    assert sleepers(token) == []


@needs_unshare
async def test_a_timed_out_command_stops_where_it_is(tmp_path: Path) -> None:
    # SIGTERM ends the shell itself, as without a namespace: it does not go
    # on to its next line once the line running is killed.
    with anyio.fail_after(20), pytest.raises(ToolError, match="timed out"):
        await command_tool(tmp_path).run({"command": "sleep 30; touch after", "timeout": 1})
    assert not (tmp_path / "after").exists()


@needs_unshare
async def test_a_command_can_end_its_own_shell(tmp_path: Path) -> None:
    # The exit code is the shell's status as bubblewrap reports it too.
    with anyio.fail_after(20), pytest.raises(ToolError) as failed:
        await command_tool(tmp_path).run({"command": "echo before; kill $$; echo after"})
    assert str(failed.value).endswith("before\n[exit code 143]")


CRASHING_SERVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import anyio

    from a2a_orchestrator.tools import Sandbox, Workspace, build_tools

    work, command = Path(sys.argv[1]), sys.argv[2]


    async def main() -> None:
        sandbox = Sandbox(enabled=False, bwrap="/nonexistent/bwrap")
        (tool,) = build_tools(["run_command"], Workspace(work), sandbox=sandbox)
        await tool.run({"command": command})


    anyio.run(main)
    """
)


@needs_unshare
async def test_a_detached_process_dies_with_a_killed_server(tmp_path: Path, token: str) -> None:
    script = tmp_path / "server.py"
    script.write_text(CRASHING_SERVER)
    command = f"{detach(token)} sleep 60"
    server = subprocess.Popen([sys.executable, str(script), str(tmp_path), command])
    try:
        with anyio.fail_after(15):
            while not sleepers(token):
                assert server.poll() is None, "the server script died before its command ran"
                await anyio.sleep(0.02)
            server.send_signal(signal.SIGKILL)
            server.wait()
            # No restart, no recovery: the namespace ends with the server.
            while sleepers(token):
                await anyio.sleep(0.02)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


async def test_without_unshare_the_warning_says_detached_processes_survive(
    tmp_path: Path,
) -> None:
    missing = Sandbox(enabled=False, bwrap="/nonexistent/bwrap", unshare="/nonexistent/unshare")
    assert "a process a command detaches (setsid) outlives its timeout" in missing.describe()
    assert "'/nonexistent/unshare' not found" in missing.describe()
    # Commands still run, as before.
    out = await command_tool(tmp_path, missing).run({"command": "echo ran"})
    assert out == "ran\n[exit code 0]"


async def test_a_role_server_started_without_unshare_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = Sandbox(enabled=False, bwrap="/nonexistent/bwrap", unshare="/nonexistent/unshare")
    with anyio.fail_after(20):
        async with run_role_server(
            find_role("coder"),
            ScriptedModel([]),
            tmp_path,
            db=str(tmp_path / "t.db"),
            sandbox=missing,
        ):
            pass
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(
        "turned the sandbox off" in m and "detaches (setsid) outlives" in m for m in warned
    ), warned


@needs_unshare
def test_with_unshare_the_warning_says_what_holds() -> None:
    assert OFF.describe().endswith("each in a PID namespace of its own, which ends with it")
