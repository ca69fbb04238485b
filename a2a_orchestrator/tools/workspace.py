"""The session's work directory, and the one place paths are confined to it.

Every tool that takes a path goes through `Workspace.resolve`; every tool that
takes a glob goes through `Workspace.glob`. Both judge a path by where it
*really* leads (symlinks resolved, against the real root), so neither `..`,
an absolute path nor a symlink can reach outside.

The check happens when the path is resolved; a symlink swapped afterwards by
a concurrent command is not caught. The work directory is the agent's own
sandbox, so that race is between the agent and itself.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import ConfigError, PathOutsideWorkdirError

__all__ = ["Workspace"]

# Directories whose contents drown a listing and are almost never what the
# model is looking for; a glob that names one explicitly still sees it.
_SKIPPED_DIRS = frozenset({".git"})


@dataclass(frozen=True)
class Workspace:
    """A work directory that tools may not leave.

    `root` is stored resolved (symlinks followed), so `Workspace(p).root` may
    differ from `p`. Raises `ConfigError` when `root` is not an existing
    directory.
    """

    root: Path

    def __post_init__(self) -> None:
        try:
            real = Path(self.root).resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"Work directory {str(self.root)!r} does not exist") from exc
        if not real.is_dir():
            raise ConfigError(f"Work directory {str(self.root)!r} is not a directory")
        object.__setattr__(self, "root", real)

    def resolve(self, path: str) -> Path:
        """The real path `path` names, which is guaranteed inside `root`.

        Relative paths are taken from `root`; an absolute path is accepted
        only when it already lies inside `root`. The result has every symlink
        resolved, so reading or writing it touches exactly the checked file.
        Raises `PathOutsideWorkdirError` naming `path` otherwise.
        """
        if "\0" in path:
            raise PathOutsideWorkdirError(f"Path {path!r} contains a NUL byte")
        candidate = self.root / path  # an absolute `path` replaces root here
        real = Path(os.path.realpath(candidate))
        if not real.is_relative_to(self.root):
            raise PathOutsideWorkdirError(
                f"Path {path!r} is outside the work directory {str(self.root)!r}; "
                "use a path relative to it"
            )
        return real

    def relative(self, path: Path | str) -> str:
        """`path` as the model should see it: POSIX, relative to `root`.

        The root itself is `"."`; a path outside `root` is returned unchanged.
        """
        p = Path(path)
        if not p.is_absolute():
            return PurePosixPath(p).as_posix()
        try:
            rel = p.relative_to(self.root)
        except ValueError:
            return str(p)
        return rel.as_posix() or "."

    def glob(self, pattern: str) -> list[Path]:
        """Regular files matching `pattern` under `root`, sorted by relative path.

        Paths are returned as matched (a symlink keeps its own name) but only
        when their real target is inside `root`. `.git` trees are skipped
        unless the pattern names `.git`. Raises `PathOutsideWorkdirError` for
        a pattern that starts outside (absolute elsewhere, or with `..`).
        """
        pattern = self._relative_pattern(pattern)
        include_git = ".git" in PurePosixPath(pattern).parts
        found: list[tuple[str, Path]] = []
        for match in self.root.glob(pattern):
            rel = match.relative_to(self.root)
            if not include_git and _SKIPPED_DIRS.intersection(rel.parts):
                continue
            real = Path(os.path.realpath(match))
            if not real.is_relative_to(self.root) or not real.is_file():
                continue
            found.append((rel.as_posix(), match))
        found.sort(key=lambda item: item[0])
        return [match for _, match in found]

    def _relative_pattern(self, pattern: str) -> str:
        if not pattern:
            raise PathOutsideWorkdirError("Empty glob pattern")
        if os.path.isabs(pattern):
            # Accept an absolute pattern only when it spells out the root.
            root = self.root.as_posix().rstrip("/") + "/"
            if not pattern.startswith(root):
                raise PathOutsideWorkdirError(
                    f"Pattern {pattern!r} is outside the work directory {str(self.root)!r}"
                )
            pattern = pattern[len(root) :]
        if ".." in PurePosixPath(pattern).parts:
            raise PathOutsideWorkdirError(
                f"Pattern {pattern!r} uses '..' and would leave the work directory"
            )
        return pattern or "*"
