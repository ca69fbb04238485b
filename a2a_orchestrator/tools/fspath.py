"""Resolving a path beneath a directory descriptor, one component at a time.

The contract: every name is looked up relative to a directory descriptor that
was itself reached from the root descriptor this way, with `O_NOFOLLOW`, so
the kernel never follows a symlink for us. A symlink met on the way is read
(`readlinkat`) and its target spliced into the names still to walk, then
walked the same way; `..` pops a descriptor this walk opened earlier instead
of asking the kernel for a parent. Nothing is re-resolved from a path string,
so swapping a directory for a symlink between two steps cannot lead a walk
out: the swapped-in symlink is either read and judged like any other, or it
makes the next `O_NOFOLLOW` open fail and the walk starts again from the root.

Absolute symlink targets are mapped onto the root when they name a place
beneath it (by its path, or a path whose real location is the root); any
other target, and any `..` above the root, is an `Escape`.

Names reserved at the root are judged in the same walk, on the first
component below the root after every symlink met so far was resolved (so
`x -> .a2a` is caught like `.a2a`, whatever string led there): the walk
never enters nor ends at a `hidden` one (`Hidden`, a kind of `Escape`), and
never creates nor ends beneath a `read_only` one (`ReadOnly`).

`openat2(RESOLVE_BENEATH)` would give the same guarantee for plain opens, but
it refuses absolute symlinks that stay inside and does not tell which names it
followed, which the tools report back; one walk serves every tool instead.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import PurePosixPath

__all__ = [
    "DIR_FLAGS",
    "MAX_SYMLINKS",
    "Entry",
    "Escape",
    "Hidden",
    "ReadOnly",
    "locate",
    "open_dir",
    "root_parts",
]

MAX_SYMLINKS = 40
"""Symlinks one resolution follows at most, as Linux does (then `ELOOP`)."""

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How a directory is opened: never through a symlink, never inherited."""


class Escape(Exception):
    """The path leads outside the root (`..` above it, or a symlink out)."""


class Hidden(Escape):
    """The path leads into a name the walk treats as outside (`args[0]`)."""


class ReadOnly(Exception):
    """The path leads into, or would create, a read-only name (`args[0]`)."""


@dataclass
class Entry:
    """Where a path ends: the name `name` inside the directory `dir_fd`.

    `name` is `"."` when the path names a directory itself. `parts` is the
    path from the root with every symlink resolved (what the model is shown).
    `dir_fd` belongs to the entry; `close()` releases it.
    """

    dir_fd: int
    name: str
    parts: tuple[str, ...]
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self.dir_fd)

    def __enter__(self) -> Entry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def root_parts(path: str, root: str) -> tuple[str, ...] | None:
    """The components of absolute `path` below `root`, or None if not beneath it.

    A lexical prefix match first; otherwise the shortest prefix of `path`
    whose real location is `root` (an alias of the work directory). Whatever
    the answer, the caller walks the rest from the root descriptor, so a
    racing rename can change which inside file is meant, never reach outside.
    """
    parts = PurePosixPath(path).parts[1:]
    base = PurePosixPath(root).parts[1:]
    if parts[: len(base)] == base:
        return parts[len(base) :]
    for i in range(1, len(parts) + 1):
        if os.path.realpath("/" + "/".join(parts[:i])) == root:
            return parts[i:]
    return None


def _readlink(name: str, dir_fd: int) -> str | None:
    """The target of symlink `name`, or None when `name` is not a symlink."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT):
            return None
        raise


def locate(
    root_fd: int,
    root: str,
    path: str,
    *,
    create_dirs: bool = False,
    missing_ok: bool = False,
    hidden: Collection[str] = (),
    read_only: Collection[str] = (),
) -> Entry:
    """Walk `path` beneath `root_fd` (whose real path is `root`) to its entry.

    Every symlink is followed, the last component's too, while it stays
    beneath the root. `create_dirs` makes missing directories on the way
    (mode 0o777 less the umask); `missing_ok` continues past a missing
    directory lexically (for naming a path, never for opening one: the
    returned `dir_fd` is then the deepest existing directory).

    `hidden` names at the root are outside: the walk neither opens nor ends
    at one (`Hidden`). `read_only` names at the root may be passed through
    but not created nor ended beneath (`ReadOnly`): pass them when the entry
    will be written. Raises `Escape`, `FileNotFoundError` or
    `NotADirectoryError` (with `path` as the file name), or `OSError(ELOOP)`
    after `MAX_SYMLINKS` symlinks.
    """
    if os.path.isabs(path):
        inside = root_parts(path, root)
        if inside is None:
            raise Escape(path)
        pending = list(inside)
    else:
        pending = list(PurePosixPath(path).parts)
    stack: list[int] = []  # descriptors this walk opened, one per entry of `names`
    names: list[str] = []
    lexical: list[str] = []  # names past a missing directory (missing_ok only)
    links = 0
    made = 0  # directories created, bounded like `links`

    def here() -> int:
        return stack[-1] if stack else root_fd

    def enter(part: str) -> None:
        # `part` is about to be opened, created or returned in `here()`; at
        # the root it is the first resolved component of where we are going.
        if not stack and part in hidden:
            raise Hidden(part)

    def finish(dir_fd: int, name: str) -> Entry:
        first = (*names, *lexical, name)[0]
        if first in read_only:
            raise ReadOnly(first)
        return _entry(dir_fd, name, (*names, *lexical, name), stack)

    def follow(target: str) -> None:
        nonlocal links, pending
        links += 1
        if links > MAX_SYMLINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
        if os.path.isabs(target):
            inside = root_parts(target, root)
            if inside is None:
                raise Escape(path)
            # An absolute target starts again at the root.
            while stack:
                os.close(stack.pop())
            names.clear()
            pending = list(inside) + pending
        else:
            pending = list(PurePosixPath(target).parts) + pending

    try:
        while pending:
            part = pending.pop(0)
            if part == ".":
                continue
            if part == "..":
                if lexical:
                    lexical.pop()
                elif stack:
                    os.close(stack.pop())
                    names.pop()
                else:
                    raise Escape(path)
                continue
            if lexical:
                lexical.append(part)
                continue
            enter(part)
            if not pending:
                # The last component: follow it if it is a symlink, else stop here.
                target = _readlink(part, here())
                if target is None:
                    return finish(here(), part)
                follow(target)
                continue
            try:
                fd = os.open(part, DIR_FLAGS, dir_fd=here())
            except FileNotFoundError:
                # Missing, or a symlink whose target is missing.
                target = _readlink(part, here())
                if target is not None:
                    follow(target)
                    continue
                if create_dirs:
                    first = (*names, part)[0]
                    if first in read_only:
                        raise ReadOnly(first) from None
                    made += 1
                    if made > MAX_SYMLINKS:
                        # Something removes what we make as fast as we make it.
                        msg = os.strerror(errno.ENOENT)
                        raise FileNotFoundError(errno.ENOENT, msg, path) from None
                    try:
                        os.mkdir(part, 0o777, dir_fd=here())
                    except FileExistsError:
                        pass  # made concurrently: open it on the next turn
                    pending.insert(0, part)
                    continue
                if missing_ok:
                    lexical.append(part)
                    continue
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
            except OSError as exc:
                # O_NOFOLLOW|O_DIRECTORY on a symlink fails with ENOTDIR (or
                # ELOOP): read it and walk its target instead.
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                target = _readlink(part, here())
                if target is None:
                    raise NotADirectoryError(
                        errno.ENOTDIR, os.strerror(errno.ENOTDIR), path
                    ) from None
                follow(target)
                continue
            stack.append(fd)
            names.append(part)
        # The path names a directory (the root, or one ending in `.` or `..`).
        return finish(here(), ".")
    except BaseException:
        for fd in stack:
            os.close(fd)
        raise


def _entry(dir_fd: int, name: str, parts: tuple[str, ...], stack: list[int]) -> Entry:
    """An `Entry` owning a descriptor on `dir_fd`; the rest of `stack` is closed."""
    # `dir_fd` is the top of `stack`, or the root when the walk opened nothing.
    owned = stack.pop() if stack else os.dup(dir_fd)  # os.dup is close-on-exec
    for fd in stack:
        os.close(fd)
    stack.clear()
    return Entry(dir_fd=owned, name=name, parts=tuple(p for p in parts if p != "."))


def open_dir(entry: Entry) -> int:
    """A new descriptor on the directory `entry` names, without following a symlink.

    Raises `NotADirectoryError` when the entry is not a directory now (also
    when it was swapped for a symlink since `locate`).
    """
    if entry.name == ".":
        return os.dup(entry.dir_fd)
    try:
        return os.open(entry.name, DIR_FLAGS, dir_fd=entry.dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise NotADirectoryError(
                errno.ENOTDIR, os.strerror(errno.ENOTDIR), entry.name
            ) from None
        raise
