"""Where a server keeps its tasks' push notification configs: beside its tasks.

`open_push_config_store` picks the store for a task store: a role server's
own SQLite file (`SQLiteTaskStore`) gets `SQLitePushConfigStore`, a table
in the same file; an SQLAlchemy URL (`DatabaseTaskStore`, PostgreSQL for
replicas) gets a2a-sdk's `DatabasePushNotificationConfigStore` on the same
engine. Either way configs survive a restart of the server.

`SQLitePushConfigStore` keeps each config as its protobuf bytes, scoped to
the caller that registered it like the SDK's stores (another caller's are
not listed, read or deleted), while delivery reads every caller's
(`get_info_for_dispatch`). The file has one writer, this server, so the ids
of the tasks that have configs are kept in memory: an event of a task
without any (nearly all of them) costs no read.
"""

from __future__ import annotations

import builtins
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
from a2a.types import TaskPushNotificationConfig

from .sqlitefile import SQLiteFile
from .taskstore import SQLiteTaskStore

__all__ = ["SQLitePushConfigStore", "open_push_config_store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS push_configs (
    task_id TEXT NOT NULL,
    config_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (task_id, config_id, owner)
);
"""


class SQLitePushConfigStore(PushNotificationConfigStore):
    """Push configs in a table of one SQLite file (see the module docstring)."""

    def __init__(self, path: str | Path, owner_resolver: OwnerResolver = resolve_user_scope):
        self._file = SQLiteFile(path, "push config store")
        self._file.conn.executescript(_SCHEMA)
        self._owner = owner_resolver
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
        config = normalize_push_notification_config(task_id, notification_config)
        row = (task_id, config.id, self._owner(context), config.SerializeToString())

        def write() -> None:
            with self._file.conn:
                self._file.conn.execute(
                    "INSERT INTO push_configs (task_id, config_id, owner, data) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (task_id, config_id, owner) "
                    "DO UPDATE SET data = excluded.data",
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
        if task_id not in self._tasks:
            return []
        return await self._select("task_id = ?", [task_id])

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


def open_push_config_store(task_store: object) -> PushNotificationConfigStore:
    """The push config store beside `task_store` (see the module docstring);
    a task store of another kind (kept in memory) gets one in memory."""
    if isinstance(task_store, SQLiteTaskStore):
        return SQLitePushConfigStore(task_store.path)
    # Replicas' versioned store: its plain store holds the engine they share.
    task_store = getattr(task_store, "as_task_store", task_store)
    if isinstance(task_store, DatabaseTaskStore):
        return DatabasePushNotificationConfigStore(task_store.engine, create_table=True)
    return InMemoryPushNotificationConfigStore()
