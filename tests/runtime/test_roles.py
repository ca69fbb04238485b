"""Role files: the shipped roles, both file formats, lookup order, and errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from a2a_orchestrator.errors import ConfigError, RoleFileError, RoleNotFoundError
from a2a_orchestrator.runtime import lookup, roles
from a2a_orchestrator.runtime.lookup import shipped_dir
from a2a_orchestrator.runtime.roles import (
    Role,
    find_role,
    list_roles,
    load_role_file,
    role_dirs,
    shipped_roles_dir,
)

SHIPPED = ["architect", "coder", "observer", "orchestrator", "reviewer"]
SIGNALS = ["TASK_DONE", "TASK_FAILED", "TASK_SKIPPED"]


def write_role(directory: Path, filename: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / filename
    path.write_text(text, encoding="utf-8")
    return path


def md_role(description: str, prompt: str = "You help.") -> str:
    return f"---\ndescription: {description}\n---\n{prompt}\n"


# --- the shipped roles --------------------------------------------------------


def test_shipped_dir_holds_the_shipped_roles() -> None:
    names = sorted(p.stem for p in shipped_roles_dir().glob("*.md"))
    assert names == SHIPPED


def test_shipped_roles_are_found_from_an_empty_directory(tmp_path: Path) -> None:
    found = list_roles(cwd=tmp_path, home=tmp_path)
    assert sorted(found) == SHIPPED
    for name, role in found.items():
        assert role.name == name
        assert role.source == shipped_roles_dir() / f"{name}.md"
        assert role.description, name
        assert role.model in {"default", "mini"}
        assert role.skills, name
        assert len(role.prompt) > 500, name  # a real prompt, not a stub


def test_architect(tmp_path: Path) -> None:
    role = find_role("architect", cwd=tmp_path, home=tmp_path)
    assert role.tools == ("read_file", "list_files", "grep", "ask_parent")
    assert role.model == "default"
    assert role.max_turns == 8
    assert role.timeout == 300.0
    assert "software-design" in role.skills
    headings = ["## Approach", "## Components", "## Design decisions", "## Risks"]
    positions = [role.prompt.find(h) for h in headings]
    assert all(p >= 0 for p in positions), positions
    assert positions == sorted(positions)
    assert "no implementation code" in role.prompt.lower()
    assert "write_file" not in role.tools


def test_coder(tmp_path: Path) -> None:
    role = find_role("coder", cwd=tmp_path, home=tmp_path)
    assert role.tools == (
        "read_file",
        "list_files",
        "grep",
        "write_file",
        "edit_file",
        "run_command",
        "ask_parent",
    )
    assert role.max_turns == 30
    assert role.timeout == 600.0
    for signal in SIGNALS:
        # Each signal is written alone on a line and explained.
        assert f"\n{signal}\n" in role.prompt, signal
    assert "last line" in role.prompt


def test_reviewer(tmp_path: Path) -> None:
    role = find_role("reviewer", cwd=tmp_path, home=tmp_path)
    assert role.tools == ("read_file", "list_files", "grep", "run_command")
    assert not {"write_file", "edit_file"} & set(role.tools)
    assert role.max_turns == 12
    for signal in SIGNALS:
        assert f"\n{signal}\n" in role.prompt, signal
    assert "overrides" in role.prompt
    for aspect in ("Correctness", "Completeness", "Quality"):
        assert aspect in role.prompt


def test_observer(tmp_path: Path) -> None:
    role = find_role("observer", cwd=tmp_path, home=tmp_path)
    assert role.tools == ("read_file", "list_files", "grep", "supervisor")
    assert role.max_turns == 40
    for action in ("spawn", "subscribe", "send", "resume", "pause_child"):
        assert f"`{action}`" in role.prompt, action
    assert '"success": false' in role.prompt


def test_wheel_layout_prefers_shipped_roles_inside_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "site-packages" / "a2a_orchestrator"
    (package / "_shipped_roles").mkdir(parents=True)
    monkeypatch.setattr(lookup, "_PACKAGE", package)
    assert shipped_roles_dir() == package / "_shipped_roles"
    assert shipped_dir("agents") == tmp_path / "site-packages" / "agents"


def test_source_layout_falls_back_to_repository_roles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "repo" / "a2a_orchestrator"
    package.mkdir(parents=True)
    monkeypatch.setattr(lookup, "_PACKAGE", package)
    assert shipped_roles_dir() == tmp_path / "repo" / "roles"


# --- file formats -------------------------------------------------------------


def test_markdown_role_with_every_field(tmp_path: Path) -> None:
    path = write_role(
        tmp_path,
        "tester.md",
        "---\n"
        "name: tester\n"
        "description: Writes tests.\n"
        "model: scripted:turns.json\n"
        "tools: [read_file, grep, read_file]\n"
        "skills: [testing]\n"
        "max_turns: 5\n"
        "timeout: 2.5\n"
        "---\n"
        "\n"
        "You write tests.\n"
        "---\n"
        "A rule inside the body stays in the prompt.\n",
    )
    role = load_role_file(path)
    assert role == Role(
        name="tester",
        description="Writes tests.",
        prompt="You write tests.\n---\nA rule inside the body stays in the prompt.",
        model="scripted:turns.json",
        tools=("read_file", "grep"),
        skills=("testing",),
        max_turns=5,
        timeout=2.5,
        source=path,
    )


def test_markdown_without_front_matter_is_all_prompt(tmp_path: Path) -> None:
    role = load_role_file(write_role(tmp_path, "plain.md", "Just a prompt.\n"))
    assert role.name == "plain"
    assert role.prompt == "Just a prompt."
    assert (role.model, role.tools, role.max_turns, role.timeout) == ("default", (), 10, 60.0)


def test_json_creo_shape(tmp_path: Path) -> None:
    creo = {
        "prompt": "Ты — ревьюер кода. Анализируй изменения...",
        "model": "mini",
        "skills": ["code-review-skill"],
        "tools": ["read", "grep", "glob"],
    }
    path = write_role(tmp_path, "reviewer.json", json.dumps(creo, ensure_ascii=False))
    role = load_role_file(path)
    assert role.name == "reviewer"
    assert role.prompt == creo["prompt"]
    assert role.model == "mini"
    assert role.skills == ("code-review-skill",)
    assert role.tools == ("read", "grep", "glob")
    assert role.description == ""
    assert role.max_turns == 10
    assert role.timeout == 60.0
    assert role.source == path


def test_json_optional_fields(tmp_path: Path) -> None:
    data = {
        "name": "helper",
        "prompt": "Help.",
        "description": "Helps.",
        "max_turns": 3,
        "timeout": 7,
    }
    role = load_role_file(write_role(tmp_path, "helper.json", json.dumps(data)))
    assert (role.description, role.max_turns, role.timeout) == ("Helps.", 3, 7.0)
    assert isinstance(role.timeout, float)


MALFORMED = [
    ("yaml_syntax.md", "---\ntools: [read_file\n---\nHi.\n", None),
    ("not_mapping.md", "---\n- read_file\n- grep\n---\nHi.\n", None),
    ("not_closed.md", "---\nmodel: mini\nHi.\n", None),
    ("empty_body.md", "---\nmodel: mini\n---\n  \n\n", "prompt"),
    ("prompt_in_header.md", "---\nprompt: Hi.\n---\nHi.\n", "prompt"),
    ("tools_string.md", "---\ntools: read_file\n---\nHi.\n", "tools"),
    ("tools_number.md", "---\ntools: [read_file, 3]\n---\nHi.\n", "tools"),
    ("skills_mapping.md", "---\nskills: {a: b}\n---\nHi.\n", "skills"),
    ("turns_zero.md", "---\nmax_turns: 0\n---\nHi.\n", "max_turns"),
    ("turns_text.md", "---\nmax_turns: ten\n---\nHi.\n", "max_turns"),
    ("turns_float.md", "---\nmax_turns: 2.5\n---\nHi.\n", "max_turns"),
    ("turns_bool.md", "---\nmax_turns: true\n---\nHi.\n", "max_turns"),
    ("timeout_negative.md", "---\ntimeout: -1\n---\nHi.\n", "timeout"),
    ("timeout_text.md", "---\ntimeout: soon\n---\nHi.\n", "timeout"),
    ("timeout_inf.md", "---\ntimeout: .inf\n---\nHi.\n", "timeout"),
    ("model_empty.md", "---\nmodel: ''\n---\nHi.\n", "model"),
    ("description_list.md", "---\ndescription: [a]\n---\nHi.\n", "description"),
    ("unknown.md", "---\ntemperature: 0.2\n---\nHi.\n", "temperature"),
    ("other_name.md", "---\nname: someone-else\n---\nHi.\n", "name"),
    ("BadStem.md", "Hi.\n", "name"),
    ("json_syntax.json", '{"prompt": "Hi.",}', None),
    ("json_array.json", '["Hi."]', None),
    ("json_no_prompt.json", '{"model": "mini"}', "prompt"),
    ("json_empty_prompt.json", '{"prompt": "   "}', "prompt"),
    ("json_tools.json", '{"prompt": "Hi.", "tools": "grep"}', "tools"),
    ("json_unknown.json", '{"prompt": "Hi.", "temprature": 1}', "temprature"),
    ("json_name.json", '{"prompt": "Hi.", "name": "other"}', "name"),
    ("json_timeout.json", '{"prompt": "Hi.", "timeout": 0}', "timeout"),
    ("wrong_suffix.yaml", "prompt: Hi.\n", None),
]


@pytest.mark.parametrize(("filename", "text", "field"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_file_names_file_and_field(
    tmp_path: Path, filename: str, text: str, field: str | None
) -> None:
    path = write_role(tmp_path, filename, text)
    with pytest.raises(RoleFileError) as caught:
        load_role_file(path)
    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert str(path) in str(caught.value)
    if field is not None:
        assert repr(field) in str(caught.value)


def test_unreadable_file_is_a_role_file_error(tmp_path: Path) -> None:
    missing = tmp_path / "ghost.md"
    with pytest.raises(RoleFileError) as caught:
        load_role_file(missing)
    assert caught.value.path == str(missing)


# --- lookup -------------------------------------------------------------------


def test_role_dirs_order(tmp_path: Path) -> None:
    cwd, home = tmp_path / "project", tmp_path / "home"
    assert role_dirs(cwd, home) == [
        cwd / "roles",
        cwd / ".a2a" / "roles",
        home / ".config" / "a2a-orchestrator" / "roles",
        shipped_roles_dir(),
    ]


def test_role_dirs_lists_the_shipped_dir_once(tmp_path: Path) -> None:
    repo_root = shipped_roles_dir().parent
    assert role_dirs(repo_root, tmp_path).count(repo_root / "roles") == 1
    assert len(role_dirs(repo_root, tmp_path)) == 3


def test_lookup_order_first_hit_wins(tmp_path: Path) -> None:
    cwd, home = tmp_path / "project", tmp_path / "home"
    layers = [
        ("home", home / ".config" / "a2a-orchestrator" / "roles"),
        ("project-local", cwd / ".a2a" / "roles"),
        ("project", cwd / "roles"),
    ]
    # With nothing else, the shipped coder answers.
    assert find_role("coder", cwd=cwd, home=home).source == shipped_roles_dir() / "coder.md"
    # Each higher-priority layer, once it has a coder, beats every layer below
    # (a file added after the first lookup counts after the operator's reload).
    for label, directory in layers:
        path = write_role(directory, "coder.md", md_role(label))
        roles.reload_roles()
        role = find_role("coder", cwd=cwd, home=home)
        assert role.description == label
        assert role.source == path
        assert list_roles(cwd=cwd, home=home)["coder"].description == label


def test_md_beats_json_in_one_directory(tmp_path: Path) -> None:
    directory = tmp_path / "roles"
    write_role(directory, "helper.json", json.dumps({"prompt": "From JSON."}))
    write_role(directory, "helper.md", "From Markdown.\n")
    assert find_role("helper", cwd=tmp_path, home=tmp_path).prompt == "From Markdown."
    assert list_roles(cwd=tmp_path, home=tmp_path)["helper"].prompt == "From Markdown."


def test_directory_priority_beats_suffix_priority(tmp_path: Path) -> None:
    write_role(tmp_path / "roles", "helper.json", json.dumps({"prompt": "Project JSON."}))
    write_role(tmp_path / ".a2a" / "roles", "helper.md", "Local Markdown.\n")
    assert find_role("helper", cwd=tmp_path, home=tmp_path).prompt == "Project JSON."


def test_unknown_role_lists_known_roles(tmp_path: Path) -> None:
    write_role(tmp_path / "roles", "zeta.md", "Z.\n")
    write_role(tmp_path / ".a2a" / "roles", "alpha.json", json.dumps({"prompt": "A."}))
    with pytest.raises(RoleNotFoundError) as caught:
        find_role("nobody", cwd=tmp_path, home=tmp_path)
    expected = sorted(["alpha", "zeta", *SHIPPED])
    assert caught.value.name == "nobody"
    assert caught.value.known == expected
    assert ", ".join(expected) in str(caught.value)


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "../roles/coder", "a/b", "Coder", "", ".hidden", "-x", "coder.md"]
)
def test_invalid_role_name_is_refused(tmp_path: Path, name: str) -> None:
    # A file the traversal would reach, to prove it is not read.
    write_role(tmp_path, "passwd.md", "Secret.\n")
    with pytest.raises(ConfigError) as caught:
        find_role(name, cwd=tmp_path / "project", home=tmp_path)
    assert not isinstance(caught.value, RoleNotFoundError)
    assert "Invalid role name" in str(caught.value)


def test_list_roles_raises_for_a_malformed_winner(tmp_path: Path) -> None:
    path = write_role(tmp_path / "roles", "broken.md", "---\nmax_turns: -3\n---\nHi.\n")
    with pytest.raises(RoleFileError) as caught:
        list_roles(cwd=tmp_path, home=tmp_path)
    assert (caught.value.path, caught.value.field) == (str(path), "max_turns")


def test_shadowed_malformed_file_is_never_read(tmp_path: Path) -> None:
    write_role(tmp_path / ".a2a" / "roles", "coder.md", "---\n: [\n---\n")
    write_role(tmp_path / "roles", "coder.md", md_role("mine"))
    assert find_role("coder", cwd=tmp_path, home=tmp_path).description == "mine"
    assert list_roles(cwd=tmp_path, home=tmp_path)["coder"].description == "mine"


def test_files_that_are_not_roles_are_ignored(tmp_path: Path) -> None:
    write_role(tmp_path / "roles", "README.md", "How to write roles.\n")
    write_role(tmp_path / "roles", "notes.txt", "scratch\n")
    assert sorted(list_roles(cwd=tmp_path, home=tmp_path)) == SHIPPED


# --- the value object ---------------------------------------------------------


def test_role_defaults_and_frozen() -> None:
    role = Role(name="x", prompt="p")
    assert (role.model, role.tools, role.skills) == ("default", (), ())
    assert (role.max_turns, role.timeout, role.source) == (10, 60.0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        role.model = "mini"  # type: ignore[misc]


def test_with_overrides(tmp_path: Path) -> None:
    coder = find_role("coder", cwd=tmp_path, home=tmp_path)
    changed = coder.with_overrides(model="mini", tools=["read_file"], max_turns=3, timeout=5)
    assert (changed.model, changed.tools, changed.max_turns) == ("mini", ("read_file",), 3)
    assert changed.timeout == 5.0
    assert (changed.name, changed.prompt, changed.source) == (
        coder.name,
        coder.prompt,
        coder.source,
    )
    assert coder.model == "default"  # the original is untouched
    assert coder.with_overrides() == coder


@pytest.mark.parametrize(
    "overrides",
    [{"max_turns": 0}, {"max_turns": True}, {"timeout": -1.0}, {"prompt": " "}, {"model": ""}],
)
def test_with_overrides_refuses_bad_values(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Role(name="x", prompt="p").with_overrides(**overrides)  # type: ignore[arg-type]


def test_all_exports_exist() -> None:
    for name in roles.__all__:
        assert hasattr(roles, name), name


# --- the role cache -----------------------------------------------------------


def test_a_role_file_is_read_once_and_an_edit_is_taken_at_the_reload(tmp_path: Path) -> None:
    path = write_role(tmp_path / "roles", "cached.md", md_role("first", "Prompt one."))
    before = roles.role_cache.parses
    first = find_role("cached", cwd=tmp_path, home=tmp_path)
    again = find_role("cached", cwd=tmp_path, home=tmp_path)
    assert roles.role_cache.parses == before + 1
    assert again == first and again.prompt == "Prompt one."

    # A longer text: the size changes even where the clock's grain would not.
    path.write_text(md_role("second", "Prompt two, edited."), encoding="utf-8")
    assert find_role("cached", cwd=tmp_path, home=tmp_path) == first
    roles.reload_roles()
    edited = find_role("cached", cwd=tmp_path, home=tmp_path)
    assert edited.description == "second" and edited.prompt == "Prompt two, edited."
    # An explicit load of the same file finds it cached.
    parsed = roles.role_cache.parses
    assert load_role_file(path) == edited
    assert roles.role_cache.parses == parsed


def test_a_replaced_role_file_is_read_again(tmp_path: Path) -> None:
    path = write_role(tmp_path, "swapped.md", md_role("old", "Same size A."))
    assert load_role_file(path).prompt == "Same size A."
    before = roles.role_cache.parses
    # Same size, put in place by rename (as editors save): a new inode.
    replacement = write_role(tmp_path, "tmp-swapped.md", md_role("old", "Same size B."))
    replacement.replace(path)
    assert load_role_file(path).prompt == "Same size B."
    assert roles.role_cache.parses == before + 1


def test_a_broken_role_file_is_not_cached(tmp_path: Path) -> None:
    path = write_role(tmp_path, "broken.md", "---\nmax_turns: 0\n---\nPrompt.\n")
    with pytest.raises(RoleFileError):
        load_role_file(path)
    path.write_text("---\nmax_turns: 3\n---\nPrompt.\n", encoding="utf-8")
    assert load_role_file(path).max_turns == 3
