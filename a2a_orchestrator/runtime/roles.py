"""Roles: named specialists, loaded from files and found by name.

A role file is either Markdown with YAML front matter (the body is the
prompt) or JSON in the Creo shape (`prompt`, `model`, `skills`, `tools`, and
optionally `description`, `max_turns`, `timeout`, `models`, `sandbox_network`,
`model_timeout`, `model_retries`, `budget`).
Either way the role's name is the file's stem; a `name` field, when present, must agree with it.

Lookup contract: `role_dirs()` lists the directories in priority order, and
the first directory holding `<name>.md` or `<name>.json` wins (within one
directory `.md` beats `.json`). A broken file in one directory never hides
a good role in another; `list_roles()` raises `RoleFileError` for the first
broken file it loads.

What configures a run is never writable by a run: the directories of one
project (`cwd`, `home`) are read once, at the first lookup there or at
`read_roles()` (`serve`, `run`, `resume` and `demo` call it at start, before
any model runs), and every later lookup answers from that snapshot. A role file a
command or a file tool writes while the process runs (a `roles/` a command
created, a shipped role shadowed, an edited one) is never taken; the
operator's change needs a restart, or `reload_roles()` from the Python API.
A spawn's lookup is a dictionary read.

Parsed files are cached by the file's path and its (modification
time in ns, size, inode), so a snapshot taken again (`reload_roles()`) or
`load_role_file` on an unchanged file does not read or parse it again. Only
good files are cached; a broken one is read (and refused) each time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import Field, StrictStr, ValidationError

from ..configfile import (
    Count,
    Flag,
    NameList,
    OperatorFile,
    PositiveInt,
    PositiveNumber,
    SecondsOrZero,
    Text,
    describe,
)
from ..errors import ConfigError, RoleFileError, RoleNotFoundError
from .budgets import Budget, BudgetError
from .lookup import lookup_dirs, shipped_dir

__all__ = [
    "ROLE_NAME_PATTERN",
    "Role",
    "RoleCache",
    "find_role",
    "list_roles",
    "load_role_file",
    "read_roles",
    "reload_roles",
    "role_cache",
    "role_dirs",
    "role_names",
    "shipped_roles_dir",
    "validate_role_name",
]

ROLE_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*")
"""What a role name may look like. Names become file names, so anything with
a dot or a slash (`../etc/passwd`) is refused before it reaches the disk."""

# Priority order inside one directory: the first suffix found wins.
_SUFFIXES = (".md", ".json")


class _MarkdownRole(OperatorFile):
    """A Markdown role's front matter: the prompt is the file's body."""

    name: StrictStr | None = None
    description: StrictStr | None = None
    model: Text = "default"
    models: NameList | None = None
    tools: NameList | None = None
    skills: NameList | None = None
    max_turns: PositiveInt = 10
    timeout: PositiveNumber = 60.0
    sandbox_network: Flag = False
    model_timeout: SecondsOrZero | None = None
    model_retries: Count | None = None
    budget: Any = None
    """Checked by `Budget.from_dict`, which a child's config shares."""


class _JsonRole(_MarkdownRole):
    """A JSON role: the prompt is a field."""

    prompt: Annotated[Text, Field(description="the system prompt")]


_Fields = TypeVar("_Fields", bound=_MarkdownRole)


_FRONT_MATTER_FENCE = "---"


@dataclass(frozen=True, kw_only=True)
class Role:
    """A named specialist: what it is told, which model runs it, what it may use."""

    name: str
    """The role's name, equal to its file's stem (`coder` for `coder.md`)."""
    description: str = ""
    """One line for people and agent cards: what to hand this role."""
    prompt: str
    """The system prompt."""
    model: str = "default"
    """`default`, `mini`, a concrete model name, or `scripted[:path]`."""
    models: tuple[str, ...] = ()
    """Model names a caller over A2A may choose for its child, besides `default`
    and `mini` (the role file's `models` list; scripts are refused at start-up)."""
    tools: tuple[str, ...] = ()
    """The tool allow-list; the role gets these tools and no others."""
    skills: tuple[str, ...] = ()
    """Short skill ids (`software-design`), advertised on the agent card."""
    max_turns: int = 10
    """Most model turns one conversation may take."""
    timeout: float = 60.0
    """Most seconds one conversation may run."""
    sandbox_network: bool = False
    """Whether `run_command`'s sandbox lets this role's commands use the
    network. Set by the role file only: a child's configuration cannot."""
    model_timeout: float | None = None
    """Seconds without a byte from the model endpoint before a model call is
    retried or fails, 0 for no limit; `None` keeps the operator's
    `A2A_MODEL_TIMEOUT` (15 s). Raise it for a model that thinks long before
    its first token. Set by the role file only."""
    model_retries: int | None = None
    """Attempts after the first for one model call; `None` keeps the
    operator's `A2A_MODEL_RETRIES` (2). Set by the role file only."""
    budget: Budget | None = None
    """The most one child of this role (with its own children) may spend:
    tokens, seconds, model calls, cost (`budgets.py`). A child's config and
    a spawn policy only narrow it."""
    no_network: bool = False
    """Set by a child's config (`network: false`): its commands get no
    network, whatever the operator and `sandbox_network` allow."""
    source: Path | None = None
    """The file the role was loaded from; `None` for roles built in code."""

    def with_overrides(
        self,
        *,
        description: str | None = None,
        prompt: str | None = None,
        model: str | None = None,
        tools: Iterable[str] | None = None,
        skills: Iterable[str] | None = None,
        max_turns: int | None = None,
        timeout: float | None = None,
    ) -> Role:
        """A copy with the given fields replaced; `None` keeps the current value.

        Raises `ConfigError` for an empty prompt or model, or a limit that is
        not positive, so a bad override fails here rather than mid-run.
        """
        changes: dict[str, Any] = {}
        if description is not None:
            changes["description"] = description
        if prompt is not None:
            if not prompt.strip():
                raise ConfigError(f"role {self.name!r}: prompt override is empty")
            changes["prompt"] = prompt
        if model is not None:
            if not model.strip():
                raise ConfigError(f"role {self.name!r}: model override is empty")
            changes["model"] = model.strip()
        if tools is not None:
            changes["tools"] = tuple(tools)
        if skills is not None:
            changes["skills"] = tuple(skills)
        if max_turns is not None:
            if not _is_positive_int(max_turns):
                raise ConfigError(f"role {self.name!r}: max_turns must be a positive integer")
            changes["max_turns"] = max_turns
        if timeout is not None:
            if not _is_positive_number(timeout):
                raise ConfigError(f"role {self.name!r}: timeout must be a positive number")
            changes["timeout"] = float(timeout)
        return dataclasses.replace(self, **changes)


def validate_role_name(name: str) -> str:
    """Return `name` if it is a valid role name, else raise `ConfigError`."""
    if not isinstance(name, str) or not ROLE_NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"Invalid role name {name!r}: use lowercase letters, digits, '-' and '_', "
            "starting with a letter or digit"
        )
    return name


def shipped_roles_dir() -> Path:
    """The directory of the roles that ship with the package."""
    return shipped_dir("roles")


def role_dirs(
    cwd: str | os.PathLike[str] | None = None, home: str | os.PathLike[str] | None = None
) -> list[Path]:
    """The lookup directories, highest priority first.

    `./roles/`, `./.a2a/roles/` (under `cwd`), `~/.config/a2a-orchestrator/roles/`
    (under `home`), then the shipped roles. Directories that do not exist are
    listed all the same; lookup skips them. A directory reached twice (running
    from the repository root makes `./roles/` the shipped one) is listed once.
    """
    return lookup_dirs("roles", cwd=cwd, home=home)


def find_role(
    name: str,
    *,
    cwd: str | os.PathLike[str] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> Role:
    """The role called `name`, from the first lookup directory that had it
    when this project's roles were read (see the module docstring).

    Raises `ConfigError` for an invalid name, `RoleNotFoundError` (listing
    every known role, sorted) when no directory had it, and `RoleFileError`
    when the file found is malformed.
    """
    validate_role_name(name)
    found = _snapshot(cwd, home).get(name)
    if found is None:
        raise RoleNotFoundError(name, role_names(cwd, home))
    if isinstance(found, RoleFileError):
        # The same refusal each time, not a traceback that grows with each raise.
        raise found.with_traceback(None)
    return found


def list_roles(
    *,
    cwd: str | os.PathLike[str] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> dict[str, Role]:
    """Every role reachable by name, sorted by name, each from its winning file.

    Raises `RoleFileError` for the first winning file (by name) that is
    malformed; a shadowed file is never read.
    """
    listed: dict[str, Role] = {}
    for name, found in sorted(_snapshot(cwd, home).items()):
        if isinstance(found, RoleFileError):
            raise found.with_traceback(None)
        listed[name] = found
    return listed


def read_roles(
    cwd: str | os.PathLike[str] | None = None, home: str | os.PathLike[str] | None = None
) -> list[Role]:
    """Take this project's snapshot now, if no lookup has: the commands that
    run models call it at start, before any model runs (`commands`). A
    broken file is refused when its role is asked for, as always.

    Returns the snapshot's good roles (the commands read their model
    scripts at start too: `models.config.read_scripts`)."""
    return [found for found in _snapshot(cwd, home).values() if isinstance(found, Role)]


def role_names(
    cwd: str | os.PathLike[str] | None = None, home: str | os.PathLike[str] | None = None
) -> list[str]:
    """Every role name of this project's snapshot, sorted (a broken file's
    too): the roles an error may list as known."""
    return sorted(_snapshot(cwd, home))


def reload_roles() -> None:
    """Forget every project's snapshot: the next lookup reads the role
    directories again. The operator's reload, never a model's: nothing a
    run does calls it."""
    with _snapshots_lock:
        _snapshots.clear()


# What each project's lookup found, by (cwd, home) as given: a role, or the
# refusal of its broken file. Never evicted: a snapshot dropped and taken
# again would take what a run wrote since.
_snapshots: dict[tuple[str, str], dict[str, Role | RoleFileError]] = {}
_snapshots_lock = threading.Lock()


def _snapshot(
    cwd: str | os.PathLike[str] | None, home: str | os.PathLike[str] | None
) -> dict[str, Role | RoleFileError]:
    key = (
        os.getcwd() if cwd is None else os.fspath(cwd),
        # What `expanduser("~")` reads first, at a seventh of its cost.
        (os.environ.get("HOME") or os.path.expanduser("~")) if home is None else os.fspath(home),
    )
    found = _snapshots.get(key)
    if found is not None:
        return found
    # Read under the lock: two first lookups at once take one snapshot, not
    # two a write between them could tell apart.
    with _snapshots_lock:
        found = _snapshots.get(key)
        if found is None:
            found = _snapshots[key] = _read_roles(role_dirs(*key))
    return found


def _read_roles(dirs: list[Path]) -> dict[str, Role | RoleFileError]:
    found: dict[str, Role | RoleFileError] = {}
    for name, path in _index(dirs).items():
        try:
            found[name] = role_cache.load(path)
        except RoleFileError as exc:
            found[name] = exc
    return found


class RoleCache:
    """Parsed roles by path, valid while the file's stat is unchanged."""

    MAX_ENTRIES = 512
    """Files kept; the least recently used is dropped past this."""

    def __init__(self) -> None:
        # Keyed by the file and the name it was reached by: the name is the
        # role's name, so a link under another name is checked on its own.
        self._roles: OrderedDict[tuple[Path, str], tuple[tuple[int, int, int], Role]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()
        self.parses = 0
        """Role files read and parsed so far (a cache miss each)."""

    def load(self, path: Path) -> Role:
        """The role in `path`, parsed again only when its stat changed."""
        # Keyed by the path as given (no `resolve`: a realpath is an lstat
        # per component); another spelling of the same file is cached
        # apart, under the same stat check.
        key = (path, path.name)
        try:
            # Taken before the read: an edit landing in between gives a newer
            # stat next time, so the file is read again rather than kept stale.
            st = os.stat(path)
        except (OSError, RuntimeError):
            return self._parse(path)  # the parse reports the problem
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            cached = self._roles.get(key)
            if cached is not None and cached[0] == stamp:
                self._roles.move_to_end(key)
                role = cached[1]
                # The same file reached by another spelling names that spelling.
                return role if role.source == path else dataclasses.replace(role, source=path)
        role = self._parse(path)
        with self._lock:
            self._roles[key] = (stamp, role)
            self._roles.move_to_end(key)
            while len(self._roles) > self.MAX_ENTRIES:
                self._roles.popitem(last=False)
        return role

    def clear(self) -> None:
        with self._lock:
            self._roles.clear()

    def _parse(self, path: Path) -> Role:
        with self._lock:
            self.parses += 1
        return _parse_role_file(path)


role_cache = RoleCache()
"""The process's role cache (`load_role_file`, `find_role`, `list_roles`)."""


def load_role_file(path: str | os.PathLike[str]) -> Role:
    """Parse and validate one role file (`.md` or `.json`), or the cached
    role when the file is unchanged since it was last parsed.

    Every problem is a `RoleFileError` naming the file and, where there is
    one, the field.
    """
    return role_cache.load(Path(path))


def _parse_role_file(path: Path) -> Role:
    where = str(path)
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise RoleFileError(where, "a role file must end in .md or .json")
    if not ROLE_NAME_PATTERN.fullmatch(path.stem):
        raise RoleFileError(
            where,
            f"the file name {path.stem!r} is not a valid role name "
            "(lowercase letters, digits, '-' and '_')",
            field="name",
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise RoleFileError(where, f"not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise RoleFileError(where, f"cannot read: {exc.strerror or exc}") from exc

    if suffix == ".md":
        fields, body = _parse_markdown(where, text)
        if not body.strip():
            raise RoleFileError(where, "missing or empty", field="prompt")
        return _build_role(where, path, _checked(where, _MarkdownRole, fields), body)
    checked = _checked(where, _JsonRole, _parse_json(where, text))
    return _build_role(where, path, checked, checked.prompt)


# --- lookup helpers -----------------------------------------------------------


def _index(dirs: list[Path]) -> dict[str, Path]:
    """Map each role name to its winning file, without parsing any file.

    Files whose stem is not a valid role name (a `README.md` beside the roles)
    are not roles and are passed over.
    """
    index: dict[str, Path] = {}
    for directory in dirs:
        if not directory.is_dir():
            continue
        local: dict[str, Path] = {}
        # Sorting by suffix priority makes `.md` win over `.json` in one directory.
        entries = sorted(
            (p for p in directory.iterdir() if p.suffix in _SUFFIXES and p.is_file()),
            key=lambda p: (p.stem, _SUFFIXES.index(p.suffix)),
        )
        for entry in entries:
            if ROLE_NAME_PATTERN.fullmatch(entry.stem):
                local.setdefault(entry.stem, entry)
        for name, entry in local.items():
            index.setdefault(name, entry)
    return index


# --- parsing helpers ----------------------------------------------------------


def _parse_markdown(where: str, text: str) -> tuple[dict[str, Any], str]:
    """Split front matter from body. A file without front matter is all prompt."""
    text = text.removeprefix("\ufeff")  # editors on Windows like to add a BOM
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != _FRONT_MATTER_FENCE:
        return {}, text
    for index in range(1, len(lines)):
        if lines[index].strip() == _FRONT_MATTER_FENCE:
            header = "".join(lines[1:index])
            body = "".join(lines[index + 1 :])
            break
    else:
        raise RoleFileError(where, "front matter opened with '---' but never closed")
    try:
        data = yaml.safe_load(header)
    except yaml.YAMLError as exc:
        raise RoleFileError(where, f"front matter is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RoleFileError(
            where, f"front matter must be a mapping of fields, got {type(data).__name__}"
        )
    if "prompt" in data:
        raise RoleFileError(
            where, "unknown field; in a Markdown role the prompt is the body", field="prompt"
        )
    return data, body


def _parse_json(where: str, text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RoleFileError(where, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RoleFileError(where, f"must be a JSON object, got {type(data).__name__}")
    return data


def _checked(where: str, schema: type[_Fields], fields: dict[str, Any]) -> _Fields:
    try:
        return schema.model_validate(fields)
    except ValidationError as exc:
        field, problem = describe(exc, schema)
        raise RoleFileError(where, problem, field=field) from exc


def _build_role(where: str, path: Path, fields: _MarkdownRole, prompt: str) -> Role:
    name = path.stem
    if fields.name is not None and fields.name != name:
        raise RoleFileError(
            where, f"is {fields.name!r} but the file is named {name!r}", field="name"
        )
    budget = None
    if fields.budget is not None:
        try:
            budget = Budget.from_dict(fields.budget)
        except BudgetError as exc:
            raise RoleFileError(where, exc.problem, field=exc.field) from exc
    return Role(
        name=name,
        description=(fields.description or "").strip(),
        prompt=prompt.strip(),
        model=fields.model,
        models=_unique(fields.models),
        tools=_unique(fields.tools),
        skills=_unique(fields.skills),
        max_turns=fields.max_turns,
        timeout=fields.timeout,
        sandbox_network=fields.sandbox_network,
        model_timeout=fields.model_timeout,
        model_retries=fields.model_retries,
        budget=budget,
        source=path,
    )


def _unique(names: list[str] | None) -> tuple[str, ...]:
    # Order is kept (it is the order the model sees); repeats add nothing.
    return tuple(dict.fromkeys(names or ()))


def _is_positive_int(value: object) -> bool:
    # bool is an int subclass; `max_turns: true` is a mistake, not 1.
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _is_positive_number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
