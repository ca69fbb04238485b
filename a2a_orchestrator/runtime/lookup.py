"""Configuration files: where they are looked up, and reading TOML rule files.

Roles (`roles/`) and agents (`agents/`) are found the same way, first hit
wins: `./<kind>/`, `./.a2a/<kind>/`, `~/.config/a2a-orchestrator/<kind>/`,
then the files shipped with the package. Both are read once per process
and project, never at a spawn: roles at their first lookup (`roles.py`),
agents when the network is loaded at start (`network.py`).
"""

from __future__ import annotations

import functools
import os
import tomllib
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["lookup_dirs", "shipped_dir", "toml_tables"]

# This module is in runtime/, one folder below the package.
_PACKAGE = Path(__file__).resolve().parent.parent


def shipped_dir(kind: str) -> Path:
    """The directory of the `kind` files that ship with the package.

    An installed wheel carries them inside the package (`_shipped_<kind>`,
    mapped from the repository's top-level directory by hatch force-include);
    a source or editable checkout has only the repository's `<kind>/`.
    """
    return _shipped(_PACKAGE, kind)


@functools.cache
def _shipped(package: Path, kind: str) -> Path:
    # Found once per package directory: it does not move while it runs, and
    # every spawn looks its role up here.
    inside = package / f"_shipped_{kind}"
    return inside if inside.is_dir() else package.parent / kind


def lookup_dirs(
    kind: str,
    *,
    cwd: str | os.PathLike[str] | None = None,
    home: str | os.PathLike[str] | None = None,
) -> list[Path]:
    """The lookup directories for `kind`, highest priority first.

    Directories that do not exist are listed all the same; lookup skips
    them. A directory reached twice (running from the repository root makes
    `./<kind>/` the shipped one) is listed once.
    """
    base = os.getcwd() if cwd is None else os.fspath(cwd)
    user_home = os.path.expanduser("~") if home is None else os.fspath(home)
    candidates = _candidates(kind, base, user_home, _PACKAGE)
    seen: set[Path] = set()
    dirs: list[Path] = []
    for directory in candidates:
        key = directory.resolve()
        if key not in seen:
            seen.add(key)
            dirs.append(directory)
    return dirs


@functools.lru_cache(maxsize=64)
def _candidates(kind: str, base: str, home: str, package: Path) -> tuple[Path, ...]:
    # Built once per directory pair: a dozen pathlib objects each time.
    return (
        Path(base) / kind,
        Path(base) / ".a2a" / kind,
        Path(home) / ".config" / "a2a-orchestrator" / kind,
        _shipped(package, kind),
    )


def toml_tables(path: str | Path, key: str, what: str) -> list[tuple[str, dict[str, Any]]]:
    """The `[[key]]` tables of a TOML file, each with "<file>: <key> <n>" to name it
    in errors; a file that cannot be read or parsed, or that holds anything
    but those tables, is a `ConfigError` naming it (worded as `configfile`
    words every operator file's problems)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {what} file {path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    # A misspelt `[[hooks]]` would otherwise leave the file without its
    # hooks (a spawn.before that denies, gone) and say nothing.
    for other in data:
        if other != key:
            raise ConfigError(f"{path}: field {other!r}: unknown field; known fields are {key}")
    entries = data.get(key, [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: field {key!r}: must be an array of tables ([[{key}]])")
    tables = []
    for number, entry in enumerate(entries, start=1):
        where = f"{path}: {key} {number}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a table")
        tables.append((where, entry))
    return tables
