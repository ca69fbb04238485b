"""`SQLiteTaskStore`: a2a-sdk's `TaskStore` on one SQLite file.

Why not the SDK's `DatabaseTaskStore` for a role server's own file: through
SQLAlchemy's async layer and aiosqlite, each save or get costs about 2 ms
here, and the SDK saves the task on every event, so a five-event turn spent
~40 ms in the store (bench/delegation.py). This store keeps each task as
protobuf bytes in rows (`rows`: the task without its history in one
row, each history message in a row of its own) and runs plain sqlite3: a
few hundred microseconds a call in a worker thread, and its writes and
indexed reads run on the event loop when the file is free
(`SQLiteFile.write`, `read`), saving the thread hop. Replicas on one
PostgreSQL use `PgTaskStore` (`postgres.py`), the same layout and save
logic (`rows`) versioned; another SQLAlchemy URL gets a2a-sdk's
`DatabaseTaskStore`.

Saves: a2a-sdk saves the whole task on every event, and the task grows by
its history (each status message is moved into it), so a save here writes
the task's head and only the history messages after those it already
stored or holds: a save costs what the event added, not the task's length
(bench/taskstore.py). A history that is not an extension of the one stored
(shorter, or another message at the last stored place, by message id) is
written whole. This store writes at once what a crash must not lose: a
new task, a change of state, a change of artifacts, and frames `write_now`
picks (a role server: a tool's result, since the call's journal row closes
once its result is out); other frames of a task in the same state (text
deltas, messages, tool calls, whose starts the journal keeps) are
coalesced: held in memory (the head and the new history rows), served by
`get`, and written with the next write, or `coalesce` seconds later, in one
transaction with every other held frame, in order. `list`,
`context_owners`, `task_opened_by` and `unfinished` write what is
held first.

The file has one writer, this store (a role server's own SQLite file;
replicas share a database through `PgTaskStore` instead), so it also
answers `get` from memory for the tasks still running or waiting here and
for ids it found absent, without a trip to a worker thread. What it keeps
of a live task is its head and history messages as bytes, so neither a
save nor a `get` serializes the whole task.

Tasks are scoped to their owner (the authenticated user) like the SDK's
stores: another owner's task is not found. Only the server itself looks
across owners: `context_owners` (which callers use a context id, so one
caller cannot continue a conversation in another's context) and
`unfinished` (start-up recovery).

"""

from __future__ import annotations

import asyncio
import builtins
import logging
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import OwnerResolver, resolve_user_scope
from a2a.server.tasks import DatabaseTaskStore, TaskStore
from a2a.types import (
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Task,
    TaskState,
)

from ..sqlitefile import SQLiteFile
from .observed import inside
from .rows import (
    TERMINAL,
    ListQuery,
    Rows,
    extends,
    last_id,
    open_schema,
    page_token,
    read_history,
    save_rows,
    whole_task,
    write_rows,
)

__all__ = [
    "Listing",
    "SQLiteTaskStore",
    "TaskOwner",
    "context_owners",
    "context_tasks",
    "task_opened_by",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)

_REMEMBERED = 4096
"""Live tasks, and ids found absent, answered from memory (most recent)."""


@dataclass
class _Known:
    """The latest saved version of a live task (maybe not written yet)."""

    owner: str
    head: bytes
    """The task without its history, serialized."""
    history: list[bytes]
    """Its history messages in order, each a `history` entry (`rows.entries`)."""
    last_id: str
    """The last history message's id: a save whose history has another
    message at that place does not extend this one."""
    written_state: int
    """The state on disk; a save in another state is written at once."""
    written_artifacts: bytes
    """The artifacts on disk (serialized); a save that changes them is written at once."""

    def update(self, head: bytes, rows: Rows, last_id: str) -> None:
        self.head = head
        del self.history[rows.start :]
        self.history.extend(rows.messages)
        self.last_id = last_id

    def task(self) -> Task:
        return whole_task(self.head, self.history)


def _artifacts(task: Task) -> bytes:
    return b"".join(artifact.SerializeToString() for artifact in task.artifacts)


def _with_history(conn: sqlite3.Connection, task_id: str, head: bytes) -> Task:
    return whole_task(head, read_history(conn, task_id))


class TaskOwner(User):
    """The owner a stored task is scoped to, as a caller: what the server
    acts as when it reads or writes a task on its own (start-up recovery, a
    replica adopting a turn), under the task stores' owner scoping."""

    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return bool(self._name)

    @property
    def user_name(self) -> str:
        return self._name


class SQLiteTaskStore(TaskStore):
    """A task store on one SQLite file (see the module docstring)."""

    def __init__(
        self,
        path: str | Path,
        owner_resolver: OwnerResolver = resolve_user_scope,
        *,
        coalesce: float = 0.0,
        write_now: Callable[[Task], bool] | None = None,
    ) -> None:
        """`coalesce`: seconds a coalesced frame may wait to be written (0:
        every save is written at once). `write_now`: frames to write at once
        though the task's state did not change."""
        self.path = Path(path)
        self._owner = owner_resolver
        self._file = SQLiteFile(path, "task store")
        self._db = self._file.conn
        open_schema(self._db)
        self._run = self._file.run
        self._coalesce = coalesce
        self._write_now = write_now
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._absent: OrderedDict[str, None] = OrderedDict()
        self._held: dict[str, builtins.list[Rows]] = {}
        """Task id -> its coalesced writes, not written yet, oldest first
        (one, unless a failed write was put back before a newer one)."""
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._writing: builtins.list[Rows] = []
        """Held rows a timer's flush is writing now (close writes them too)."""
        self._closed = False

    def close(self) -> None:
        """Write what is held, then close the file."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        # A flush under way may not reach the file before it closes: its rows
        # first (older), then what is held (newer); writing a row twice is
        # harmless (each write says what the history is from its start on).
        rows = [*self._writing, *self._take_held()]
        if rows:
            try:
                self._file.run_here(lambda: self._write(rows))
            except Exception:
                logger.exception("task store: could not write %d held task(s) on close", len(rows))
        self._file.close()

    def _write(self, rows: builtins.list[Rows]) -> int:
        """Write `rows` in one transaction, in order; the rows the last one changed."""
        with self._db:
            return write_rows(self._db, rows)

    def _take_held(self) -> builtins.list[Rows]:
        rows = [write for writes in self._held.values() for write in writes]
        self._held.clear()
        return rows

    def _hold(self, rows: Rows) -> None:
        """Hold `rows`, a later save than any held for its task."""
        held = self._held.setdefault(rows.task_id, [])
        if not held or not held[-1].absorb(rows):
            held.append(rows)

    def _put_back(self, rows: builtins.list[Rows]) -> None:
        """Hold again what a failed write took (older than what was held since)."""
        older: dict[str, builtins.list[Rows]] = {}
        for write in rows:
            older.setdefault(write.task_id, []).append(write)
        for task_id, writes in older.items():
            self._held[task_id] = [*writes, *self._held.get(task_id, [])]

    def _remember(self, task_id: str, known: _Known) -> None:
        self._absent.pop(task_id, None)
        self._known[task_id] = known
        self._known.move_to_end(task_id)
        while len(self._known) > _REMEMBERED:
            oldest = next(iter(self._known))
            if oldest in self._held:
                break  # written within `coalesce` seconds, then forgotten later
            del self._known[oldest]

    def _note_absent(self, task_id: str) -> None:
        self._absent[task_id] = None
        self._absent.move_to_end(task_id)
        while len(self._absent) > _REMEMBERED:
            self._absent.popitem(last=False)

    def _may_hold(self, task: Task, owner: str, state: int) -> bool:
        if self._coalesce <= 0 or state in TERMINAL or self._closed:
            return False
        known = self._known.get(task.id)
        if known is None or known.owner != owner or known.written_state != state:
            return False
        if (task.artifacts or known.written_artifacts) and _artifacts(
            task
        ) != known.written_artifacts:
            return False
        return self._write_now is None or not self._write_now(task)

    async def save(self, task: Task, context: ServerCallContext) -> None:
        owner = self._owner(context)
        state = int(task.status.state)
        known = self._known.get(task.id)
        # What this store holds of the task: its history is written from
        # there on (an append), or whole when it is not an extension of it.
        stored = (len(known.history), known.last_id) if known and known.owner == owner else None
        extended = stored is not None and extends(task, *stored)
        rows = save_rows(task, owner, stored)
        head, start = rows.row[5], rows.start
        last = last_id(task)
        if self._may_hold(task, owner, state):
            assert known is not None
            known.update(head, rows, last)
            self._known.move_to_end(task.id)
            self._hold(rows)
            self._schedule_flush()
            return
        # Written now, after every write held so far (one transaction).
        writes = [*self._take_held(), rows]
        try:
            # Whether the row is this owner's (another's is left unchanged).
            ours = await self._file.write(lambda conn: self._write(writes) == 1)
        except BaseException:
            self._put_back(writes[:-1])
            raise
        current = self._known.get(task.id)
        if not ours or state in TERMINAL:
            self._known.pop(task.id, None)
            self._absent.pop(task.id, None)
        elif current is not None and current is known and extended:
            current.update(head, rows, last)
            current.written_state = state
            current.written_artifacts = _artifacts(task)
            self._remember(task.id, current)
        elif start == 0:
            self._remember(
                task.id, _Known(owner, head, rows.messages, last, state, _artifacts(task))
            )
        else:
            # Saved meanwhile from a version this write did not start from
            # (concurrent saves of one task): read it again when asked.
            self._known.pop(task.id, None)

    def _schedule_flush(self) -> None:
        if self._timer is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._coalesce, self._start_flush)

    def _start_flush(self) -> None:
        self._timer = None
        flush = asyncio.ensure_future(self.flush())
        self._flushes.add(flush)
        flush.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        """Write the coalesced frames now (a failed write keeps them held)."""
        rows = self._take_held()
        if not rows or self._closed:
            return
        self._writing = rows
        try:
            await self._file.write(lambda conn: self._write(rows))
        except Exception:
            if self._closed:
                return  # close wrote them
            logger.exception("task store: could not write %d task(s); kept to retry", len(rows))
            self._put_back(rows)
            self._schedule_flush()
        finally:
            self._writing = []

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        owner = self._owner(context)
        known = self._known.get(task_id)
        if known is not None:
            return known.task() if known.owner == owner else None
        if task_id in self._absent:
            return None

        def read() -> tuple[bytes, str, int, builtins.list[bytes]] | None:
            found = self._db.execute(
                "SELECT data, owner, state FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if found is None:
                return None
            return (*found, read_history(self._db, task_id))

        found = await self._file.read(read)
        if task_id in self._known or task_id in self._absent:
            # Saved meanwhile: memory is newer than what was read.
            return await self.get(task_id, context)
        if found is None:
            self._note_absent(task_id)
            return None
        head, row_owner, state, messages = found
        task = whole_task(head, messages)
        if state not in TERMINAL:
            known = _Known(row_owner, head, messages, last_id(task), state, _artifacts(task))
            self._remember(task_id, known)
        return task if row_owner == owner else None

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        owner = self._owner(context)
        rows = self._take_held()

        def remove() -> None:
            self._write(rows)
            with self._db:
                deleted = self._db.execute(
                    "DELETE FROM tasks WHERE id = ? AND owner = ?", (task_id, owner)
                ).rowcount
                if deleted:
                    self._db.execute("DELETE FROM task_history WHERE task_id = ?", (task_id,))

        await self._run(remove)
        known = self._known.get(task_id)
        if known is not None and known.owner == owner:
            del self._known[task_id]
            self._note_absent(task_id)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """Newest first (by the status timestamp, then id), paged by an opaque cursor."""
        listing = ListQuery(params, self._owner(context))
        where, args = listing.where, listing.args
        page_where, page_args = listing.page_where, listing.page_args
        page_size = listing.page_size

        held = self._take_held()

        def query() -> tuple[int, list[Task], tuple[int, str] | None]:
            self._write(held)
            total = self._db.execute(
                f"SELECT COUNT(*) FROM tasks WHERE {' AND '.join(where)}", args
            ).fetchone()[0]
            rows = self._db.execute(
                f"SELECT data, updated_ns, id FROM tasks WHERE {' AND '.join(page_where)} "
                "ORDER BY updated_ns DESC, id DESC LIMIT ?",
                [*page_args, page_size + 1],
            ).fetchall()
            more = len(rows) > page_size
            rows = rows[:page_size]
            tasks = [_with_history(self._db, task_id, head) for head, _, task_id in rows]
            return int(total), tasks, (rows[-1][1], rows[-1][2]) if more else None

        # A listing by context reads by its index: on the loop when it can
        # (the executor lists a context's tasks at every turn's start).
        run = self._file.read if params.context_id and not held else self._run
        total, tasks, last = await run(query)
        return ListTasksResponse(
            tasks=tasks,
            next_page_token=page_token(*last) if last is not None else "",
            total_size=total,
            page_size=page_size,
        )

    async def context_owners(self, context_id: str) -> set[str]:
        """The owners of the tasks in `context_id`, whoever asks."""

        held = self._take_held()

        def query() -> builtins.list[tuple[str]]:
            self._write(held)
            return self._db.execute(
                "SELECT DISTINCT owner FROM tasks WHERE context_id = ?", (context_id,)
            ).fetchall()

        # By the context's index: on the loop when it can (every new message asks).
        run = self._file.read if not held else self._run
        return {owner for (owner,) in await run(query)}

    async def task_opened_by(
        self, context_id: str, message_id: str, context: ServerCallContext
    ) -> Task | None:
        """The caller's newest task in `context_id` that the message
        `message_id` opened (the first message of its history), or None.
        Reads each task's first history row alone, and parses only those
        that hold the id's bytes (a listing parses every task of the
        context whole, and a long conversation opens a task at each turn)."""
        owner = self._owner(context)
        # How a message with this id starts its encoding (the id is field 1,
        # written first): a row without these bytes cannot be it.
        needle = Message(message_id=message_id).SerializeToString()
        held = self._take_held()

        def query() -> str | None:
            self._write(held)
            rows = self._db.execute(
                "SELECT t.id, h.data FROM tasks t JOIN task_history h "
                "ON h.task_id = t.id AND h.seq = 0 "
                "WHERE t.context_id = ? AND t.owner = ? AND instr(h.data, ?) > 0 "
                "ORDER BY t.updated_ns DESC, t.id DESC",
                (context_id, owner, needle),
            )
            for task_id, entry in rows:
                if Task.FromString(entry).history[0].message_id == message_id:
                    return str(task_id)
            return None

        # By the context's index: on the loop when it can.
        run = self._file.read if not held else self._run
        task_id = await run(query)
        return None if task_id is None else await self.get(task_id, context)

    async def unfinished(self) -> builtins.list[tuple[Task, str]]:
        """Tasks still submitted or working, with their owners (start-up recovery)."""

        held = self._take_held()

        def query() -> builtins.list[tuple[Task, str]]:
            self._write(held)
            rows = self._db.execute(
                "SELECT id, data, owner FROM tasks WHERE state IN (?, ?)",
                (int(TaskState.TASK_STATE_SUBMITTED), int(TaskState.TASK_STATE_WORKING)),
            ).fetchall()
            return [
                (_with_history(self._db, task_id, head), owner) for task_id, head, owner in rows
            ]

        return await self._run(query)


class Listing(Protocol):
    """A store that lists tasks (a2a-sdk's `TaskStore`, its cluster's
    `VersionedTaskStore`)."""

    async def list(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse: ...


async def task_opened_by(
    store: Listing, context_id: str, message_id: str, context: ServerCallContext
) -> Task | None:
    """The caller's newest task in `context_id` that the message
    `message_id` opened (the first of its history: a repeat of that message
    finds it), or None: by `SQLiteTaskStore.task_opened_by` for our store,
    else by listing the context's tasks page by page."""
    from .postgres import PgTaskStore  # beside: postgres imports rows, not this module

    inner = inside(store)
    if isinstance(inner, (SQLiteTaskStore, PgTaskStore)):
        return await inner.task_opened_by(context_id, message_id, context)
    async for task in context_tasks(store, context_id, context):
        if task.history and task.history[0].message_id == message_id:
            return task
    return None


async def context_tasks(
    store: Listing, context_id: str, context: ServerCallContext
) -> AsyncIterator[Task]:
    """The caller's tasks in `context_id`, newest first, listed page by page."""
    token = ""
    while True:
        request = ListTasksRequest(context_id=context_id, page_token=token, page_size=100)
        listing = await store.list(request, context)
        for task in listing.tasks:
            yield task
        token = listing.next_page_token
        if not token:
            return


async def context_owners(store: object, context_id: str) -> set[str] | None:
    """The owners of the tasks in `context_id` (any owner's; empty: the
    context has no task), for the stores that can tell (ours, a2a-sdk's SQL
    store); None for other stores."""
    from .postgres import PgTaskStore

    store = inside(store)  # observed for quotas, metrics, the executor
    if isinstance(store, (SQLiteTaskStore, PgTaskStore)):
        return await store.context_owners(context_id)
    if isinstance(store, DatabaseTaskStore):
        from sqlalchemy import select

        model = store.task_model
        async with store.async_session_maker() as session:
            result = await session.execute(
                select(model.owner).where(model.context_id == context_id).distinct()
            )
            return {str(owner) for owner in result.scalars()}
    return None
