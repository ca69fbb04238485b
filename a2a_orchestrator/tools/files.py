"""File tools: read, list, grep, write and edit inside the workspace.

Each factory returns a `Tool` bound to one `Workspace`. Every file is opened,
created and replaced through descriptors the workspace walked to
(`Workspace.open_file`, `Workspace.locate`, `Workspace.glob`), never by a path
string, so a symlink swapped in concurrently cannot lead outside; output is
bounded, with a note saying what was cut and how to see more. Blocking
filesystem work runs in a worker thread so the event loop keeps serving other
conversations.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import secrets
import stat
from collections.abc import Callable
from typing import Any, BinaryIO

import anyio.to_thread

from ..errors import PathOutsideWorkdirError, ToolError
from .base import Tool
from .fspath import Entry
from .workspace import Workspace

__all__ = [
    "edit_file_tool",
    "grep_tool",
    "list_files_tool",
    "read_file_tool",
    "write_file_tool",
]

READ_LIMIT = 256 * 1024
"""Bytes `read_file` returns at most in one call."""
LIST_LIMIT = 1000
"""Paths `list_files` returns at most."""
GREP_MATCH_LIMIT = 500
"""Matching lines `grep` returns at most."""
GREP_LINE_LIMIT = 500
"""Characters of one matching line `grep` shows."""

# A NUL byte in the first block is how git and grep tell binary from text.
_SNIFF_BYTES = 8192


def _str_arg(args: dict[str, Any], name: str, default: str | None = None) -> str:
    value = args.get(name, default)
    if value is None:
        raise ToolError(f"Missing required argument {name!r}")
    if not isinstance(value, str):
        raise ToolError(f"Argument {name!r} must be a string, got {type(value).__name__}")
    return value


def _int_arg(args: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = args.get(name)
    if value is None:
        return default
    # Models sometimes send numbers as strings or as 10.0; accept what is unambiguous.
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolError(f"Argument {name!r} must be an integer, got {value!r}")
    if value < minimum:
        raise ToolError(f"Argument {name!r} must be at least {minimum}, got {value}")
    return value


def _is_binary(f: BinaryIO) -> bool:
    """Sniff the start of `f`, then rewind it."""
    binary = b"\0" in f.read(_SNIFF_BYTES)
    f.seek(0)
    return binary


def _open_regular(workspace: Workspace, raw: str) -> tuple[Entry, BinaryIO]:
    """The regular file `raw` names, opened, and its entry; the caller closes both."""
    try:
        entry, f = workspace.open_file(raw)
    except (FileNotFoundError, NotADirectoryError):
        raise ToolError(f"File {raw!r} does not exist") from None
    except IsADirectoryError:
        raise ToolError(
            f"{raw!r} is a directory, not a file; use list_files to see its contents"
        ) from None
    if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        return entry, f
    f.close()
    entry.close()
    raise ToolError(f"{raw!r} is not a regular file")


def _read_text(f: BinaryIO, raw: str) -> str:
    data = f.read()
    if b"\0" in data[:_SNIFF_BYTES]:
        raise ToolError(f"{raw!r} is a binary file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(f"{raw!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def _write_atomic(entry: Entry, data: bytes, mode: int | None) -> None:
    """Replace `entry` with `data` so readers see the old or the new file, never half.

    The temp file is created beside it with `O_EXCL|O_NOFOLLOW` and renamed
    over the name inside the same held directory: a rename replaces a
    symlink put there meanwhile rather than writing through it. `mode` is an
    existing file's permission bits, kept (an overwritten script stays
    executable).
    """
    tmp = f".{entry.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    # 0o666 lets the umask decide a new file's mode, like a plain open() would.
    fd = os.open(tmp, flags, 0o666, dir_fd=entry.dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, entry.name, src_dir_fd=entry.dir_fd, dst_dir_fd=entry.dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=entry.dir_fd)
        raise


def _shown(entry: Entry) -> str:
    """The entry's path as the model sees it: relative, symlinks resolved."""
    return "/".join(entry.parts) or "."


async def _off_loop(fn: Callable[[], str]) -> str:
    try:
        return await anyio.to_thread.run_sync(fn)
    except ToolError:
        raise
    except OSError as exc:
        raise ToolError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from exc


def read_file_tool(workspace: Workspace, *, max_bytes: int = READ_LIMIT) -> Tool:
    """`read_file(path, offset=1, limit=None)`: text of a file, from line `offset`.

    Returns the lines verbatim (line endings kept). Output stops at whole
    lines before `max_bytes` (a first line longer than that is cut) and ends
    with a note naming the `offset` to continue from.
    """

    def read(raw: str, offset: int, limit: int | None) -> str:
        entry, binary = _open_regular(workspace, raw)
        with entry, binary:
            if _is_binary(binary):
                raise ToolError(f"{raw!r} is a binary file")
            return lines(raw, io.TextIOWrapper(binary, encoding="utf-8", newline=""), offset, limit)

    def lines(raw: str, f: io.TextIOWrapper, offset: int, limit: int | None) -> str:
        parts: list[str] = []
        used = 0
        lineno = 0
        next_line: int | None = None
        try:
            with f:
                for lineno, line in enumerate(f, start=1):
                    if lineno < offset:
                        continue
                    if limit is not None and lineno >= offset + limit:
                        next_line = lineno
                        break
                    size = len(line.encode("utf-8"))
                    if used + size > max_bytes:
                        if not parts:
                            cut = line.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")
                            parts.append(cut)
                            next_line = lineno + 1
                            return "".join(parts) + _cut_note(max_bytes, next_line, mid_line=True)
                        next_line = lineno
                        return "".join(parts) + _cut_note(max_bytes, next_line)
                    parts.append(line)
                    used += size
        except UnicodeDecodeError as exc:
            raise ToolError(f"{raw!r} is not UTF-8 text ({exc.reason})") from exc
        if lineno == 0:
            return "(empty file)"
        if offset > lineno:
            return f"(no lines from offset {offset}; the file has {lineno} lines)"
        text = "".join(parts)
        if next_line is not None:
            text += f"\n[more lines follow; continue with offset={next_line}]"
        return text

    async def run(args: dict[str, Any]) -> str:
        raw = _str_arg(args, "path")
        offset = _int_arg(args, "offset", 1, minimum=1)
        limit = _int_arg(args, "limit", None, minimum=1)
        assert offset is not None
        return await _off_loop(lambda: read(raw, offset, limit))

    return Tool(
        name="read_file",
        description=(
            "Read a UTF-8 text file in the work directory. Optionally start at line "
            "`offset` (1-based) and return at most `limit` lines. Long output is cut "
            "with a note saying which offset to continue from."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the work directory.",
                },
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "First line to return (1-based).",
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Maximum number of lines.",
                },
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        run=run,
    )


def _cut_note(max_bytes: int, next_line: int, *, mid_line: bool = False) -> str:
    what = "line cut" if mid_line else "output cut"
    return f"\n[{what} at {max_bytes} bytes; continue with offset={next_line}]"


def list_files_tool(workspace: Workspace, *, max_results: int = LIST_LIMIT) -> Tool:
    """`list_files(pattern="**/*")`: sorted relative paths of matching files.

    Only regular files whose real location is inside the workspace are listed.
    At most `max_results` paths, then a note with the number left out.
    """

    def list_(pattern: str) -> str:
        matches = _glob(workspace, pattern)
        if not matches:
            return f"No files match {pattern!r}."
        text = "\n".join(matches[:max_results])
        if len(matches) > max_results:
            text += (
                f"\n[{len(matches) - max_results} more files not shown "
                f"({len(matches)} in all); use a narrower pattern]"
            )
        return text

    async def run(args: dict[str, Any]) -> str:
        pattern = _str_arg(args, "pattern", "**/*")
        return await _off_loop(lambda: list_(pattern))

    return Tool(
        name="list_files",
        description=(
            "List files in the work directory matching a glob pattern, sorted. "
            "`*` matches within one directory, `**` across directories: "
            "`**/*.py` finds Python files anywhere, `src/*` only directly in src."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {
                    "type": "string",
                    "description": (
                        "Glob relative to the work directory (default '**/*', every file)."
                    ),
                },
            },
            "required": [],
            "additionalProperties": False,
        },
        run=run,
    )


def _glob(workspace: Workspace, pattern: str) -> list[str]:
    try:
        return workspace.glob(pattern)
    except ValueError as exc:
        # A malformed pattern such as 'a**b' (absolute ones never get here:
        # the workspace refuses them first).
        raise ToolError(f"Invalid glob pattern {pattern!r}: {exc}") from exc


def grep_tool(
    workspace: Workspace,
    *,
    max_matches: int = GREP_MATCH_LIMIT,
    max_bytes: int = 65536,
) -> Tool:
    """`grep(pattern, glob="**/*", ignore_case=False)`: lines matching a regex.

    Returns `path:line:text` lines in path then line order. Binary and
    non-UTF-8 files are skipped. Stops at `max_matches` lines or `max_bytes`
    of output, whichever comes first, with a note. An invalid regex is a
    `ToolError`.
    """

    def search(regex: re.Pattern[str], glob: str) -> str:
        out: list[str] = []
        used = 0
        for rel in _glob(workspace, glob):
            try:
                entry, binary = workspace.open_file(rel)
            except (PathOutsideWorkdirError, OSError):
                continue  # gone, or swapped for a symlink out, since the listing
            with entry, binary:
                if not stat.S_ISREG(os.fstat(binary.fileno()).st_mode) or _is_binary(binary):
                    continue
                text_lines = io.TextIOWrapper(binary, encoding="utf-8", errors="strict")
                try:
                    for lineno, line in enumerate(text_lines, start=1):
                        if not regex.search(line):
                            continue
                        text = line.rstrip("\r\n")
                        if len(text) > GREP_LINE_LIMIT:
                            text = text[:GREP_LINE_LIMIT] + "…"
                        hit = f"{rel}:{lineno}:{text}"
                        used += len(hit.encode("utf-8")) + 1
                        if len(out) >= max_matches or used > max_bytes:
                            return "\n".join(out) + (
                                f"\n[stopped after {len(out)} matches; "
                                "narrow the pattern or the glob]"
                            )
                        out.append(hit)
                except (UnicodeDecodeError, OSError):
                    continue  # not text: nothing more to match
        if not out:
            return f"No matches for {regex.pattern!r}."
        return "\n".join(out)

    async def run(args: dict[str, Any]) -> str:
        pattern = _str_arg(args, "pattern")
        glob = _str_arg(args, "glob", "**/*")
        flags = re.IGNORECASE if args.get("ignore_case") is True else 0
        try:
            regex = re.compile(pattern, flags)
        except re.error as exc:
            raise ToolError(f"Invalid regular expression {pattern!r}: {exc}") from exc
        return await _off_loop(lambda: search(regex, glob))

    return Tool(
        name="grep",
        description=(
            "Search files in the work directory for a Python regular expression. "
            "Returns matching lines as `path:line:text`. Limit the files with a "
            "glob such as `**/*.py`."
        ),
        parameters={
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression (Python syntax)."},
                "glob": {
                    "type": "string",
                    "description": "Which files to search (default '**/*', every file).",
                },
                "ignore_case": {"type": "boolean", "description": "Match case-insensitively."},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
        run=run,
    )


def write_file_tool(workspace: Workspace) -> Tool:
    """`write_file(path, content)`: create or replace a file with `content`.

    Missing parent directories are created. The file is replaced atomically
    (temp file in the same directory, then `os.replace`); an existing file's
    permission bits are kept.
    """

    def write(raw: str, content: str) -> str:
        with workspace.locate(raw, create_dirs=True) as entry:
            try:
                mode: int | None = os.stat(
                    entry.name, dir_fd=entry.dir_fd, follow_symlinks=False
                ).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None and stat.S_ISDIR(mode):
                raise ToolError(f"{raw!r} is a directory")
            data = content.encode("utf-8")
            _write_atomic(entry, data, None if mode is None else stat.S_IMODE(mode))
            verb = "Created" if mode is None else "Overwrote"
            return f"{verb} {_shown(entry)} ({len(data)} bytes written)"

    async def run(args: dict[str, Any]) -> str:
        raw = _str_arg(args, "path")
        content = _str_arg(args, "content")
        return await _off_loop(lambda: write(raw, content))

    return Tool(
        name="write_file",
        description=(
            "Create or overwrite a file in the work directory with the given content. "
            "Parent directories are created. Use edit_file to change part of a file."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the work directory.",
                },
                "content": {"type": "string", "description": "The complete new file content."},
            },
            "required": ["path", "content"],
            "additionalProperties": False,
        },
        run=run,
    )


def edit_file_tool(workspace: Workspace) -> Tool:
    """`edit_file(path, old_text, new_text)`: replace one exact occurrence.

    `old_text` must occur exactly once; otherwise a `ToolError` says it is
    absent or how many times it occurs. The file is rewritten atomically.
    """

    def edit(raw: str, old: str, new: str) -> str:
        entry, binary = _open_regular(workspace, raw)
        with entry, binary:
            return replace_once(entry, binary, raw, old, new)

    def replace_once(entry: Entry, binary: BinaryIO, raw: str, old: str, new: str) -> str:
        text = _read_text(binary, raw)
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"old_text not found in {raw!r}; it must match the file exactly, "
                "including whitespace and indentation"
            )
        if count > 1:
            raise ToolError(
                f"old_text occurs {count} times in {raw!r}; it is ambiguous. "
                "Include more surrounding lines so it matches exactly once"
            )
        mode = stat.S_IMODE(os.fstat(binary.fileno()).st_mode)
        _write_atomic(entry, text.replace(old, new, 1).encode("utf-8"), mode)
        return f"Edited {_shown(entry)}: replaced 1 occurrence"

    async def run(args: dict[str, Any]) -> str:
        raw = _str_arg(args, "path")
        old = _str_arg(args, "old_text")
        new = _str_arg(args, "new_text")
        if not old:
            raise ToolError("old_text must not be empty; use write_file to create a file")
        if old == new:
            raise ToolError("old_text and new_text are identical; nothing to change")
        return await _off_loop(lambda: edit(raw, old, new))

    return Tool(
        name="edit_file",
        description=(
            "Replace an exact piece of text in a file. `old_text` must appear exactly "
            "once in the file (copy it verbatim, with enough context to be unique)."
        ),
        parameters={
            "type": "object",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "File path relative to the work directory.",
                },
                "old_text": {"type": "string", "description": "Exact text to replace."},
                "new_text": {"type": "string", "description": "Replacement text."},
            },
            "required": ["path", "old_text", "new_text"],
            "additionalProperties": False,
        },
        run=run,
    )
