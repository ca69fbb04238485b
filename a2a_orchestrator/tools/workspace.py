"""The session's work directory, and the one place paths are confined to it.

`Workspace` holds a descriptor on the work directory, opened once. Every tool
that takes a path goes through `Workspace.locate` or `Workspace.open_file`;
every tool that takes a glob goes through `Workspace.glob`. All of them walk
the path component by component from that descriptor (`fspath.locate`), never
re-resolving a checked name, so a symlink swapped in by a concurrent command
(a role server shares its work directory between all its callers) cannot
lead a tool outside.

Symlinks inside the work directory keep working: one whose target stays
beneath the root is followed by the same walk (at most `fspath.MAX_SYMLINKS`
of them); one that leads out, like `..` above the root or an absolute path
elsewhere, raises `PathOutsideWorkdirError` naming the path.

The server's own names at the root (`reserved.py`) are judged in the same
walk, after symlinks are resolved: its private state `.a2a/` counts as
outside (`PathOutsideWorkdirError`; globs never list it, even when they
name it), and `roles/` and `agents/` may be read but not written nor
created (`ToolError`).

What this does not cover: a directory a tool call already holds being moved
out of the work directory by someone who can also write outside it. A
command run in the sandbox cannot: there the work directory is a bind mount
of its own and the rest is read-only, so such a rename fails.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ..errors import ConfigError, PathOutsideWorkdirError, ToolError
from . import fspath
from .reserved import READ_ONLY_DIRS, STATE_DIR

__all__ = ["Workspace"]

# Directories whose contents drown a listing and are almost never what the
# model is looking for; a glob that names one explicitly still sees it.
_SKIPPED_DIRS = frozenset({".git"})

_MAGIC = re.compile(r"[*?[]")

# Names at the root that the file tools treat as outside the work directory.
_HIDDEN = frozenset({STATE_DIR})
_READ_ONLY = frozenset(READ_ONLY_DIRS)

# A FIFO would block an open for reading; the tools refuse non-regular files
# after opening, so never wait on one.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class _RootFd:
    """The descriptor on the work directory, closed once (explicitly or when collected)."""

    def __init__(self, path: Path) -> None:
        # O_CLOEXEC: commands the tools start never inherit it.
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._finalizer = weakref.finalize(self, os.close, self.fd)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        self._finalizer()


@dataclass(frozen=True)
class Workspace:
    """A work directory that tools may not leave.

    `root` is stored resolved (symlinks followed), so `Workspace(p).root` may
    differ from `p`. Raises `ConfigError` when `root` is not an existing
    directory.

    The directory is opened once, here, and the descriptor is kept for the
    object's life (it is close-on-exec, so commands and forked children do not
    inherit it). `close()` releases it early; it must not race a tool call.
    Copies and pickles open their own descriptor.
    """

    root: Path
    _root_fd: _RootFd = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            real = Path(self.root).resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(f"Work directory {str(self.root)!r} does not exist") from exc
        if not real.is_dir():
            raise ConfigError(f"Work directory {str(self.root)!r} is not a directory")
        object.__setattr__(self, "root", real)
        try:
            object.__setattr__(self, "_root_fd", _RootFd(real))
        except OSError as exc:
            raise ConfigError(f"Work directory {str(self.root)!r} cannot be opened: {exc}") from exc

    def __reduce__(self) -> tuple[type[Workspace], tuple[Path]]:
        # A copy sharing the descriptor number would close it under the original.
        return (Workspace, (self.root,))

    def close(self) -> None:
        """Release the directory descriptor; later tool calls raise `ConfigError`."""
        self._root_fd.close()

    def _fd(self) -> int:
        if self._root_fd.closed:
            raise ConfigError(f"Work directory {str(self.root)!r} was closed")
        return self._root_fd.fd

    def _outside(self, path: str) -> PathOutsideWorkdirError:
        return PathOutsideWorkdirError(
            f"Path {path!r} is outside the work directory {str(self.root)!r}; "
            "use a path relative to it"
        )

    def _walk(
        self, path: str, *, create_dirs: bool = False, missing_ok: bool = False, write: bool = False
    ) -> fspath.Entry:
        """`fspath.locate` from the root, its refusals turned into tool errors naming `path`."""
        if "\0" in path:
            raise PathOutsideWorkdirError(f"Path {path!r} contains a NUL byte")
        try:
            return fspath.locate(
                self._fd(),
                str(self.root),
                path,
                create_dirs=create_dirs,
                missing_ok=missing_ok,
                hidden=_HIDDEN,
                read_only=_READ_ONLY if write or create_dirs else (),
            )
        except fspath.Hidden as exc:
            raise PathOutsideWorkdirError(
                f"Path {path!r} leads into {exc.args[0]}/, the server's private state "
                "(task stores, journals, hooks, role files), which is outside the work "
                f"directory {str(self.root)!r} for file tools; use another path"
            ) from None
        except fspath.Escape:
            raise self._outside(path) from None
        except fspath.ReadOnly as exc:
            raise ToolError(
                f"Path {path!r} leads into {exc.args[0]}/, which holds the orchestrator's "
                "role and agent configuration and is read-only to agents; "
                "write somewhere else in the work directory"
            ) from None

    def locate(self, path: str, *, create_dirs: bool = False, write: bool = False) -> fspath.Entry:
        """The entry `path` names: its directory (a descriptor) and final name.

        Relative paths are taken from `root`; an absolute path is accepted
        only when it lies inside `root`. Symlinks are followed while they stay
        inside. `create_dirs` makes missing parent directories. The caller
        closes the entry. Raises `PathOutsideWorkdirError` naming `path` for
        a path that leads out or into the server's `.a2a/`,
        `FileNotFoundError` or `NotADirectoryError` when a parent is missing
        or not a directory. With `write` (implied by `create_dirs`), a path
        into or creating `roles/` or `agents/` at the root is a `ToolError`.
        """
        return self._walk(path, create_dirs=create_dirs, write=write)

    def open_file(self, path: str, *, write: bool = False) -> tuple[fspath.Entry, BinaryIO]:
        """`path` opened for reading, and the entry it was found at; close both.

        The final open refuses a symlink (`O_NOFOLLOW`): one swapped in after
        the walk sends it round again instead of being followed. The file may
        be a FIFO or another non-regular file; the caller checks `os.fstat`.
        `write` says the caller will replace the file (see `locate`). Raises
        like `locate`, and `FileNotFoundError` or `IsADirectoryError`.
        """
        for _ in range(fspath.MAX_SYMLINKS):
            entry = self.locate(path, write=write)
            try:
                fd = os.open(entry.name, _FILE_FLAGS, dir_fd=entry.dir_fd)
            except OSError as exc:
                entry.close()
                if exc.errno == errno.ELOOP:
                    continue
                exc.filename = path
                raise
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                os.close(fd)
                entry.close()
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            os.set_blocking(fd, True)
            return entry, os.fdopen(fd, "rb")
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)

    def resolve(self, path: str) -> Path:
        """The real path `path` names, which is guaranteed inside `root`.

        For showing and comparing paths only: tools open through `locate` and
        `open_file`, never by this name. Missing directories are taken
        lexically. Raises `PathOutsideWorkdirError` naming `path` otherwise
        (also for the server's `.a2a/`).
        """
        with self._walk(path, missing_ok=True) as entry:
            return self.root.joinpath(*entry.parts)

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

    def glob(self, pattern: str) -> list[str]:
        """Regular files matching `pattern` under `root`: sorted relative POSIX paths.

        `*`, `?` and `[...]` match within one name (dot files too), `**`
        any number of directories. The walk reads directories through
        descriptors: `**` never descends into a symlinked directory, a named
        or wildcard component follows one only while it stays inside, and a
        symlinked file is listed under its own name only when its target is a
        regular file inside. `.git` trees are skipped unless the pattern names
        `.git`; the server's `.a2a/` is never listed, nor anything that
        resolves into it. Raises `PathOutsideWorkdirError` for a pattern that starts
        outside (absolute elsewhere, or with `..`), `ValueError` for a `**`
        that is not a whole component.
        """
        parts = PurePosixPath(self._relative_pattern(pattern)).parts
        for part in parts:
            if "**" in part and part != "**":
                raise ValueError("Invalid pattern: '**' can only be an entire path component")
        include_git = ".git" in parts
        found: set[str] = set()
        root = os.dup(self._fd())
        try:
            for rel in self._match(root, (), (), parts, include_git):
                found.add("/".join(rel))
        finally:
            os.close(root)
        return sorted(found)

    def _match(
        self,
        dir_fd: int,
        at: tuple[str, ...],
        real: tuple[str, ...],
        parts: tuple[str, ...],
        include_git: bool,
    ) -> Iterator[tuple[str, ...]]:
        """Paths under directory `dir_fd` (reached as `at`, really at `real`) matching `parts`.

        `real` is the directory's path from the root with symlinks resolved:
        a symlink to the root (`self -> .`) leads back to where `.a2a` is hidden.
        """
        if not parts:
            return
        head, rest = parts[0], parts[1:]
        if head == "**":
            yield from self._match(dir_fd, at, real, rest, include_git)
            for name, sub in self._subdirs(dir_fd, real, include_git):
                try:
                    yield from self._match(sub, (*at, name), (*real, name), parts, include_git)
                finally:
                    os.close(sub)
            return
        matches = _matcher(head)
        with os.scandir(dir_fd) as it:
            entries = [e for e in it if matches(e.name)]
        for entry in entries:
            if entry.name in _SKIPPED_DIRS and not include_git:
                continue
            if not real and entry.name in _HIDDEN:
                continue
            rel = (*at, entry.name)
            if not rest:
                if self._is_inside_file(entry, rel):
                    yield rel
                continue
            opened = self._open_subdir(dir_fd, entry, rel, real)
            if opened is None:
                continue
            child, child_real = opened
            try:
                yield from self._match(child, rel, child_real, rest, include_git)
            finally:
                os.close(child)

    def _subdirs(
        self, dir_fd: int, real: tuple[str, ...], include_git: bool
    ) -> Iterator[tuple[str, int]]:
        """Real subdirectories of `dir_fd` (really at `real`), opened; no symlinks followed."""
        skipped = frozenset() if include_git else _SKIPPED_DIRS
        if not real:
            skipped |= _HIDDEN
        with os.scandir(dir_fd) as it:
            names = sorted(
                e.name for e in it if e.is_dir(follow_symlinks=False) and e.name not in skipped
            )
        for name in names:
            try:
                # Swapped for a symlink since the scan: O_NOFOLLOW refuses it.
                yield name, os.open(name, fspath.DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue

    def _open_subdir(
        self, dir_fd: int, entry: os.DirEntry[str], rel: tuple[str, ...], real: tuple[str, ...]
    ) -> tuple[int, tuple[str, ...]] | None:
        """Directory `entry` of `dir_fd` (really at `real`) opened, and its real path.

        A symlink is followed only while it stays inside and out of `.a2a`.
        """
        if not entry.is_symlink():
            if not entry.is_dir(follow_symlinks=False):
                return None
            try:
                return os.open(entry.name, fspath.DIR_FLAGS, dir_fd=dir_fd), (*real, entry.name)
            except OSError:
                pass  # swapped for a symlink since the scan: resolve it as one
        try:
            with fspath.locate(self._fd(), str(self.root), "/".join(rel), hidden=_HIDDEN) as found:
                return fspath.open_dir(found), found.parts
        except (fspath.Escape, OSError):
            return None

    def _is_inside_file(self, entry: os.DirEntry[str], rel: tuple[str, ...]) -> bool:
        if not entry.is_symlink():
            return entry.is_file(follow_symlinks=False)
        try:
            with fspath.locate(self._fd(), str(self.root), "/".join(rel), hidden=_HIDDEN) as found:
                mode = os.stat(found.name, dir_fd=found.dir_fd, follow_symlinks=False).st_mode
        except (fspath.Escape, OSError):
            return False
        return stat.S_ISREG(mode)

    def _relative_pattern(self, pattern: str) -> str:
        if not pattern:
            raise PathOutsideWorkdirError("Empty glob pattern")
        if "\0" in pattern:
            raise PathOutsideWorkdirError(f"Pattern {pattern!r} contains a NUL byte")
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


def _matcher(part: str) -> Callable[[str], object]:
    """A test for one name: equality for a plain name, else the glob as a regex."""
    if not _MAGIC.search(part):
        return part.__eq__
    # Case-sensitive, and `*` matches a leading dot, as pathlib's glob does.
    return re.compile(fnmatch.translate(part)).match
