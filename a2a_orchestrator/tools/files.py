"""File tools: read, list, grep, write and edit inside the workspace.

Each factory returns a `Tool` bound to one `Workspace`. Every file is opened,
created and replaced through descriptors the workspace walked to
(`Workspace.open_file`, `Workspace.locate`, `Workspace.glob`), never by a path
string, so a symlink swapped in concurrently cannot lead outside; output is
bounded, with a note saying what was cut and how to see more.

Memory and time are bounded too, whatever the files hold: `read_file` reads
only what it returns (and skips lines before `offset` in bounded chunks),
`edit_file` refuses files over `EDIT_FILE_LIMIT`, `grep` skips files over
`GREP_FILE_LIMIT`, searches only the first `GREP_READ_LINE` characters of a
line, and gives up after `GREP_DEADLINE` seconds. Blocking filesystem work
runs in a worker thread so the event loop keeps serving other conversations;
`grep` matches with the `regex` package, which releases the GIL while it
matches (`concurrent=True`) and stops at a timeout, so a catastrophic
pattern can neither freeze the server nor run forever. Cancelling a call
waits for its worker thread: grep checks for cancellation between lines.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import stat
import time
from collections.abc import Callable
from typing import Any, BinaryIO

import anyio.from_thread
import anyio.to_thread
import regex

from ..errors import PathOutsideWorkdirError, ToolError
from .base import Tool
from .fspath import Entry
from .workspace import Workspace

__all__ = [
    "EDIT_FILE_LIMIT",
    "GREP_DEADLINE",
    "GREP_FILE_LIMIT",
    "GREP_READ_LINE",
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
GREP_READ_LINE = 1024 * 1024
"""Characters of one line `grep` reads and searches; the rest of a longer line is skipped."""
GREP_FILE_LIMIT = 16 * 1024 * 1024
"""Bytes above which `grep` skips a file (and says so)."""
GREP_DEADLINE = 10.0
"""Seconds one `grep` call may take, all files and lines together."""
EDIT_FILE_LIMIT = 8 * 1024 * 1024
"""Bytes above which `edit_file` refuses a file (it holds the whole file in memory)."""

# A NUL byte in the first block is how git and grep tell binary from text.
_SNIFF_BYTES = 8192
# Characters read at a time when skipping (the rest of) a line.
_SKIP_CHUNK = 1024 * 1024


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


def _open_regular(workspace: Workspace, raw: str, *, write: bool = False) -> tuple[Entry, BinaryIO]:
    """The regular file `raw` names, opened, and its entry; the caller closes both.

    `write` says the caller will replace it (`Workspace.open_file`).
    """
    try:
        entry, f = workspace.open_file(raw, write=write)
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


def _read_text(f: BinaryIO, raw: str, max_bytes: int) -> str:
    """The whole of `f` as text; a `ToolError` when over `max_bytes`, binary or not UTF-8."""
    size = os.fstat(f.fileno()).st_size
    data = f.read(max_bytes + 1) if size <= max_bytes else b""
    if size > max_bytes or len(data) > max_bytes:
        raise ToolError(
            f"{raw!r} is too large to edit ({_size(max(size, len(data)))}; edit_file "
            f"handles files up to {_size(max_bytes)}). Change it another way, or "
            "write a new file with write_file"
        )
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


def _size(n: int) -> str:
    """A byte count for people: `812 bytes`, `16 MiB`, `200.5 MiB`."""
    if n < 1024 * 1024:
        return f"{n} bytes"
    return f"{n / (1024 * 1024):.1f}".removesuffix(".0") + " MiB"


def _skip_line(f: io.TextIOWrapper) -> bool:
    """Read past the rest of the current line without keeping it; False at end of file."""
    chunk = f.readline(_SKIP_CHUNK)
    if not chunk:
        return False
    while len(chunk) == _SKIP_CHUNK and not chunk.endswith(("\n", "\r")):
        chunk = f.readline(_SKIP_CHUNK)
    return True


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
    lines before `max_bytes` (a first line longer than that is cut, with the
    number of bytes of the file left unshown) and ends with a note naming the
    `offset` to continue from. Reads only what it returns, plus lines before
    `offset` in bounded chunks: memory stays bounded for any file.
    """

    def read(raw: str, offset: int, limit: int | None) -> str:
        entry, binary = _open_regular(workspace, raw)
        with entry, binary:
            if _is_binary(binary):
                raise ToolError(f"{raw!r} is a binary file")
            size = os.fstat(binary.fileno()).st_size
            text = io.TextIOWrapper(binary, encoding="utf-8", newline="")
            return lines(raw, text, size, offset, limit)

    def lines(raw: str, f: io.TextIOWrapper, size: int, offset: int, limit: int | None) -> str:
        parts: list[str] = []
        used = 0
        lineno = 0
        next_line: int | None = None
        try:
            with f:
                while lineno + 1 < offset:
                    if not _skip_line(f):
                        break
                    lineno += 1
                while True:
                    # One character more than fits: a line that long is cut anyway.
                    line = f.readline(max_bytes + 1)
                    if not line:
                        break
                    lineno += 1
                    if limit is not None and lineno >= offset + limit:
                        next_line = lineno
                        break
                    data = line.encode("utf-8")
                    if used + len(data) > max_bytes:
                        if parts:
                            return "".join(parts) + _cut_note(max_bytes, lineno)
                        cut = data[:max_bytes].decode("utf-8", "ignore")
                        # What follows the cut: the rest of what was read, and the file after it.
                        left = max(0, size - f.tell()) + len(data) - len(cut.encode("utf-8"))
                        return cut + (
                            f"\n[line cut at {max_bytes} bytes; {left} more bytes in the file; "
                            f"continue with offset={lineno + 1}]"
                        )
                    parts.append(line)
                    used += len(data)
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
        read_only=True,
    )


def _cut_note(max_bytes: int, next_line: int) -> str:
    return f"\n[output cut at {max_bytes} bytes; continue with offset={next_line}]"


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
        read_only=True,
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
    deadline: float = GREP_DEADLINE,
    max_file_bytes: int = GREP_FILE_LIMIT,
    max_line: int = GREP_READ_LINE,
) -> Tool:
    """`grep(pattern, glob="**/*", ignore_case=False)`: lines matching a regex.

    Returns `path:line:text` lines in path then line order. Binary and
    non-UTF-8 files are skipped, and so are files over `max_file_bytes`
    (named in a note); only the first `max_line` characters of a line are
    searched (a note counts the lines cut). Stops at `max_matches` lines or
    `max_bytes` of output, whichever comes first, with a note. An invalid
    regex is a `ToolError`, and so is a search still running after
    `deadline` seconds: its message holds the matches found until then.
    """

    def search(pattern: regex.Pattern[str], glob: str) -> str:
        stop_at = time.monotonic() + deadline
        out: list[str] = []
        used = 0
        too_big: list[str] = []
        long_lines = 0

        def notes() -> str:
            text = ""
            if too_big:
                shown = ", ".join(too_big[:10]) + (", ..." if len(too_big) > 10 else "")
                files = "file" if len(too_big) == 1 else "files"
                text += (
                    f"\n[skipped {len(too_big)} {files} over {_size(max_file_bytes)}: {shown}; "
                    "read them with read_file, which takes offset and limit]"
                )
            if long_lines:
                lines = "line" if long_lines == 1 else "lines"
                text += (
                    f"\n[{long_lines} {lines} longer than {max_line} characters: searched "
                    f"in the first {max_line} characters only]"
                )
            return text

        def too_slow(where: str) -> ToolError:
            found = "\n".join(out) if out else "(none)"
            return ToolError(
                f"Pattern {pattern.pattern!r} took too long: the search stopped after "
                f"{deadline:g} s, at {where}. Use a simpler pattern (avoid nested "
                f"repetition such as '(a+)+') or a narrower glob. Matches found so far:\n"
                f"{found}{notes()}"
            )

        for rel in _glob(workspace, glob):
            anyio.from_thread.check_cancelled()
            if time.monotonic() >= stop_at:
                raise too_slow(rel)
            try:
                entry, binary = workspace.open_file(rel)
            except (PathOutsideWorkdirError, OSError):
                continue  # gone, or swapped for a symlink out, since the listing
            with entry, binary:
                info = os.fstat(binary.fileno())
                if not stat.S_ISREG(info.st_mode):
                    continue
                if info.st_size > max_file_bytes:
                    too_big.append(rel)
                    continue
                if _is_binary(binary):
                    continue
                text_lines = io.TextIOWrapper(binary, encoding="utf-8", errors="strict")
                lineno = 0
                try:
                    while line := text_lines.readline(max_line):
                        lineno += 1
                        if len(line) == max_line and not line.endswith("\n"):
                            long_lines += 1
                            _skip_line(text_lines)
                        anyio.from_thread.check_cancelled()
                        left = stop_at - time.monotonic()
                        if left <= 0:
                            raise too_slow(f"{rel}:{lineno}")
                        try:
                            # concurrent=True releases the GIL while matching (the
                            # string is immutable), so the event loop keeps running.
                            found = pattern.search(line, timeout=left, concurrent=True)
                        except TimeoutError:
                            raise too_slow(f"{rel}:{lineno}") from None
                        if found is None:
                            continue
                        text = line.rstrip("\r\n")
                        if len(text) > GREP_LINE_LIMIT:
                            text = text[:GREP_LINE_LIMIT] + "…"
                        hit = f"{rel}:{lineno}:{text}"
                        used += len(hit.encode("utf-8")) + 1
                        if len(out) >= max_matches or used > max_bytes:
                            return (
                                "\n".join(out)
                                + f"\n[stopped after {len(out)} matches; "
                                + "narrow the pattern or the glob]"
                                + notes()
                            )
                        out.append(hit)
                except (UnicodeDecodeError, OSError):
                    continue  # not text: nothing more to match
        if not out:
            return f"No matches for {pattern.pattern!r}." + notes()
        return "\n".join(out) + notes()

    async def run(args: dict[str, Any]) -> str:
        pattern = _str_arg(args, "pattern")
        glob = _str_arg(args, "glob", "**/*")
        flags = regex.IGNORECASE if args.get("ignore_case") is True else 0
        try:
            compiled = regex.compile(pattern, flags)
        except regex.error as exc:
            raise ToolError(f"Invalid regular expression {pattern!r}: {exc}") from exc
        return await _off_loop(lambda: search(compiled, glob))

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
        read_only=True,
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


def edit_file_tool(workspace: Workspace, *, max_bytes: int = EDIT_FILE_LIMIT) -> Tool:
    """`edit_file(path, old_text, new_text)`: replace one exact occurrence.

    `old_text` must occur exactly once; otherwise a `ToolError` says it is
    absent or how many times it occurs. The file is rewritten atomically.
    A file over `max_bytes` is refused with a `ToolError` (it is read whole).
    """

    def edit(raw: str, old: str, new: str) -> str:
        entry, binary = _open_regular(workspace, raw, write=True)
        with entry, binary:
            return replace_once(entry, binary, raw, old, new)

    def replace_once(entry: Entry, binary: BinaryIO, raw: str, old: str, new: str) -> str:
        text = _read_text(binary, raw, max_bytes)
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
