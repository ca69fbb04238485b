"""Callers: who may call a server, by token, and how much each may take.

The operator keeps a callers file (TOML) on the server; it holds a salted
hash of each caller's token, never the token, and the limits of each caller:

    # Limits of every caller that sets none of its own (all optional).
    [limits]
    concurrent_tasks = 4
    tasks_per_minute = 30
    tokens_per_day = 2000000

    [callers.reports-team]                 # a2a-orchestrator token add reports-team --file F
    token_hash = "sha256:9c1e...:4be0..."
    concurrent_tasks = 2

    [callers.ops]
    token_hash = "sha256:51aa...:07c3..."
    operator = true                        # also sees the sessions run from the CLI

    [subjects."svc-billing@clients"]       # an OAuth2 caller (the JWT's `sub`): limits only
    tokens_per_day = 100000

A token hash is `sha256:SALT:DIGEST`, DIGEST the hex SHA-256 of `SALT:TOKEN`;
by hand: `printf '%s' "$SALT:$TOKEN" | sha256sum`. A plain salted SHA-256 is
enough because tokens are long random strings (`new_token`: 256 bits); a
slow password hash would cost every request one hash per caller and buy
nothing against tokens nobody can guess.

The file is read again when it changes (its mtime, size or inode; checked
on each request, a `stat`): adding, rotating or removing a caller takes
effect without a restart. A file that no longer parses keeps the callers of
the last good one (an editor saving half a file must not lock everyone out)
and is logged; a file that is gone means no file callers at all.

The token in `A2A_AUTH_TOKEN` (the single shared token of earlier versions)
is one more caller, named `default`; the file's `[limits]` apply to it.

An operator (the `default` caller, or a file caller marked `operator =
true`) is a caller whose views (the HTTP API, the web view) also show the
sessions that belong to no caller: those run from the command line on the
server's store. It owns nothing more than any caller.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from pydantic import Field, StrictInt, StrictStr

from ...configfile import Flag, OperatorFile, check, must_be
from ...errors import ConfigError

__all__ = [
    "DEFAULT_CALLER",
    "JWT_OWNER_PREFIX",
    "Caller",
    "CallerFile",
    "CallerKind",
    "Limits",
    "add_caller",
    "hash_token",
    "new_token",
    "token_matches",
]

logger = logging.getLogger(__name__)

DEFAULT_CALLER = "default"
LEGACY_OWNER = "a2a-client"
"""The owner of tasks stored before callers had names (the single shared
token): no caller may take the name and so see those tasks."""
RESERVED_NAMES = frozenset({DEFAULT_CALLER, LEGACY_OWNER})
"""The name of the caller holding the server's single token (`A2A_AUTH_TOKEN`)."""

JWT_OWNER_PREFIX = "jwt:"
"""Prefix of an OAuth2 caller's owner key: `jwt:<sub>` never equals a file caller's name."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_HASH = re.compile(r"sha256:([0-9a-f]{16,64}):([0-9a-f]{64})")
_LIMIT_FIELDS = ("concurrent_tasks", "tasks_per_minute", "tokens_per_day")


class CallerKind(StrEnum):
    """How a caller proved who it is."""

    TOKEN = "token"
    """A token from the callers file, or the server's single token."""
    JWT = "jwt"
    """An OAuth2 bearer JWT signed by the issuer the operator trusts."""


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one caller may take of a server; `None` is no limit."""

    concurrent_tasks: int | None = None
    """Turns running at once (a task waiting for input does not count)."""
    tasks_per_minute: int | None = None
    """Messages that start work (a new task or a follow-up) in any 60 seconds."""
    tokens_per_day: int | None = None
    """Model tokens (input + output) of finished turns per UTC day."""

    def over(self, defaults: Limits) -> Limits:
        """These limits, each unset one taken from `defaults`."""
        merged = {}
        for name in _LIMIT_FIELDS:
            own = getattr(self, name)
            merged[name] = own if own is not None else getattr(defaults, name)
        return Limits(**merged)


@dataclass(frozen=True, kw_only=True)
class Caller:
    """An authenticated caller."""

    name: str
    """Its name: the callers file's table name, `default`, or the JWT's `sub`."""
    kind: CallerKind
    """How it proved who it is."""
    operator: bool = field(default=False, compare=False)
    """It also sees the sessions of no caller (see the module docstring)."""

    @property
    def owner(self) -> str:
        """The key its tasks, sessions and usage are kept under."""
        return JWT_OWNER_PREFIX + self.name if self.kind is CallerKind.JWT else self.name

    @classmethod
    def from_owner(cls, owner: str) -> Caller:
        """The caller an owner key belongs to (the inverse of `owner`)."""
        if owner.startswith(JWT_OWNER_PREFIX):
            return cls(name=owner.removeprefix(JWT_OWNER_PREFIX), kind=CallerKind.JWT)
        return cls(name=owner, kind=CallerKind.TOKEN)


def new_token() -> str:
    """A new random caller token (256 bits)."""
    return "a2a_" + secrets.token_urlsafe(32)


def hash_token(token: str, *, salt: str | None = None) -> str:
    """The `sha256:SALT:DIGEST` hash of `token` the callers file keeps."""
    salt = salt if salt is not None else secrets.token_hex(16)
    digest = hashlib.sha256(f"{salt}:{token}".encode()).hexdigest()
    return f"sha256:{salt}:{digest}"


def token_matches(token: str, token_hash: str) -> bool:
    """Whether `token` is the one `token_hash` was made from (constant time)."""
    match = _HASH.fullmatch(token_hash)
    if match is None:
        return False
    salt, digest = match.groups()
    candidate = hashlib.sha256(f"{salt}:{token}".encode()).hexdigest()
    return hmac.compare_digest(candidate.encode(), digest.encode())


@dataclass(frozen=True, kw_only=True)
class _Entry:
    name: str
    salt: str
    digest: bytes
    limits: Limits
    operator: bool = False


@dataclass(frozen=True, kw_only=True)
class _Parsed:
    entries: tuple[_Entry, ...] = ()
    defaults: Limits = field(default_factory=Limits)
    subjects: Mapping[str, Limits] = field(default_factory=dict)


class CallerFile:
    """A callers file, read again whenever it changes (see the module docstring).

    Raises `ConfigError` when first opened on a missing or bad file: a
    server is not started on a typo.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser()
        self._signature: tuple[int, int, int] | None = None
        self._parsed = _Parsed()
        try:
            self._signature = _signature(self.path)
        except FileNotFoundError:
            raise ConfigError(f"callers file {self.path} does not exist") from None
        except OSError as exc:
            raise ConfigError(f"cannot read callers file {self.path}: {exc}") from exc
        self._parsed = _parse(self.path)

    def _current(self) -> _Parsed:
        # One stat per request: cheap, and a changed file takes effect at
        # the next request. The read only happens when the file changed.
        try:
            signature: tuple[int, int, int] | None = _signature(self.path)
        except OSError:
            signature = None
        if signature == self._signature:
            return self._parsed
        self._signature = signature
        if signature is None:
            logger.warning("callers file %s is gone: no caller of it is accepted", self.path)
            self._parsed = _Parsed()
            return self._parsed
        try:
            self._parsed = _parse(self.path)
            logger.info("callers file %s reloaded", self.path)
        except ConfigError as exc:
            logger.error("%s; the callers read before stay in force", exc)
        return self._parsed

    def match(self, token: str) -> Caller | None:
        """The caller whose token this is, if any.

        Every entry is compared (no early exit), each in constant time, so
        the time taken says nothing about which entry, or how much of one,
        matched.
        """
        found: _Entry | None = None
        for entry in self._current().entries:
            candidate = hashlib.sha256(f"{entry.salt}:{token}".encode()).hexdigest().encode()
            if hmac.compare_digest(candidate, entry.digest) and found is None:
                found = entry
        if found is None:
            return None
        return Caller(name=found.name, kind=CallerKind.TOKEN, operator=found.operator)

    def limits(self, caller: Caller) -> Limits:
        """The caller's limits, unset ones from the file's `[limits]`."""
        parsed = self._current()
        own: Limits | None
        if caller.kind is CallerKind.JWT:
            own = parsed.subjects.get(caller.name)
        else:
            own = next((e.limits for e in parsed.entries if e.name == caller.name), None)
        return (own or Limits()).over(parsed.defaults)

    def names(self) -> list[str]:
        """The names of the file's token callers."""
        return [entry.name for entry in self._current().entries]


def _signature(path: Path) -> tuple[int, int, int]:
    stat = os.stat(path)
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


def _parse(path: Path) -> _Parsed:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read callers file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"callers file {path} does not parse: {exc}") from exc
    where = f"callers file {path}"
    checked = check(_CallersFile, data, where)
    entries = []
    for name, table in checked.callers.items():
        if not _NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: field 'callers.{name}': a name is letters, digits, '.', '_', '@', "
                "'-' (at most 64)"
            )
        if name in RESERVED_NAMES:
            raise ConfigError(
                f"{where}: field 'callers.{name}': the name {name!r} is reserved "
                f"({DEFAULT_CALLER!r} is the caller of A2A_AUTH_TOKEN, {LEGACY_OWNER!r} owns "
                "tasks stored before callers had names); choose another"
            )
        _, salt, digest = table.token_hash.split(":")  # its pattern was checked
        entries.append(
            _Entry(
                name=name,
                salt=salt,
                digest=digest.encode(),
                limits=table.limits(),
                operator=table.operator,
            )
        )
    subjects = {sub: table.limits() for sub, table in checked.subjects.items()}
    return _Parsed(entries=tuple(entries), defaults=checked.limits.limits(), subjects=subjects)


_Limit = Annotated[StrictInt, Field(ge=0), must_be("an integer >= 0")]


class _LimitsTable(OperatorFile):
    """`[limits]`, a `[subjects.SUB]` table, and the limits of a caller's."""

    concurrent_tasks: _Limit | None = None
    tasks_per_minute: _Limit | None = None
    tokens_per_day: _Limit | None = None

    def limits(self) -> Limits:
        return Limits(
            concurrent_tasks=self.concurrent_tasks,
            tasks_per_minute=self.tasks_per_minute,
            tokens_per_day=self.tokens_per_day,
        )


class _CallerTable(_LimitsTable):
    """A `[callers.NAME]` table."""

    token_hash: Annotated[
        StrictStr,
        Field(
            pattern=f"^{_HASH.pattern}$",
            description="the caller's token hash "
            "(a2a-orchestrator token add NAME --file FILE makes one)",
        ),
        must_be("'sha256:SALT:DIGEST' (a2a-orchestrator token add NAME --file FILE makes one)"),
    ]
    operator: Flag = False


class _CallersFile(OperatorFile):
    """A callers file: `[limits]`, `[callers.NAME]` and `[subjects.SUB]` tables."""

    limits: _LimitsTable = _LimitsTable()
    callers: dict[str, _CallerTable] = {}
    subjects: dict[str, _LimitsTable] = {}


def add_caller(path: str | Path, name: str, *, replace: bool = False) -> str:
    """Give caller `name` a new token in the callers file at `path`; return
    the token (shown once: the file keeps only its hash).

    A new caller's table is appended (the file is created, private to its
    owner, if missing); `replace` gives an existing caller a new token in
    place, keeping its limits and the file's comments. Raises `ConfigError`
    for a bad name, a name taken (without `replace`) or unknown (with it).
    """
    path = Path(path).expanduser()
    if not _NAME.fullmatch(name) or name in RESERVED_NAMES:
        raise ConfigError(
            f"{name!r} cannot be a caller's name: use letters, digits, '.', '_', '@', '-' "
            f"(at most 64), and not {' or '.join(map(repr, sorted(RESERVED_NAMES)))}"
        )
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if text:
        _parse(path)  # never append to a file that does not parse
    token = new_token()
    line = f'token_hash = "{hash_token(token)}"'
    header = re.compile(rf'^\[callers\.(?:{re.escape(name)}|"{re.escape(name)}")\]\s*(#.*)?$')
    lines = text.splitlines()
    at = next((i for i, text_line in enumerate(lines) if header.match(text_line)), None)
    if at is None:
        if replace:
            raise ConfigError(f"no caller {name!r} in {path} to give a new token")
        block = f"[callers.{name}]\n{line}\n"
        text = f"{text.rstrip()}\n\n{block}" if text.strip() else block
    else:
        if not replace:
            raise ConfigError(
                f"caller {name!r} is already in {path}; use --replace to give it a new token"
            )
        end = next(
            (i for i in range(at + 1, len(lines)) if lines[i].lstrip().startswith("[")),
            len(lines),
        )
        hashes = [i for i in range(at + 1, end) if lines[i].lstrip().startswith("token_hash")]
        if len(hashes) != 1:
            raise ConfigError(f"caller {name!r} in {path} has no single token_hash line to replace")
        lines[hashes[0]] = line
        text = "\n".join(lines) + "\n"
    _write_private(path, text)
    return token


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a reader sees the old or the new
    file, never half of one); a new file is readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # An existing file keeps its mode (a service's group may read it).
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o600
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # exactly this mode, whatever the umask
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
