"""Hook files: clear errors naming the file and the entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.hooks import Hooks, load_hook_file


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[hook]]\non = 'spawn.never'\ncommand = 'true'\n", "field 'on' must be one of"),
        ("[[hook]]\non = 'complete'\n", "field 'command' must be a non-empty string"),
        ("[[hook]]\non = 'complete'\ncommand = 'true'\nwhen = 1\n", "unknown field(s) ['when']"),
        ("hook = 3\n", "'hook' must be an array of tables"),
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

    from a2a_orchestrator.hooks import Deny, SpawnInfo

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
