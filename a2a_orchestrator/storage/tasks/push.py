"""Where a server keeps its tasks' push notification configs: beside its tasks.

`open_push_config_store` picks the store for a task store: a role server's
own SQLite file (`SQLiteTaskStore`) gets `SQLitePushConfigStore`, a table
in the same file; replicas' store on PostgreSQL (`PgTaskStore`) gets
`PgPushConfigStore`, a table in that database on the task store's asyncpg
connection; an SQLAlchemy URL (`DatabaseTaskStore`) gets a2a-sdk's
`DatabasePushNotificationConfigStore` on the same engine. Any way, configs
survive a restart of the server.

`SQLitePushConfigStore` keeps each config as its protobuf bytes, scoped to
the caller that registered it like the SDK's stores (another caller's are
not listed, read or deleted), while delivery reads every caller's
(`get_info_for_dispatch`). The file has one writer, this server, so the ids
of the tasks that have configs are kept in memory: an event of a task
without any (nearly all of them) costs no read. `PgPushConfigStore` keeps
them the same way in PostgreSQL, shared by replicas (a config registered on
one is delivered by the one running the task), so a delivery costs one
read, with no transaction around it.

A config is kept with the protocol version it was registered in ("1.0",
"0.3": the store is given the function that tells, `ProtocolOf`), so a
webhook registered through the v0.3 methods keeps getting v0.3 payloads
after a restart; `get_targets_for_dispatch` hands each config out with its
version and its owner (`PushTarget`). The SQLite file keeps it in a
`protocol` column (a file from before it has the column added, its configs
"1.0": what they were sent), `PgPushConfigStore` in one too, the
in-memory store beside its configs. a2a-sdk's database store (another
SQLAlchemy URL) keeps no version: its configs all get "1.0".

Every store here keeps the operator's `PushLimits`: each task event becomes
one POST per config of the task, so a caller may not register configs
without bound. A config past a limit (configs per task, all callers';
configs per caller, all tasks; the length of any of its fields: URL, token,
id, tenant, authentication scheme and credentials) is refused
as invalid params (JSON-RPC -32602, HTTP 400) naming the limit; a config
registered again under its id replaces itself and counts once. Fields this
protocol version does not know are dropped before a config is kept: over
gRPC they arrive as raw bytes that protobuf would keep and store, of any
size the limits above never see.
"""

from __future__ import annotations

import builtins
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import (
    DatabasePushNotificationConfigStore,
    DatabaseTaskStore,
    InMemoryPushNotificationConfigStore,
    PushNotificationConfigStore,
)
from a2a.server.tasks.push_notification_config_store import normalize_push_notification_config
from a2a.types import InvalidParamsError, TaskPushNotificationConfig
from sqlalchemy import and_, func, select

from ...errors import ConfigError
from ..database import Table
from ..database.postgres import PgDatabase, Tx
from ..sqlitefile import SQLiteFile
from .postgres import PgTaskStore
from .sqlite import SQLiteTaskStore

__all__ = [
    "PUSH_MAX_PER_OWNER_ENV",
    "PUSH_MAX_PER_TASK_ENV",
    "DispatchStore",
    "PgPushConfigStore",
    "ProtocolOf",
    "PushLimits",
    "PushTarget",
    "SQLitePushConfigStore",
    "count_setting",
    "open_push_config_store",
]

logger = logging.getLogger(__name__)

PUSH_MAX_PER_TASK_ENV = "A2A_PUSH_MAX_PER_TASK"
PUSH_MAX_PER_OWNER_ENV = "A2A_PUSH_MAX_PER_OWNER"

CURRENT_PROTOCOL = "1.0"

ProtocolOf = Callable[[ServerCallContext], str]
"""The protocol version ("1.0", "0.3") a registering request was made in
(`protocol/versions.py` `call_protocol`, given by the server)."""


def _current(context: ServerCallContext) -> str:
    return CURRENT_PROTOCOL


@dataclass(frozen=True, kw_only=True)
class PushTarget:
    """One webhook of a task, as delivery needs it."""

    config: TaskPushNotificationConfig
    protocol: str
    """The protocol version it was registered in: its payloads' shape."""
    owner: str
    """The caller that registered it (the task's owner)."""


@dataclass(frozen=True)
class PushLimits:
    """How many push configs, and how large, a server keeps (see the module docstring)."""

    per_task: int = 10
    """Configs of one task, all callers' together."""
    per_owner: int = 1000
    """Configs one caller has, all tasks together."""
    url_length: int = 2048
    token_length: int = 1024
    id_length: int = 256
    """Of the config's id, and of the tenant and task id it names."""
    scheme_length: int = 64
    """Of `authentication.scheme`."""
    credentials_length: int = 4096
    """Of `authentication.credentials` (sent as a header with every delivery)."""

    @classmethod
    def from_settings(cls, per_task: int | None = None, per_owner: int | None = None) -> PushLimits:
        """The flags' values (`--push-max-per-task`, `--push-max-per-owner`),
        else `$A2A_PUSH_MAX_PER_TASK` / `$A2A_PUSH_MAX_PER_OWNER`, else the defaults."""
        return cls(
            per_task=count_setting(
                per_task, PUSH_MAX_PER_TASK_ENV, cls.per_task, what="push config limit"
            ),
            per_owner=count_setting(
                per_owner, PUSH_MAX_PER_OWNER_ENV, cls.per_owner, what="push config limit"
            ),
        )

    def check_sizes(self, config: TaskPushNotificationConfig) -> None:
        """Refuse (invalid params) a config with a field too long: every
        string field of it has a limit, so a config is a few KiB at most."""
        fields = (
            ("URL", config.url, self.url_length),
            ("token", config.token, self.token_length),
            ("id", config.id, self.id_length),
            ("task id", config.task_id, self.id_length),
            ("tenant", config.tenant, self.id_length),
            ("authentication scheme", config.authentication.scheme, self.scheme_length),
            (
                "authentication credentials",
                config.authentication.credentials,
                self.credentials_length,
            ),
        )
        for name, value, limit in fields:
            if len(value) > limit:
                raise InvalidParamsError(
                    message=f"push notification {name} longer than {limit} characters"
                )

    def check_counts(self, task_configs: int, owner_configs: int) -> None:
        """Refuse (invalid params) one more config when the task already has
        `task_configs` and its caller `owner_configs`."""
        if task_configs >= self.per_task:
            raise InvalidParamsError(
                message=f"task has {task_configs} push notification configs; the limit is "
                f"{self.per_task} per task (operator setting --push-max-per-task)"
            )
        if owner_configs >= self.per_owner:
            raise InvalidParamsError(
                message=f"caller has {owner_configs} push notification configs; the limit is "
                f"{self.per_owner} per caller (operator setting --push-max-per-owner)"
            )


def _known_fields(config: TaskPushNotificationConfig) -> TaskPushNotificationConfig:
    """A copy of `config` without the unknown fields a binary (gRPC) request
    may carry (see the module docstring)."""
    known = TaskPushNotificationConfig()
    known.CopyFrom(config)
    known.DiscardUnknownFields()
    return known


def count_setting(value: int | None, env: str, default: int, *, what: str) -> int:
    """A limit of at least 1: `value` if given, else the variable `env`, else
    `default`; a bad one is a `ConfigError` naming the variable."""
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        try:
            value = int(text)
        except ValueError as exc:
            raise ConfigError(f"${env}: {text!r} is not a whole number") from exc
    if value < 1:
        raise ConfigError(f"{what} ${env} must be at least 1, not {value}")
    return value


_SCHEMA = """
CREATE TABLE IF NOT EXISTS push_configs (
    task_id TEXT NOT NULL,
    config_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    data BLOB NOT NULL,
    protocol TEXT NOT NULL DEFAULT '1.0',
    PRIMARY KEY (task_id, config_id, owner)
);
"""


def _kept_row(
    limits: PushLimits,
    task_id: str,
    notification_config: TaskPushNotificationConfig,
    owner: str,
    protocol: str,
) -> tuple[TaskPushNotificationConfig, tuple[str, str, str, bytes, str]]:
    """A config as both database stores keep it: its fields within `limits`
    (else refused), unknown fields dropped, normalized; and its row
    (task, config id, owner, protobuf bytes, protocol version)."""
    limits.check_sizes(notification_config)
    config = normalize_push_notification_config(task_id, _known_fields(notification_config))
    return config, (task_id, config.id, owner, config.SerializeToString(), protocol)


class SQLitePushConfigStore(PushNotificationConfigStore):
    """Push configs in a table of one SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        owner_resolver: OwnerResolver = resolve_user_scope,
        limits: PushLimits | None = None,
        protocol_of: ProtocolOf = _current,
    ):
        self._file = SQLiteFile(path, "push config store")
        self._file.conn.executescript(_SCHEMA)
        columns = {row[1] for row in self._file.conn.execute("PRAGMA table_info(push_configs)")}
        if "protocol" not in columns:
            # A file from before configs kept their version: every one of
            # them was sent v1.0 payloads, and keeps being sent them.
            with self._file.conn:
                self._file.conn.execute(
                    "ALTER TABLE push_configs ADD COLUMN protocol TEXT NOT NULL DEFAULT '1.0'"
                )
        self._owner = owner_resolver
        self._protocol_of = protocol_of
        self.limits = limits or PushLimits()
        rows = self._file.conn.execute("SELECT DISTINCT task_id FROM push_configs").fetchall()
        self._tasks: set[str] = {row[0] for row in rows}
        """Ids of the tasks that have configs (any caller's)."""

    def close(self) -> None:
        self._file.close()

    async def set_info(
        self,
        task_id: str,
        notification_config: TaskPushNotificationConfig,
        context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        config, row = _kept_row(
            self.limits,
            task_id,
            notification_config,
            self._owner(context),
            self._protocol_of(context),
        )

        def write() -> None:
            conn = self._file.conn
            with conn:
                # Counted in the writing transaction: this file's only writer.
                replaces = conn.execute(
                    "SELECT 1 FROM push_configs WHERE task_id = ? AND config_id = ? AND owner = ?",
                    row[:3],
                ).fetchone()
                if replaces is None:
                    self.limits.check_counts(
                        _one(conn, "SELECT count(*) FROM push_configs WHERE task_id = ?", task_id),
                        _one(conn, "SELECT count(*) FROM push_configs WHERE owner = ?", row[2]),
                    )
                # Registered again, a config takes the version it is registered in now.
                conn.execute(
                    "INSERT INTO push_configs (task_id, config_id, owner, data, protocol) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id, config_id, owner) "
                    "DO UPDATE SET data = excluded.data, protocol = excluded.protocol",
                    row,
                )

        await self._file.run(write)
        self._tasks.add(task_id)
        return config

    async def _select(
        self, where: str, params: builtins.list[Any]
    ) -> list[TaskPushNotificationConfig]:
        def read() -> builtins.list[bytes]:
            sql = f"SELECT data FROM push_configs WHERE {where} ORDER BY config_id"
            return [row[0] for row in self._file.conn.execute(sql, params)]

        return [TaskPushNotificationConfig.FromString(data) for data in await self._file.run(read)]

    async def get_info(
        self, task_id: str, context: ServerCallContext
    ) -> list[TaskPushNotificationConfig]:
        if task_id not in self._tasks:
            return []
        return await self._select("task_id = ? AND owner = ?", [task_id, self._owner(context)])

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        return [target.config for target in await self.get_targets_for_dispatch(task_id)]

    async def get_targets_for_dispatch(self, task_id: str) -> list[PushTarget]:
        """Every caller's configs of `task_id`, with their version and owner."""
        if task_id not in self._tasks:
            return []

        def read() -> builtins.list[tuple[bytes, str, str]]:
            sql = (
                "SELECT data, protocol, owner FROM push_configs WHERE task_id = ? "
                "ORDER BY config_id"
            )
            return list(self._file.conn.execute(sql, [task_id]))

        return [
            PushTarget(
                config=TaskPushNotificationConfig.FromString(data), protocol=protocol, owner=owner
            )
            for data, protocol, owner in await self._file.run(read)
        ]

    async def delete_info(
        self, task_id: str, context: ServerCallContext, config_id: str | None = None
    ) -> None:
        where, params = "task_id = ? AND owner = ?", [task_id, self._owner(context)]
        if config_id is not None:
            where, params = where + " AND config_id = ?", [*params, config_id]

        def delete() -> bool:
            with self._file.conn:
                self._file.conn.execute(f"DELETE FROM push_configs WHERE {where}", params)
                left = self._file.conn.execute(
                    "SELECT 1 FROM push_configs WHERE task_id = ? LIMIT 1", [task_id]
                ).fetchone()
            return left is not None

        if not await self._file.run(delete):
            self._tasks.discard(task_id)


PG_TABLE = Table(
    name="push_configs",
    columns=(
        "task_id TEXT NOT NULL, config_id TEXT NOT NULL, owner TEXT NOT NULL, "
        "data BYTEA NOT NULL, protocol TEXT NOT NULL DEFAULT '1.0', "
        "PRIMARY KEY (task_id, config_id, owner)"
    ),
    indexes=("CREATE INDEX IF NOT EXISTS push_configs_owner ON push_configs (owner)",),
)


class PgPushConfigStore(PushNotificationConfigStore):
    """Push configs in a table of replicas' PostgreSQL database, on the task
    store's connection (see the module docstring). Replicas counting at once
    may each let one config past a limit: a bound, not an exact count."""

    def __init__(
        self,
        task_store: PgTaskStore,
        owner_resolver: OwnerResolver = resolve_user_scope,
        limits: PushLimits | None = None,
        protocol_of: ProtocolOf = _current,
    ):
        self._db = PgDatabase(task_store.connection)
        self._owner = owner_resolver
        self.limits = limits or PushLimits()
        self._protocol_of = protocol_of
        self._created = False

    async def _ready(self) -> PgDatabase:
        if not self._created:
            await self._db.create(PG_TABLE)
            self._created = True
        return self._db

    async def set_info(
        self,
        task_id: str,
        notification_config: TaskPushNotificationConfig,
        context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        config, row = _kept_row(
            self.limits,
            task_id,
            notification_config,
            self._owner(context),
            self._protocol_of(context),
        )

        async def write(tx: Tx) -> None:
            counts = await tx.fetchrow(
                "SELECT EXISTS (SELECT 1 FROM push_configs WHERE task_id = ? AND config_id = ? "
                "AND owner = ?) AS replaces, "
                "(SELECT count(*) FROM push_configs WHERE task_id = ?) AS task, "
                "(SELECT count(*) FROM push_configs WHERE owner = ?) AS owner",
                (*row[:3], task_id, row[2]),
            )
            assert counts is not None
            if not counts["replaces"]:
                self.limits.check_counts(int(counts["task"]), int(counts["owner"]))
            await tx.execute(
                "INSERT INTO push_configs (task_id, config_id, owner, data, protocol) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id, config_id, owner) "
                "DO UPDATE SET data = excluded.data, protocol = excluded.protocol",
                row,
            )

        await (await self._ready()).write(write)
        return config

    async def _select(
        self, where: str, params: builtins.list[Any]
    ) -> list[TaskPushNotificationConfig]:
        db = await self._ready()
        rows = await db.fetch(
            f"SELECT data FROM push_configs WHERE {where} ORDER BY config_id", params
        )
        return [TaskPushNotificationConfig.FromString(row["data"]) for row in rows]

    async def get_info(
        self, task_id: str, context: ServerCallContext
    ) -> list[TaskPushNotificationConfig]:
        return await self._select("task_id = ? AND owner = ?", [task_id, self._owner(context)])

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        return await self._select("task_id = ?", [task_id])

    async def get_targets_for_dispatch(self, task_id: str) -> list[PushTarget]:
        """Every caller's configs of `task_id`, with their version and owner."""
        db = await self._ready()
        rows = await db.fetch(
            "SELECT data, protocol, owner FROM push_configs WHERE task_id = ? ORDER BY config_id",
            [task_id],
        )
        return [
            PushTarget(
                config=TaskPushNotificationConfig.FromString(row["data"]),
                protocol=row["protocol"],
                owner=row["owner"],
            )
            for row in rows
        ]

    async def delete_info(
        self, task_id: str, context: ServerCallContext, config_id: str | None = None
    ) -> None:
        where, params = "task_id = ? AND owner = ?", [task_id, self._owner(context)]
        if config_id is not None:
            where, params = where + " AND config_id = ?", [*params, config_id]
        await (await self._ready()).execute(f"DELETE FROM push_configs WHERE {where}", params)


def _one(conn: Any, sql: str, *params: Any) -> int:
    return int(conn.execute(sql, params).fetchone()[0])


class _LimitedDatabaseStore(DatabasePushNotificationConfigStore):
    """a2a-sdk's database store, keeping `PushLimits`. Replicas counting at
    once may each let one config past a limit: a bound, not an exact count."""

    def __init__(self, engine: Any, limits: PushLimits) -> None:
        super().__init__(engine, create_table=True)
        self.limits = limits

    async def set_info(
        self,
        task_id: str,
        notification_config: TaskPushNotificationConfig,
        context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        self.limits.check_sizes(notification_config)
        await self._ensure_initialized()
        model, owner = self.config_model, self.owner_resolver(context)
        config_id = notification_config.id or task_id
        async with self.async_session_maker() as session:
            replaces = await session.scalar(
                select(func.count())
                .select_from(model)
                .where(
                    and_(
                        model.task_id == task_id,
                        model.config_id == config_id,
                        model.owner == owner,
                    )
                )
            )
            if not replaces:
                count = select(func.count()).select_from(model)
                self.limits.check_counts(
                    int(await session.scalar(count.where(model.task_id == task_id)) or 0),
                    int(await session.scalar(count.where(model.owner == owner)) or 0),
                )
        return await super().set_info(task_id, _known_fields(notification_config), context)

    async def get_targets_for_dispatch(self, task_id: str) -> list[PushTarget]:
        """Every caller's configs of `task_id`: all "1.0" (see the module docstring)."""
        await self._ensure_initialized()
        model = self.config_model
        async with self.async_session_maker() as session:
            rows = (await session.scalars(select(model).where(model.task_id == task_id))).all()
        targets = []
        for row in rows:
            try:
                config = self._from_orm(row)
            except ValueError:
                # As a2a-sdk's own dispatch read: one unreadable row costs only itself.
                logger.exception("push config %s of task %s cannot be read", row.config_id, task_id)
                continue
            targets.append(PushTarget(config=config, protocol=CURRENT_PROTOCOL, owner=row.owner))
        return targets


class _LimitedMemoryStore(InMemoryPushNotificationConfigStore):
    """a2a-sdk's in-memory store, keeping `PushLimits` and each config's version."""

    def __init__(self, limits: PushLimits, protocol_of: ProtocolOf = _current) -> None:
        super().__init__()
        self.limits = limits
        self._protocol_of = protocol_of
        self._protocols: dict[tuple[str, str, str], str] = {}
        """(owner, task id, config id): the version the config was registered in."""

    async def set_info(
        self,
        task_id: str,
        notification_config: TaskPushNotificationConfig,
        context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        self.limits.check_sizes(notification_config)
        owner = self.owner_resolver(context)
        config_id = notification_config.id or task_id
        with self.lock:
            mine = self._push_notification_infos.get(owner, {})
            if not any(c.id == config_id for c in mine.get(task_id, [])):
                self.limits.check_counts(
                    sum(len(t.get(task_id, [])) for t in self._push_notification_infos.values()),
                    sum(len(configs) for configs in mine.values()),
                )
            self._protocols[(owner, task_id, config_id)] = self._protocol_of(context)
            return await super().set_info(task_id, _known_fields(notification_config), context)

    async def get_targets_for_dispatch(self, task_id: str) -> list[PushTarget]:
        """Every caller's configs of `task_id`, with their version and owner."""
        with self.lock:
            return [
                PushTarget(
                    config=config,
                    protocol=self._protocols.get((owner, task_id, config.id), CURRENT_PROTOCOL),
                    owner=owner,
                )
                for owner, tasks in self._push_notification_infos.items()
                for config in tasks.get(task_id, [])
            ]


DispatchStore = (
    SQLitePushConfigStore | PgPushConfigStore | _LimitedDatabaseStore | _LimitedMemoryStore
)
"""A push config store of ours: a2a-sdk's interface and `get_targets_for_dispatch`."""


def open_push_config_store(
    task_store: object, limits: PushLimits | None = None, protocol_of: ProtocolOf = _current
) -> DispatchStore:
    """The push config store beside `task_store` (see the module docstring),
    keeping `limits` (default: `PushLimits()`) and each config's version
    as `protocol_of` tells it; a task store of another kind (kept in
    memory) gets one in memory."""
    limits = limits or PushLimits()
    if isinstance(task_store, SQLiteTaskStore):
        return SQLitePushConfigStore(task_store.path, limits=limits, protocol_of=protocol_of)
    if isinstance(task_store, PgTaskStore):
        return PgPushConfigStore(task_store, limits=limits, protocol_of=protocol_of)
    # a2a-sdk's versioned store: its plain store holds the engine.
    task_store = getattr(task_store, "as_task_store", task_store)
    if isinstance(task_store, DatabaseTaskStore):
        return _LimitedDatabaseStore(task_store.engine, limits)
    return _LimitedMemoryStore(limits, protocol_of)
