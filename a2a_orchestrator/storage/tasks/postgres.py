"""`PgTaskStore`: a2a-sdk's `VersionedTaskStore` on PostgreSQL, for role
server replicas sharing one database.

Written like `SQLiteTaskStore`, over the same layout (`rows`: the task
without its history in an `a2a_tasks` row, each history message in an
`a2a_task_history` row) and the same save logic (`rows.save_rows`: a save
writes the head and the messages it added), on asyncpg
(`database/postgres.py`; a read through it cost 0.12 ms of CPU against
0.93 ms through SQLAlchemy's async layer, which a2a-sdk's own
`VersionedDatabaseTaskStore` uses).

Contract (a2a-sdk's `VersionedTaskStore`, so `DefaultRequestHandlerV2`
keeps its semantics across replicas):
- Each task carries a version, counting its writes. A save from a stale
  version (`prev_version` not the stored one) raises
  `ConcurrentTaskModificationError` and writes nothing; a first save
  (`TaskVersion.MISSING`) of a task that exists likewise. A save moving the
  task to CANCELED overwrites a stored task that is not terminal without a
  version check (a cancel recorded by one replica stops the writer on
  another: its next save is stale), and fails on a terminal or absent one.
- Each save is one statement (data-modifying CTEs): the head upserted
  under the version check, the history rows it added, the applied event
  appended to `task_events` (a2a-sdk's table, read by its
  `DatabaseTaskEventStream`: SubscribeToTask on a replica not running the
  turn sees it) with the new version, and, for the save that ends a turn
  registered with `hand_back`, the conversation lease given back: a turn's
  end and its lease's return are one transaction. Saves that arrive while
  a commit is in flight go together in the next one (`_Grouped`).
- A read is one statement, no transaction: `get` reads the head, the
  history (an array) and the version at once; the first page of a listing
  comes with its count.
- Tasks are scoped to their owner like the SDK's stores; `context_owners`
  and `states` look across owners (the handler's context check, the
  replicas' lease upkeep).
- A database error is a `StoreError`.

What the store knows of a task's history (its count and last message's id
at the version it last read or wrote) lets a save from that version write
only what it added; from any other version the history is written whole.
"""

from __future__ import annotations

import builtins
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from a2a.server.cluster import (
    ConcurrentTaskModificationError,
    StoredTask,
    TaskVersion,
    VersionedTaskStore,
)
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.types import ListTasksRequest, ListTasksResponse, Message, Task, TaskState
from a2a.utils.proto_utils import to_stream_response

from ...errors import StoreError
from ..database import Table
from ..database.postgres import PgConnection, PgDatabase, Tx
from ..groupcommit import GroupCommit, Write
from ..leases import TABLE as LEASES
from ..leases import give_back_sql
from .rows import TERMINAL, ListQuery, Rows, last_id, page_token, save_rows, whole_task

__all__ = ["EVENTS", "HISTORY", "TASKS", "HandBack", "PgTaskStore"]

TASKS = Table(
    name="a2a_tasks",
    columns=(
        "id TEXT PRIMARY KEY, owner TEXT NOT NULL, context_id TEXT NOT NULL, "
        "state INTEGER NOT NULL, updated_ns BIGINT NOT NULL, version BIGINT NOT NULL, "
        "data BYTEA NOT NULL"
    ),
    indexes=(
        "CREATE INDEX IF NOT EXISTS a2a_tasks_owner_updated "
        "ON a2a_tasks (owner, updated_ns DESC, id DESC)",
        "CREATE INDEX IF NOT EXISTS a2a_tasks_context_updated "
        "ON a2a_tasks (context_id, updated_ns DESC, id DESC)",
        # Start-up and upkeep look for the running ones only.
        "CREATE INDEX IF NOT EXISTS a2a_tasks_running ON a2a_tasks (state) WHERE state IN (1, 2)",
    ),
)
"""A task's head (`rows.head_of`) and its version."""

HISTORY = Table(
    name="a2a_task_history",
    columns="task_id TEXT NOT NULL, seq INTEGER NOT NULL, data BYTEA NOT NULL, "
    "PRIMARY KEY (task_id, seq)",
)
"""A task's history messages, one row each (`rows.entries`)."""

EVENTS = Table(
    name="task_events",
    # a2a-sdk's `TaskEventModel`, as SQLAlchemy creates it on PostgreSQL:
    # its `DatabaseTaskEventStream` reads this table.
    columns=(
        "seq BIGSERIAL PRIMARY KEY, task_id VARCHAR(36) NOT NULL, owner VARCHAR(255), "
        "task_version BIGINT NOT NULL, event_data BYTEA NOT NULL"
    ),
    indexes=("CREATE INDEX IF NOT EXISTS ix_task_events_task_id ON task_events (task_id)",),
)
"""Every applied event, with the version it made (a2a-sdk's event log)."""

_RUNNING = (int(TaskState.TASK_STATE_SUBMITTED), int(TaskState.TASK_STATE_WORKING))
_ENDED = tuple(int(state) for state in TERMINAL)

_REMEMBERED = 4096
"""Tasks whose stored history this store knows (most recent)."""

_TASK = (
    "SELECT t.id, t.owner, t.context_id, t.state, t.version, t.data, t.updated_ns, "
    "ARRAY(SELECT h.data FROM a2a_task_history h WHERE h.task_id = t.id ORDER BY h.seq) "
    "AS history FROM a2a_tasks t"
)


class _Params(list[Any]):
    """A statement's parameters: each added gives its marker (`$n`)."""

    def __call__(self, value: Any) -> str:
        self.append(value)
        return f"${len(self)}"


def _save_statement(
    rows: Rows, prev: int | None, canceling: bool, event: bytes | None, hand_back: HandBack | None
) -> tuple[str, _Params]:
    """One save as one statement, returning the new version (no row: the
    version check failed). `prev`: the version saved from (None: a first
    save); `canceling`: no version check, but the stored task must not be
    terminal."""
    p = _Params()
    task_id, owner, context_id, state, updated, head = rows.row
    id_, owner_ = p(task_id), p(owner)
    values = f"{p(context_id)}, {p(state)}, {p(updated)}, {p(head)}"
    if prev is None and not canceling:
        write = (
            "INSERT INTO a2a_tasks AS t (id, owner, context_id, state, updated_ns, data, version) "
            f"VALUES ({id_}, {owner_}, {values}, 1) ON CONFLICT (id) DO NOTHING"
        )
    else:
        check = (
            f"t.state NOT IN ({', '.join(map(str, _ENDED))})"
            if canceling
            else f"t.version = {p(prev)}"
        )
        write = (
            "UPDATE a2a_tasks AS t SET (context_id, state, updated_ns, data, version) = "
            f"({values}, t.version + 1) WHERE t.id = {id_} AND t.owner = {owner_} AND {check}"
        )
    # The rest, each only if the head was written (`FROM head`): the history
    # past the new end goes (a history written whole that became shorter),
    # the rows from `start` on are written (an append conflicts with
    # nothing), the event joins the log with the version it made.
    parts = [
        f"head AS ({write} RETURNING t.version)",
        f"cut AS (DELETE FROM a2a_task_history WHERE task_id = {id_} AND seq >= {p(rows.end)} "
        "AND EXISTS (SELECT 1 FROM head))",
    ]
    if rows.messages:
        parts.append(
            "history AS (INSERT INTO a2a_task_history (task_id, seq, data) "
            f"SELECT {id_}, {p(rows.start)}::int + m.i::int - 1, m.data "
            f"FROM head, unnest({p(rows.messages)}::bytea[]) WITH ORDINALITY AS m(data, i) "
            "ON CONFLICT (task_id, seq) DO UPDATE SET data = excluded.data)"
        )
    if event is not None:
        parts.append(
            "event AS (INSERT INTO task_events (task_id, owner, task_version, event_data) "
            f"SELECT {id_}, {owner_}, head.version, {p(event)} FROM head)"
        )
    if hand_back is not None:
        where = give_back_sql(p("conversation"), p(hand_back.context_id), p(hand_back.holder))
        parts.append(f"lease AS ({where} AND EXISTS (SELECT 1 FROM head))")
    return f"WITH {', '.join(parts)} SELECT version FROM head", p


@dataclass
class HandBack:
    """A turn's conversation lease, to give back with the save that ends the turn."""

    context_id: str
    holder: str
    """The replica holding the lease."""
    given: bool = False
    """Whether a save gave it back (with the turn's end)."""
    giving: bool = False
    """Whether a save that gives it back is being written."""


@dataclass(frozen=True)
class _Stored:
    """What is stored of a task's history at one version."""

    owner: str
    version: int
    count: int
    last: str


def _version(version: TaskVersion) -> int:
    value = version._value
    if not isinstance(value, int):
        raise TypeError(f"PgTaskStore takes the versions it gives (int), got {version!r}")
    return value


class _Grouped(GroupCommit):
    """Saves (one statement each) committed in groups: a group of one runs
    alone, in its own implicit transaction (no BEGIN, no savepoint: one
    statement a save); a group of several runs in one transaction, and if a
    statement fails there the group is rolled back and its saves run again
    one by one, so only the failing one fails."""

    def __init__(self, connection: PgConnection) -> None:
        super().__init__(self._flush_batch)
        self._connection = connection

    async def fetchrow(self, sql: str, params: list[Any]) -> dict[str, Any] | None:
        async def statement(tx: Tx) -> dict[str, Any] | None:
            return await tx.fetchrow(sql, params)

        return cast("dict[str, Any] | None", await self._enqueue(statement))

    async def _flush_batch(self, batch: list[Write]) -> None:
        if len(batch) > 1:
            try:
                await self._connection.run(lambda tx: self._together(tx, batch))
                return
            except StoreError:
                pass  # one of them failed: each alone below, with its own result
        for item in batch:
            try:
                item.result = await self._connection.run(item.fn)
            except StoreError as exc:
                item.error = exc

    @staticmethod
    async def _together(tx: Tx, batch: list[Write]) -> None:
        async with tx.conn.transaction():
            results = [await item.fn(tx) for item in batch]
        for item, result in zip(batch, results, strict=True):
            item.result = result


class PgTaskStore(VersionedTaskStore):
    """a2a-sdk's `VersionedTaskStore` on PostgreSQL (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        owner_resolver: OwnerResolver = resolve_user_scope,
    ) -> None:
        self.url = url
        self.connection = PgConnection(url, "task store")
        self.database = PgDatabase(self.connection, own=True)
        self._owner = owner_resolver
        self._writer = _Grouped(self.connection)
        self._stored: OrderedDict[str, _Stored] = OrderedDict()
        self._hand_backs: dict[str, HandBack] = {}
        """Task id -> the lease its turn's end gives back."""

    async def create(self) -> None:
        """Create the tables (idempotent; once across replicas starting at once)."""
        for table in (LEASES, TASKS, HISTORY, EVENTS):
            await self.database.create(table)

    def close(self) -> None:
        self.database.close()

    # -- the lease a turn's end gives back ------------------------------------------

    def hand_back(self, task_id: str, context_id: str, holder: str) -> HandBack:
        """Give `holder`'s lease of `context_id` back with the save that ends
        `task_id`'s turn (an applied event leaving it neither submitted nor
        working): in that save's transaction."""
        hand_back = HandBack(context_id, holder)
        self._hand_backs[task_id] = hand_back
        return hand_back

    def keep(self, task_id: str) -> None:
        """Give nothing back with `task_id`'s saves (the turn failed: its
        lease went back otherwise)."""
        self._hand_backs.pop(task_id, None)

    # -- VersionedTaskStore ------------------------------------------------------------

    async def save(
        self,
        task: Task,
        *,
        event: Event | None = None,
        prev: Task | None = None,
        prev_version: TaskVersion,
        context: ServerCallContext,
    ) -> TaskVersion:
        del prev  # the store knows what it stored; `prev` is the caller's copy
        owner = self._owner(context)
        state = int(task.status.state)
        canceling = task.status.state == TaskState.TASK_STATE_CANCELED
        known = self._stored.get(task.id)
        stored = None
        if (
            known is not None
            and known.owner == owner
            and not canceling  # no version check: the history stored may be another's
            and not prev_version.is_missing
            and known.version == _version(prev_version)
        ):
            stored = (known.count, known.last)
        rows = save_rows(task, owner, stored)
        hand_back = self._hand_backs.get(task.id)
        if event is None or state in _RUNNING:
            hand_back = None  # not the turn's end
        sql, params = _save_statement(
            rows,
            None if prev_version.is_missing else _version(prev_version),
            canceling,
            to_stream_response(event).SerializeToString() if event is not None else None,
            hand_back,
        )
        if hand_back is not None:
            hand_back.giving = True
        try:
            row = await self._writer.fetchrow(sql, params)
        finally:
            if hand_back is not None:
                hand_back.giving = False
        if row is None:
            self._forget(task.id)
            raise ConcurrentTaskModificationError(task.id)
        version = int(row["version"])
        if hand_back is not None:
            hand_back.given = True
            if self._hand_backs.get(task.id) is hand_back:
                del self._hand_backs[task.id]
        self._know(task.id, _Stored(owner, version, rows.end, last_id(task)), task)
        return TaskVersion(version)

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        owner = self._owner(context)
        row = await self.database.connection.run(
            lambda tx: tx.fetchrow(_TASK + " WHERE t.id = ? AND t.owner = ?", (task_id, owner))
        )
        if row is None:
            return None
        task = whole_task(row["data"], row["history"])
        self._know(
            task_id, _Stored(owner, row["version"], len(row["history"]), last_id(task)), task
        )
        return StoredTask(task, TaskVersion(int(row["version"])))

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """Newest first (by the status timestamp, then id), paged by an opaque
        cursor; the first page in one statement, its count beside each row."""
        query = ListQuery(params, self._owner(context))
        # The filter names the subquery's columns (PostgreSQL pulls it up:
        # the conditions reach the indexes).
        page = (
            f"SELECT * FROM ({_TASK}) t WHERE {' AND '.join(query.page_where)} "
            "ORDER BY updated_ns DESC, id DESC LIMIT ?"
        )
        limit = query.page_size + 1

        async def read(tx: Tx) -> tuple[int, builtins.list[dict[str, Any]]]:
            if query.first_page:
                # The count over the same filter, computed before the LIMIT.
                counted = page.replace("SELECT *", "SELECT *, count(*) OVER () AS total", 1)
                rows = await tx.fetch(counted, [*query.page_args, limit])
                return (int(rows[0]["total"]) if rows else 0), rows
            where = " AND ".join(query.where)
            total = await tx.fetchrow(
                f"SELECT count(*) AS n FROM a2a_tasks WHERE {where}", query.args
            )
            rows = await tx.fetch(page, [*query.page_args, limit])
            return int(total["n"] if total else 0), rows

        total, rows = await self.database.connection.run(read)
        more = len(rows) > query.page_size
        rows = rows[: query.page_size]
        return ListTasksResponse(
            tasks=[whole_task(row["data"], row["history"]) for row in rows],
            next_page_token=page_token(rows[-1]["updated_ns"], rows[-1]["id"]) if more else "",
            total_size=total,
            page_size=query.page_size,
        )

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        """The task and its history (its events stay in the log, as the SDK's do)."""
        owner = self._owner(context)
        await self.database.connection.run(
            lambda tx: tx.execute(
                "WITH gone AS (DELETE FROM a2a_tasks WHERE id = ? AND owner = ? RETURNING id) "
                "DELETE FROM a2a_task_history WHERE task_id IN (SELECT id FROM gone)",
                (task_id, owner),
            )
        )
        self._forget(task_id)

    # -- across owners: the server's own questions --------------------------------------

    async def context_owners(self, context_id: str) -> set[str]:
        """The owners of the tasks in `context_id`, whoever asks."""
        rows = await self.database.fetch(
            "SELECT DISTINCT owner FROM a2a_tasks WHERE context_id = ?", (context_id,)
        )
        return {row["owner"] for row in rows}

    async def task_opened_by(
        self, context_id: str, message_id: str, context: ServerCallContext
    ) -> Task | None:
        """As `SQLiteTaskStore.task_opened_by`: the caller's newest task in
        `context_id` whose first history message is `message_id`, in one
        statement reading each task's first row."""
        owner = self._owner(context)
        needle = Message(message_id=message_id).SerializeToString()
        rows = await self.database.fetch(
            "SELECT t.id, h.data FROM a2a_tasks t JOIN a2a_task_history h "
            "ON h.task_id = t.id AND h.seq = 0 "
            "WHERE t.context_id = ? AND t.owner = ? AND position(?::bytea IN h.data) > 0 "
            "ORDER BY t.updated_ns DESC, t.id DESC",
            (context_id, owner, needle),
        )
        for row in rows:
            if Task.FromString(row["data"]).history[0].message_id == message_id:
                stored = await self.get(row["id"], context)
                return stored.task if stored is not None else None
        return None

    async def states(self, task_ids: Iterable[str]) -> dict[str, int]:
        """Each stored task's state (any owner's), in one statement."""
        wanted = sorted(set(task_ids))
        if not wanted:
            return {}
        rows = await self.database.fetch(
            "SELECT id, state FROM a2a_tasks WHERE id = ANY(?::text[])", (wanted,)
        )
        return {row["id"]: int(row["state"]) for row in rows}

    # -- what is known of stored histories ------------------------------------------------

    def _know(self, task_id: str, stored: _Stored, task: Task) -> None:
        current = self._stored.get(task_id)
        if current is not None and current.version > stored.version:
            return  # a later save's, recorded first
        if task.status.state in TERMINAL:
            self._stored.pop(task_id, None)
            return
        self._stored[task_id] = stored
        self._stored.move_to_end(task_id)
        while len(self._stored) > _REMEMBERED:
            self._stored.popitem(last=False)

    def _forget(self, task_id: str) -> None:
        self._stored.pop(task_id, None)
