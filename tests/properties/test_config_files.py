"""Every operator file words a bad value one way: the file (and the entry in
it), the key path, what a good value is and what the file has instead."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from a2a_orchestrator.control.reactions import load_reactions
from a2a_orchestrator.delegation.hooks import load_hook_file
from a2a_orchestrator.delegation.network import load_agent_file
from a2a_orchestrator.delegation.policy import load_policy_file
from a2a_orchestrator.errors import ConfigError, RoleFileError
from a2a_orchestrator.runtime.budgets import PriceTable
from a2a_orchestrator.runtime.roles import load_role_file
from a2a_orchestrator.server.auth.callers import CallerFile

HASH = "sha256:00112233445566778899aabbccddeeff:" + "0" * 64

LOADERS: dict[str, Callable[[Path], object]] = {
    "role": load_role_file,
    "agent": lambda path: load_agent_file(path, environ={}),
    "callers": CallerFile,
    "hooks": load_hook_file,
    "policy": load_policy_file,
    "reactions": load_reactions,
    "prices": PriceTable.load,
}

# (kind, file name, text, where after the file's path, key path, problem)
CASES = [
    (
        "role",
        "coder.md",
        "---\nmax_turns: 0\n---\nCode.\n",
        "",
        "max_turns",
        "must be a positive integer, got 0",
    ),
    (
        "role",
        "coder.md",
        "---\nsandbox_network: 1\n---\nCode.\n",
        "",
        "sandbox_network",
        "must be true or false, got 1",
    ),
    (
        "role",
        "coder.json",
        '{"prompt": "Code.", "tools": ["read_file", ""]}',
        "",
        "tools",
        "must be a list of non-empty strings, got ['read_file', '']",
    ),
    (
        "role",
        "coder.md",
        "---\nbudget: {tokens: -5}\n---\nCode.\n",
        "",
        "budget.tokens",
        "must be a positive number, got -5",
    ),
    (
        "agent",
        "coder.toml",
        'role = "coder"\nport = 70000\n',
        "",
        "port",
        "must be an integer from 1 to 65535, got 70000",
    ),
    (
        "agent",
        "coder.toml",
        'role = "coder"\npush = "yes"\n',
        "",
        "push",
        "must be true or false, got 'yes'",
    ),
    ("agent", "coder.toml", "", "", "role", "missing; the role this agent plays"),
    (
        "callers",
        "callers.toml",
        f'[callers.ops]\ntoken_hash = "{HASH}"\noperator = "yes"\n',
        "",
        "callers.ops.operator",
        "must be true or false, got 'yes'",
    ),
    (
        "callers",
        "callers.toml",
        "[subjects.billing]\ntokens_per_day = -1\n",
        "",
        "subjects.billing.tokens_per_day",
        "must be an integer >= 0, got -1",
    ),
    (
        "hooks",
        "hooks.toml",
        "[[hook]]\non = 'complete'\ncommand = ''\n",
        ": hook 1",
        "command",
        "must be a non-empty string, got ''",
    ),
    (
        "policy",
        "policy.toml",
        "[[rule]]\nagent = 'coder'\n[[rule]]\ntransport = 'carrier-pigeon'\n",
        ": rule 2",
        "transport",
        "must be one of 'local' or 'remote', got 'carrier-pigeon'",
    ),
    (
        "policy",
        "policy.toml",
        "[[rule]]\ntools = 'read_file'\n",
        ": rule 1",
        "tools",
        "must be a list of non-empty strings, got 'read_file'",
    ),
    (
        "reactions",
        "reactions.toml",
        "[[reaction]]\nsignal = 'pause'\nonce = 'always'\n",
        ": reaction 1",
        "once",
        "must be true or false, got 'always'",
    ),
    (
        "prices",
        "prices.toml",
        '[models."gpt-4o"]\ninput = 2.5\noutput = -10\n',
        "",
        "models.gpt-4o.output",
        "must be a number >= 0 (per 1M tokens), got -10",
    ),
    (
        "prices",
        "prices.toml",
        '[models."gpt-4o"]\ninput = 2.5\ncached = 1.0\noutput = 10\n',
        "",
        "models.gpt-4o.cached",
        "unknown field; known fields are input, output",
    ),
]


@pytest.mark.parametrize(
    ("kind", "name", "text", "entry", "key", "problem"),
    CASES,
    ids=[f"{case[0]}-{case[4]}" for case in CASES],
)
def test_a_bad_value_names_file_key_path_and_problem(
    tmp_path: Path, kind: str, name: str, text: str, entry: str, key: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        LOADERS[kind](path)
    # The callers file is named as "callers file PATH", as its other errors
    # (missing, unreadable) name it.
    prefix = "callers file " if kind == "callers" else ""
    assert str(caught.value) == f"{prefix}{path}{entry}: field {key!r}: {problem}"
    if kind == "role":
        assert isinstance(caught.value, RoleFileError)
        assert (caught.value.path, caught.value.field) == (str(path), key)


def test_an_unknown_key_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "hooks.toml"
    path.write_text("[[hook]]\non = 'complete'\ncommand = 'true'\nwhen = 'always'\n")
    with pytest.raises(ConfigError) as caught:
        load_hook_file(path)
    assert str(caught.value) == (
        f"{path}: hook 1: field 'when': unknown field; known fields are command, on"
    )


def test_commands_that_read_no_file_do_not_import_pydantic() -> None:
    # The schemas import pydantic (tens of ms); `--help` and `status --help`
    # read no operator file, so they must not pay for it.
    code = (
        "import sys\n"
        "from a2a_orchestrator.cli import main\n"
        "for argv in (['--help'], ['status', '--help'], ['run', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('pydantic' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines()[-1] == "False", result.stdout


@pytest.mark.parametrize(
    ("kind", "name", "key"),
    [("hooks", "hooks.toml", "hook"), ("policy", "policy.toml", "rule")],
)
def test_a_misspelt_table_is_refused_not_ignored(
    tmp_path: Path, kind: str, name: str, key: str
) -> None:
    # `[[hooks]]` for `[[hook]]` used to load a file with no hooks at all: a
    # spawn.before hook meant to deny spawns was silently gone.
    path = tmp_path / name
    path.write_text(f"[[{key}s]]\nagent = 'coder'\n")
    with pytest.raises(ConfigError) as caught:
        LOADERS[kind](path)
    assert str(caught.value) == (f"{path}: field '{key}s': unknown field; known fields are {key}")
