"""Hook files: clear errors naming the file and the entry; hooks run before the gate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import plane_for

from a2a_orchestrator.control.plane import GATE_MESSAGE
from a2a_orchestrator.delegation.hooks import Deny, Hooks, SpawnInfo, load_hook_file
from a2a_orchestrator.errors import ConfigError, SpawnRefusedError


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[hook]]\non = 'spawn.never'\ncommand = 'true'\n", "field 'on': must be one of"),
        ("[[hook]]\non = 'complete'\n", "field 'command': missing"),
        ("[[hook]]\non = 'complete'\ncommand = 'true'\nwhen = 1\n", "field 'when': unknown field"),
        ("hook = 3\n", "field 'hook': must be an array of tables"),
        ("[[hook]\n", "hooks.toml"),
    ],
)
def test_malformed_hook_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "hooks.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_hook_file(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_unknown_hook_point_from_python() -> None:
    with pytest.raises(ConfigError, match="unknown hook point"):
        Hooks().on("spawn.sometimes", lambda info: None)  # type: ignore[arg-type]


def test_missing_hook_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read hook file"):
        load_hook_file(tmp_path / "absent.toml")


@pytest.mark.anyio
async def test_a_hook_that_ignores_its_payload_still_decides(tmp_path: Path) -> None:
    """A hook that exits without reading stdin used to break the spawn (broken pipe)."""
    import anyio

    from a2a_orchestrator.delegation.hooks import Deny, SpawnInfo

    path = tmp_path / "hooks.toml"
    path.write_text(
        "[[hook]]\non = 'spawn.before'\ncommand = \"sh -c 'echo no way >&2; exit 3'\"\n"
        "[[hook]]\non = 'complete'\ncommand = 'no-such-command-here'\n"
    )
    hooks = load_hook_file(path)
    info = SpawnInfo(session_id="s", parent_id="p", role="coder", prompt="x" * 1_000_000)
    with anyio.fail_after(10):
        verdict = await hooks.before_spawn(info)
    assert verdict == Deny("no way")


@pytest.mark.anyio
async def test_spawn_before_runs_before_the_gate(tmp_path: Path) -> None:
    hooks = Hooks()
    deciding = anyio.Event()
    decide = anyio.Event()

    async def no_reviewers(info: SpawnInfo) -> Deny | None:
        if info.role != "reviewer":
            return None
        deciding.set()
        await decide.wait()  # a hook that takes its time (a command, a policy service)
        return Deny("no reviewers today")

    hooks.on("spawn.before", no_reviewers)
    refusals: list[str] = []

    async def spawn_reviewer(plane: Any) -> None:
        try:
            await plane.spawn_agent("reviewer", "review")
        except SpawnRefusedError as exc:
            refusals.append(str(exc))

    with anyio.fail_after(20):
        async with plane_for("local", tmp_path, hooks=hooks, max_concurrent=1) as plane:
            async with anyio.create_task_group() as group:
                group.start_soon(spawn_reviewer, plane)
                await deciding.wait()
                # The reviewer's hook is still deciding: it holds no slot, so
                # the one slot is free for this child.
                coder = await plane.spawn_agent("coder", "sleep for a while")
                decide.set()
            # The gate is full now; a spawn the hook denies says why it was
            # denied, not that the gate is full.
            await spawn_reviewer(plane)
            # And a spawn the hook allows meets the gate.
            with pytest.raises(SpawnRefusedError, match=GATE_MESSAGE):
                await plane.spawn_agent("coder", "one more")
            running = coder.running
    assert running
    assert refusals == ["Subagent spawn denied: no reviewers today"] * 2
