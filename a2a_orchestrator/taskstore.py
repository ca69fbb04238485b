"""`SQLiteTaskStore`: a2a-sdk's `TaskStore` on one SQLite file.

Why not the SDK's `DatabaseTaskStore` for a role server's own file: through
SQLAlchemy's async layer and aiosqlite, each save or get costs about 2 ms
here, and the SDK saves the task on every event, so a five-event turn spent
~40 ms in the store (bench/delegation.py). This store keeps each task as its
protobuf bytes in one row and runs plain sqlite3 in a worker thread: a few
hundred microseconds a call. For PostgreSQL, or several replicas on one
database, pass an SQLAlchemy URL and the server uses `DatabaseTaskStore`.

Tasks are scoped to their owner (the authenticated user) like the SDK's
stores: another owner's task is not found. Only the server itself looks
across owners: `context_owners` (which callers use a context id, so one
caller cannot continue a conversation in another's context) and
`unfinished` (start-up recovery).

`ObservedTaskStore` wraps any task store to tell a listener of every save
(the quotas learn from it which turns run and what they used).
"""

from __future__ import annotations

import base64
import builtins
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import DatabaseTaskStore, TaskStore
from a2a.types import InvalidParamsError, ListTasksRequest, ListTasksResponse, Task, TaskState
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE

from .sqlitefile import SQLiteFile

__all__ = ["ObservedTaskStore", "SQLiteTaskStore", "context_owners"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    context_id TEXT NOT NULL,
    state INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_owner_updated ON tasks (owner, updated_ns DESC, id DESC);
CREATE INDEX IF NOT EXISTS tasks_context ON tasks (context_id);
"""


def _updated_ns(task: Task) -> int:
    if task.status.HasField("timestamp"):
        return int(task.status.timestamp.ToNanoseconds())
    return time.time_ns()


def _cursor(updated_ns: int, task_id: str) -> str:
    return base64.urlsafe_b64encode(f"{updated_ns}:{task_id}".encode()).decode()


def _uncursor(token: str) -> tuple[int, str]:
    try:
        updated, _, task_id = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        return int(updated), task_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidParamsError(message=f"Invalid page token: {token}") from exc


class SQLiteTaskStore(TaskStore):
    """A task store on one SQLite file (see the module docstring)."""

    def __init__(
        self, path: str | Path, owner_resolver: OwnerResolver = resolve_user_scope
    ) -> None:
        self.path = Path(path)
        self._owner = owner_resolver
        self._file = SQLiteFile(path, "task store")
        self._db = self._file.conn
        self._db.executescript(_SCHEMA)
        self._run = self._file.run

    def close(self) -> None:
        self._file.close()

    async def save(self, task: Task, context: ServerCallContext) -> None:
        row = (
            task.id,
            self._owner(context),
            task.context_id,
            int(task.status.state),
            _updated_ns(task),
            task.SerializeToString(),
        )

        def write() -> None:
            with self._db:
                self._db.execute(
                    "INSERT INTO tasks (id, owner, context_id, state, updated_ns, data) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                    "context_id = excluded.context_id, state = excluded.state, "
                    "updated_ns = excluded.updated_ns, data = excluded.data "
                    "WHERE tasks.owner = excluded.owner",
                    row,
                )

        await self._run(write)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        owner = self._owner(context)

        def read() -> bytes | None:
            found = self._db.execute(
                "SELECT data FROM tasks WHERE id = ? AND owner = ?", (task_id, owner)
            ).fetchone()
            return found[0] if found else None

        data = await self._run(read)
        return Task.FromString(data) if data is not None else None

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        owner = self._owner(context)

        def remove() -> None:
            with self._db:
                self._db.execute("DELETE FROM tasks WHERE id = ? AND owner = ?", (task_id, owner))

        await self._run(remove)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """Newest first (by the status timestamp, then id), paged by an opaque cursor."""
        where = ["owner = ?"]
        args: list[Any] = [self._owner(context)]
        if params.context_id:
            where.append("context_id = ?")
            args.append(params.context_id)
        if params.status != TaskState.TASK_STATE_UNSPECIFIED:
            where.append("state = ?")
            args.append(int(params.status))
        if params.HasField("status_timestamp_after"):
            where.append("updated_ns >= ?")
            args.append(params.status_timestamp_after.ToNanoseconds())
        page_where = list(where)
        page_args = list(args)
        if params.page_token:
            updated, task_id = _uncursor(params.page_token)
            page_where.append("(updated_ns < ? OR (updated_ns = ? AND id < ?))")
            page_args.extend([updated, updated, task_id])
        page_size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE

        def query() -> tuple[int, list[tuple[bytes, int, str]]]:
            total = self._db.execute(
                f"SELECT COUNT(*) FROM tasks WHERE {' AND '.join(where)}", args
            ).fetchone()[0]
            rows = self._db.execute(
                f"SELECT data, updated_ns, id FROM tasks WHERE {' AND '.join(page_where)} "
                "ORDER BY updated_ns DESC, id DESC LIMIT ?",
                [*page_args, page_size + 1],
            ).fetchall()
            return int(total), rows

        total, rows = await self._run(query)
        more = len(rows) > page_size
        rows = rows[:page_size]
        return ListTasksResponse(
            tasks=[Task.FromString(data) for data, _, _ in rows],
            next_page_token=_cursor(rows[-1][1], rows[-1][2]) if more else "",
            total_size=total,
            page_size=page_size,
        )

    async def context_owners(self, context_id: str) -> set[str]:
        """The owners of the tasks in `context_id`, whoever asks."""

        def query() -> builtins.list[tuple[str]]:
            return self._db.execute(
                "SELECT DISTINCT owner FROM tasks WHERE context_id = ?", (context_id,)
            ).fetchall()

        return {owner for (owner,) in await self._run(query)}

    async def unfinished(self) -> builtins.list[tuple[Task, str]]:
        """Tasks still submitted or working, with their owners (start-up recovery)."""

        def query() -> builtins.list[tuple[bytes, str]]:
            return self._db.execute(
                "SELECT data, owner FROM tasks WHERE state IN (?, ?)",
                (int(TaskState.TASK_STATE_SUBMITTED), int(TaskState.TASK_STATE_WORKING)),
            ).fetchall()

        return [(Task.FromString(data), owner) for data, owner in await self._run(query)]


class ObservedTaskStore(TaskStore):
    """`inner`, telling `on_save` of every task saved, after it is saved."""

    def __init__(
        self, inner: TaskStore, on_save: Callable[[Task, ServerCallContext], Awaitable[None]]
    ) -> None:
        self.inner = inner
        self._on_save = on_save

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await self.inner.save(task, context)
        await self._on_save(task, context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self.inner.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.inner.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        await self.inner.delete(task_id, context)


async def context_owners(store: object, context_id: str) -> set[str]:
    """The owners of the tasks in `context_id` (any owner's), for the stores
    that can tell (ours, a2a-sdk's SQL store); other stores tell nothing."""
    while isinstance(store, ObservedTaskStore):  # quotas and metrics each wrap it
        store = store.inner
    if isinstance(store, SQLiteTaskStore):
        return await store.context_owners(context_id)
    if isinstance(store, DatabaseTaskStore):
        from sqlalchemy import select

        model = store.task_model
        async with store.async_session_maker() as session:
            result = await session.execute(
                select(model.owner).where(model.context_id == context_id).distinct()
            )
            return {str(owner) for owner in result.scalars()}
    return set()
