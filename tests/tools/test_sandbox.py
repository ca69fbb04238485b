"""run_command's sandbox, tried as an attacker would: real bubblewrap, real
processes, real sockets, a real role server and a real SIGKILL.

Nothing is faked except the model (ScriptedModel) where a server runs. The
"bubblewrap missing" cases point `Sandbox.bwrap` (or PATH) at a place
without it, which is what a machine without the package looks like.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from a2a.helpers import new_text_message
from a2a.types import Role, SendMessageRequest
from support.processes import running_with_text, until_none
from support.servers import a2a_client, role_server

from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError, ToolError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.events import ChildEvent, ToolResult
from a2a_orchestrator.runtime.factory import RoleRuntime, role_conversation
from a2a_orchestrator.runtime.roles import find_role, load_role_file
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools import Sandbox, Tool, Workspace, build_tools
from a2a_orchestrator.tools.base import CALL_MARKER_ENV, CallScope, current_call
from a2a_orchestrator.tools.procs import marked_processes, start_ticks
from a2a_orchestrator.tools.sandbox import probe, store_paths

pytestmark = pytest.mark.anyio

WHY_NOT = probe()
needs_bwrap = pytest.mark.skipif(
    bool(WHY_NOT),
    reason=f"needs bubblewrap (Debian package `bubblewrap`) able to create namespaces: {WHY_NOT}",
)
MISSING = Sandbox(bwrap="/nonexistent/bwrap")
"""A sandbox on a machine without bubblewrap."""
SECRET = "sandbox-test-secret-4711"


def request(text: str) -> SendMessageRequest:
    return SendMessageRequest(message=new_text_message(text, role=Role.ROLE_USER))


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path / "work"
    root.mkdir()
    return root


def command_tool(work: Path, sandbox: Sandbox | None = None) -> Tool:
    (tool,) = build_tools(["run_command"], Workspace(work), sandbox=sandbox or Sandbox())
    return tool


async def run(tool: Tool, command: str) -> str:
    """The command's output; a failed command's too (its ToolError text)."""
    with anyio.fail_after(20):
        try:
            return await tool.run({"command": command})
        except ToolError as exc:
            return str(exc)


# --- the file system ------------------------------------------------------------------


@pytest.fixture
def work_beside_host_files() -> Iterator[Path]:
    """A work directory whose parent is on the host's file system: under
    /tmp (pytest's tmp_path) the parent would be inside the sandbox's own
    tmpfs, and writing there would prove nothing."""
    parent = Path(tempfile.mkdtemp(prefix="a2a-sandbox-test-", dir="/var/tmp"))
    (parent / "work").mkdir()
    yield parent / "work"
    shutil.rmtree(parent)


@needs_bwrap
async def test_writes_land_only_in_the_work_directory(work_beside_host_files: Path) -> None:
    work = work_beside_host_files
    name = f"escape-{uuid.uuid4().hex}"
    targets = [Path("/tmp") / name, work.parent / name, Path("/etc") / name, Path.home() / name]
    attempts = "; ".join(f"echo x > {shlex.quote(str(t))}" for t in targets)
    out = await run(command_tool(work), f"{attempts}; echo inside > inside.txt; echo done")
    for target in targets:
        assert not target.exists(), f"the sandbox wrote {target}"
    # Each one refused, except /tmp: the sandbox's own tmpfs, gone with it.
    assert out.count("Read-only file system") == 3
    assert (work / "inside.txt").read_text() == "inside\n"


@needs_bwrap
async def test_the_servers_state_is_hidden(work: Path, tmp_path: Path) -> None:
    state = work / ".a2a"
    state.mkdir()
    (state / "tasks.db").write_text(SECRET)
    outside_store = tmp_path / "stores" / "orchestrator.db"
    outside_store.parent.mkdir()
    outside_store.write_text(SECRET)
    listed = tmp_path / "operator-secrets"
    listed.mkdir()
    (listed / "key").write_text(SECRET)
    sandbox = Sandbox().hiding(*store_paths(outside_store), listed)
    out = await run(
        command_tool(work, sandbox),
        f"ls -A .a2a; cat .a2a/tasks.db {shlex.quote(str(outside_store))} "
        f"{shlex.quote(str(listed / 'key'))}; echo x > .a2a/planted; echo end",
    )
    assert SECRET not in out
    assert "end" in out
    # What the command wrote "into" .a2a went to its private tmpfs.
    assert sorted(p.name for p in state.iterdir()) == ["tasks.db"]
    assert (state / "tasks.db").read_text() == SECRET


@needs_bwrap
async def test_a_missing_state_directory_cannot_be_planted(work: Path) -> None:
    out = await run(command_tool(work), "mkdir -p .a2a/roles && echo evil > .a2a/hooks.toml")
    assert "[exit code 0]" in out
    # The sandbox created .a2a before the command ran, and hid it.
    assert (work / ".a2a").is_dir()
    assert list((work / ".a2a").iterdir()) == []


@needs_bwrap
async def test_role_and_agent_files_of_the_work_directory_are_read_only(work: Path) -> None:
    # An orchestrator started here reads them: a command must not grant a
    # later child the network or new tools by writing one.
    (work / "roles").mkdir()
    (work / "roles" / "coder.md").write_text("---\ntools: [read_file]\n---\nsafe\n")
    (work / "agents").mkdir()
    out = await run(
        command_tool(work),
        "cat roles/coder.md; printf 'sandbox_network: true' > roles/coder.md; "
        "echo 'name = \"x\"' > agents/x.toml; echo ok > other.txt",
    )
    assert "safe" in out and out.count("Read-only file system") == 2
    assert (work / "roles" / "coder.md").read_text().endswith("safe\n")
    assert not (work / "agents" / "x.toml").exists()
    assert (work / "other.txt").read_text() == "ok\n"


@needs_bwrap
async def test_commands_have_no_capabilities(work: Path) -> None:
    # bwrap run by root keeps every capability unless told otherwise, and
    # root could then unmount what hides the stores.
    (work / ".a2a").mkdir()
    (work / ".a2a" / "tasks.db").write_text(SECRET)
    out = await run(
        command_tool(work),
        "grep CapEff /proc/self/status; umount .a2a 2>&1; cat .a2a/tasks.db 2>&1; "
        "mount -o remount,rw,bind / 2>&1; echo x > /etc/cap-escape 2>&1",
    )
    assert "CapEff:\t0000000000000000" in out
    assert SECRET not in out
    assert not Path("/etc/cap-escape").exists()


# --- network ----------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def connect_command(port: int) -> str:
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('OK')"
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def accepted(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


@needs_bwrap
async def test_no_network_by_default(work: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    out = await run(command_tool(work), connect_command(port))
    assert "Command failed" in out and "OK" not in out
    assert not accepted(listener)


@needs_bwrap
async def test_network_when_the_operator_allows_it(work: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    out = await run(command_tool(work, Sandbox(network=True)), connect_command(port))
    assert out == "OK\n[exit code 0]"
    assert accepted(listener)


@needs_bwrap
async def test_network_when_the_role_file_allows_it(
    work: Path, tmp_path: Path, listener: socket.socket
) -> None:
    path = tmp_path / "fetcher.md"
    path.write_text("---\ntools: [run_command]\nsandbox_network: true\n---\nFetch things.\n")
    role = load_role_file(path)
    assert role.sandbox_network
    command = connect_command(listener.getsockname()[1])
    script = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        {"text": "fetched"},
    ]
    conversation = role_conversation(
        role, ScriptedModel(script), Workspace(work), runtime=RoleRuntime(sandbox=Sandbox())
    )
    results: list[ChildEvent] = []

    async def emit(event: ChildEvent) -> None:
        results.append(event)

    with anyio.fail_after(20):
        await conversation.run("fetch", emit)
    outputs = [e for e in results if isinstance(e, ToolResult)]
    assert outputs and outputs[0].success, outputs
    assert outputs[0].output == "OK\n[exit code 0]"
    assert accepted(listener)


# --- the environment and the call marker -------------------------------------------------


@needs_bwrap
async def test_commands_do_not_see_the_servers_environment(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A2A_AUTH_TOKEN", SECRET)
    monkeypatch.setenv("A2A_MODEL_API_KEY", SECRET)
    # The server's own /proc entry, by its host pid, and every process the
    # sandbox can see.
    out = await run(
        command_tool(work),
        f"env; cat /proc/{os.getpid()}/environ /proc/*/environ 2>/dev/null | tr '\\0' '\\n'",
    )
    assert SECRET not in out
    assert "HOME=/tmp" in out and "LANG=C.UTF-8" in out


async def test_unsandboxed_commands_get_a_clean_environment_too(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A2A_AUTH_TOKEN", SECRET)
    out = await run(command_tool(work, Sandbox(enabled=False, bwrap="/nonexistent")), "env")
    assert SECRET not in out
    assert "PATH=" in out


@needs_bwrap
async def test_the_call_marker_and_process_group_reach_the_runtime(work: Path) -> None:
    marker = uuid.uuid4().hex
    recorded: list[tuple[int, int]] = []

    async def record(pgid: int, ticks: int) -> None:
        # Still running when recorded: the group is the one the command is in.
        recorded.append((pgid, ticks))
        assert start_ticks(pgid) == ticks

    token = current_call.set(CallScope(marker=marker, record_process=record))
    try:
        out = await run(command_tool(work), f"echo ${CALL_MARKER_ENV}")
    finally:
        current_call.reset(token)
    assert out == f"{marker}\n[exit code 0]"
    assert len(recorded) == 1 and recorded[0][1] > 0
    assert marked_processes(marker) == []


def alive(pid: int, ticks: int) -> bool:
    """Whether `pid` still runs (not a zombie) as the process that started at `ticks`."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return start_ticks(pid) == ticks and raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


# --- dying with the server ---------------------------------------------------------------

CRASHING_SERVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    import anyio

    from a2a_orchestrator.tools import Sandbox, Workspace, build_tools
    from a2a_orchestrator.tools.base import CallScope, current_call

    work, marker, record_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])


    async def record(pgid: int, ticks: int) -> None:
        record_file.write_text(f"{pgid} {ticks}")


    async def main() -> None:
        (tool,) = build_tools(["run_command"], Workspace(work), sandbox=Sandbox())
        current_call.set(CallScope(marker=marker, record_process=record))
        await tool.run({"command": "echo up > started; sleep 2; echo late > late"})


    anyio.run(main)
    """
)


@needs_bwrap
async def test_the_command_dies_with_a_killed_server(work: Path, tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(CRASHING_SERVER)
    marker = uuid.uuid4().hex
    record_file = tmp_path / "recorded"
    server = subprocess.Popen(
        [sys.executable, str(script), str(work), marker, str(record_file)],
        stdout=subprocess.DEVNULL,
    )
    try:
        with anyio.fail_after(15):
            while not (work / "started").exists():
                assert server.poll() is None, "the server script died before its command ran"
                await anyio.sleep(0.02)
            assert marked_processes(marker), "the command runs, carrying its call's marker"
            pgid, ticks = map(int, record_file.read_text().split())
            assert start_ticks(pgid) == ticks
            server.send_signal(signal.SIGKILL)
            server.wait()
            while marked_processes(marker):
                await anyio.sleep(0.02)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    # The recorded group is gone (a zombie at most: whether this machine's
    # PID 1 reaps orphans is not ours to decide), and the command never got
    # to its last step.
    assert not alive(pgid, ticks)
    # Until nothing runs the command, at most past the time its last step
    # needed: a survivor outside the marked processes would write `late`.
    await until_none(lambda: running_with_text("echo late > late"), 2.5)
    assert not (work / "late").exists()
    assert marked_processes(marker) == []


# --- refusing to start without a sandbox -------------------------------------------------


def test_run_command_is_refused_without_bubblewrap(work: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build_tools(["read_file", "run_command"], Workspace(work), sandbox=MISSING)
    message = str(info.value)
    assert "apt-get install bubblewrap" in message
    assert "--no-sandbox" in message and "A2A_SANDBOX=off" in message
    # Roles without run_command need no sandbox.
    assert [t.name for t in build_tools(["read_file"], Workspace(work), sandbox=MISSING)] == [
        "read_file"
    ]


async def test_a_role_server_refuses_to_start_without_bubblewrap(work: Path) -> None:
    with anyio.fail_after(10):
        with pytest.raises(ConfigError, match="apt-get install bubblewrap"):
            async with run_role_server(
                find_role("coder"), ScriptedModel([]), work, db=str(work / "c.db"), sandbox=MISSING
            ):
                pytest.fail("the server started")
        # Refused before its task store was opened.
        assert not (work / "c.db").exists()
        # A role that runs no commands starts all the same.
        async with run_role_server(
            find_role("architect"), ScriptedModel([]), work, db=str(work / "t.db"), sandbox=MISSING
        ) as server:
            async with httpx.AsyncClient() as http:
                card = (await http.get(f"{server.url}/.well-known/agent-card.json")).json()
    assert "unsandboxed" not in card["description"]


async def test_a_session_with_in_process_commands_refuses_without_bubblewrap(
    work: Path, tmp_path: Path
) -> None:
    network = Network.of(AgentSpec(name="coder", role="coder"))
    with anyio.fail_after(10), pytest.raises(ConfigError, match="apt-get install bubblewrap"):
        async with Session(
            Store(tmp_path / "o.db"), workdir=work, network=network, sandbox=MISSING
        ):
            pytest.fail("the session opened")


def test_serve_refuses_without_bubblewrap_on_its_path(work: Path) -> None:
    # A PATH without bwrap is what a machine without the package looks like.
    env = {**os.environ, "PATH": str(work), "A2A_SANDBOX": ""}
    result = subprocess.run(
        [sys.executable, "-m", "a2a_orchestrator.cli", "serve", "coder", "--port", "0"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "apt-get install bubblewrap" in result.stderr
    assert "--no-sandbox" in result.stderr
    assert "serving" not in result.stdout


# --- the explicit opt-out ------------------------------------------------------------------


async def test_the_opt_out_runs_commands_and_says_so_on_the_card(
    work: Path, tmp_path: Path
) -> None:
    script = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": "echo out > ../out"}}]},
        {"text": "done\nTASK_DONE"},
    ]
    with anyio.fail_after(20):
        async with run_role_server(
            find_role("coder"),
            ScriptedModel(script),
            work,
            db=str(tmp_path / "tasks.db"),
            sandbox=Sandbox(enabled=False, bwrap="/nonexistent/bwrap"),
        ) as server:
            async with httpx.AsyncClient() as http:
                card = (await http.get(f"{server.url}/.well-known/agent-card.json")).json()
            async with a2a_client(server.url) as client:
                async for _ in client.send_message(request("go")):
                    pass
    assert card["description"].endswith("(commands run unsandboxed)")
    # Unconfined means unconfined: the parent of the work directory was written.
    assert (tmp_path / "out").read_text() == "out\n"


def test_the_opt_out_from_the_command_line_is_logged_and_on_the_card(work: Path) -> None:
    env = {**os.environ, "PATH": str(work), "A2A_SANDBOX": ""}
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "a2a_orchestrator.cli",
            "serve",
            "coder",
            "--port",
            "0",
            "--no-sandbox",
        ],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            assert line, f"the server exited: {server.wait()} {server.stderr.read()}"  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("  commands:"):
                break
        url = next(line.split()[-1] for line in lines if "serving A2A at" in line)
        card = httpx.get(f"{url}/.well-known/agent-card.json", timeout=5).json()
    finally:
        server.send_signal(signal.SIGTERM)
        _, stderr = server.communicate(timeout=20)
    assert card["description"].endswith("(commands run unsandboxed)")
    assert "commands: OFF: commands run unsandboxed" in "".join(lines)
    # No unshare on that PATH either: the warning says what that leaves open.
    assert "a process a command detaches (setsid) outlives its timeout" in stderr
    assert "turned the command sandbox off" in stderr


def test_settings_come_from_flags_and_variables() -> None:
    assert Sandbox.from_env({}) == Sandbox()
    assert Sandbox.from_env({"A2A_SANDBOX": "off"}).enabled is False
    assert Sandbox.from_env({}, no_sandbox=True).enabled is False
    assert Sandbox.from_env({"A2A_SANDBOX_NETWORK": "on"}).network is True
    assert Sandbox.from_env({}, allow_network=True).network is True
    hidden = Sandbox.from_env({"A2A_SANDBOX_HIDE": f"/srv/a{os.pathsep}/srv/b"}).hidden
    assert hidden == (Path("/srv/a"), Path("/srv/b"))
    with pytest.raises(ConfigError, match="A2A_SANDBOX='maybe'"):
        Sandbox.from_env({"A2A_SANDBOX": "maybe"})


@needs_bwrap
async def test_role_servers_hide_their_task_store(work: Path, tmp_path: Path) -> None:
    store = tmp_path / "elsewhere" / "tasks.db"
    store.parent.mkdir()
    script = [
        {
            "tool_calls": [
                {"name": "run_command", "arguments": {"command": f"cat {store} | wc -c > size"}}
            ]
        },
        {"text": "done\nTASK_DONE"},
    ]
    with anyio.fail_after(20):
        async with role_server(work, script, db=store) as server, a2a_client(server.url) as client:
            async for _ in client.send_message(request("go")):
                pass
    assert store.stat().st_size > 0
    assert (work / "size").read_text().strip() == "0"
