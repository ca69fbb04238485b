"""How `SQLiteTaskStore` lays a task out in its SQLite file.

A task is one `tasks` row, whose `data` is the task without its history
(its *head*: id, context, status, artifacts, metadata, serialized), and one
`task_history` row per history message, numbered from 0 in order, whose
`data` is the message as an entry of the task's `history` field (the
field's key, the message's length, the message): the head followed by the
rows in order is the whole task's encoding, so a reader rebuilds the task
with one parse, `Task.FromString(head + b"".join(rows))`. A2A tasks
grow by their history (a2a-sdk moves each status message into it), and the
SDK saves the whole task after every frame: with the history in rows of its
own a save writes the head and the messages added since the last save, so
it costs what the frame added, not what the task holds.

A write is a `Rows`: the head row, and "the history from `start` on is
`messages`" (the rows from `start` on are replaced by them). Applied in
order, such writes leave the history the last one says: an append starts
at the count already stored, a history that changed in any other way is
written whole, from 0 (`save_rows`: the one save logic of both task
stores, SQLite's and PostgreSQL's). `ListQuery` is their one listing's filter.

Files written before the history had rows of its own (the whole task in
`data`) are migrated when the store opens them, in one transaction.
"""

from __future__ import annotations

import base64
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from a2a.types import InvalidParamsError, ListTasksRequest, Task, TaskState
from a2a.utils.constants import DEFAULT_LIST_TASKS_PAGE_SIZE

__all__ = [
    "HEAD_FIELDS",
    "TERMINAL",
    "ListQuery",
    "Rows",
    "TaskRow",
    "entries",
    "extends",
    "head_of",
    "last_id",
    "open_schema",
    "page_token",
    "read_history",
    "save_rows",
    "updated_ns",
    "whole_task",
    "write_rows",
]

TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)

TaskRow = tuple[str, str, str, int, int, bytes]
"""(id, owner, context_id, state, updated_ns, head): one task's `tasks` row."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS tasks (
        id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        context_id TEXT NOT NULL,
        state INTEGER NOT NULL,
        updated_ns INTEGER NOT NULL,
        data BLOB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS tasks_owner_updated ON tasks (owner, updated_ns DESC, id DESC)",
    # A context's reads at a new task in a known context (the handler's
    # owners and repeat checks, the executor's listing of earlier tasks) use
    # this one: with an index on the context alone, SQLite (no statistics)
    # chose the owner's index for the ORDER BY and read every task of the
    # owner, a cost that grew with the file.
    "CREATE INDEX IF NOT EXISTS tasks_context_updated "
    "ON tasks (context_id, updated_ns DESC, id DESC)",
    "DROP INDEX IF EXISTS tasks_context",
    # Not WITHOUT ROWID: a message (a tool's output) can be many kilobytes,
    # and such rows are better kept out of the primary key's b-tree.
    """CREATE TABLE IF NOT EXISTS task_history (
        task_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (task_id, seq)
    )""",
)

_UPSERT = (
    "INSERT INTO tasks (id, owner, context_id, state, updated_ns, data) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "context_id = excluded.context_id, state = excluded.state, "
    "updated_ns = excluded.updated_ns, data = excluded.data "
    "WHERE tasks.owner = excluded.owner"
)

HEAD_FIELDS = frozenset({"id", "context_id", "status", "artifacts", "metadata"})
"""Every field of `Task` but its history (a test checks the SDK has no other)."""

_HISTORY_TAG = bytes([Task.DESCRIPTOR.fields_by_name["history"].number << 3 | 2])
"""The key of one `history` entry on the wire (field 5, length-delimited)."""


@dataclass
class Rows:
    """One save of one task: its `tasks` row, and the history from `start` on."""

    row: TaskRow
    start: int
    messages: list[bytes]
    """The history messages from `start` on, each a `history` entry (`entries`)."""

    @property
    def task_id(self) -> str:
        return self.row[0]

    @property
    def end(self) -> int:
        """The history's length after this write."""
        return self.start + len(self.messages)

    def absorb(self, newer: Rows) -> bool:
        """Take `newer` (a later save of the same task) into this write, when
        it continues it (starts within it); False when it does not."""
        keep = newer.start - self.start
        if keep < 0 or keep > len(self.messages):
            return False
        del self.messages[keep:]
        self.messages.extend(newer.messages)
        self.row = newer.row
        return True


def head_of(task: Task) -> bytes:
    """`task` without its history, serialized: built from the other fields,
    not by copying the whole task to clear its history."""
    head = Task(id=task.id, context_id=task.context_id, artifacts=task.artifacts)
    if task.HasField("status"):
        head.status.CopyFrom(task.status)
    if task.HasField("metadata"):
        head.metadata.CopyFrom(task.metadata)
    return head.SerializeToString()


def entries(task: Task, start: int = 0) -> list[bytes]:
    """`task`'s history messages from `start` on, each serialized as an
    entry of the `history` field (protobuf fields may come in any order,
    and a repeated field's entries are appended: the head and the entries
    in order make the whole task)."""
    history = task.history
    out = []
    for index in range(start, len(history)):
        message = history[index].SerializeToString()
        out.append(_HISTORY_TAG + _varint(len(message)) + message)
    return out


def extends(task: Task, count: int, last: str) -> bool:
    """Whether `task`'s history is a stored one of `count` messages, the
    last with id `last`, with messages added after it."""
    if len(task.history) < count:
        return False
    return count == 0 or task.history[count - 1].message_id == last


def save_rows(task: Task, owner: str, stored: tuple[int, str] | None) -> Rows:
    """The write of a save of `task` by `owner`, given what the store knows
    is stored of its history (`stored`: the count of messages and the last
    one's id; None: not known): the head, and the history from where it
    extends the stored one (an append), else whole."""
    start = stored[0] if stored is not None and extends(task, *stored) else 0
    return Rows(
        (task.id, owner, task.context_id, int(task.status.state), updated_ns(task), head_of(task)),
        start,
        entries(task, start),
    )


def last_id(task: Task) -> str:
    return task.history[len(task.history) - 1].message_id if task.history else ""


def updated_ns(task: Task) -> int:
    if task.status.HasField("timestamp"):
        return int(task.status.timestamp.ToNanoseconds())
    return time.time_ns()


def page_token(updated_ns: int, task_id: str) -> str:
    """The opaque cursor of a listing's next page: after this task."""
    return base64.urlsafe_b64encode(f"{updated_ns}:{task_id}".encode()).decode()


def _page_after(token: str) -> tuple[int, str]:
    try:
        updated, _, task_id = base64.urlsafe_b64decode(token.encode()).decode().partition(":")
        return int(updated), task_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidParamsError(message=f"Invalid page token: {token}") from exc


class ListQuery:
    """A `ListTasks` request as SQL on `tasks` (newest first: by the status
    timestamp, then id): `where`/`args` select the tasks counted,
    `page_where`/`page_args` the page's (after the cursor)."""

    def __init__(self, params: ListTasksRequest, owner: str) -> None:
        self.where = ["owner = ?"]
        self.args: list[Any] = [owner]
        if params.context_id:
            self.where.append("context_id = ?")
            self.args.append(params.context_id)
        if params.status != TaskState.TASK_STATE_UNSPECIFIED:
            self.where.append("state = ?")
            self.args.append(int(params.status))
        if params.HasField("status_timestamp_after"):
            self.where.append("updated_ns >= ?")
            self.args.append(params.status_timestamp_after.ToNanoseconds())
        self.page_where = list(self.where)
        self.page_args = list(self.args)
        self.first_page = not params.page_token
        if params.page_token:
            updated, task_id = _page_after(params.page_token)
            self.page_where.append("(updated_ns < ? OR (updated_ns = ? AND id < ?))")
            self.page_args.extend([updated, updated, task_id])
        self.page_size = params.page_size or DEFAULT_LIST_TASKS_PAGE_SIZE


def whole_task(head: bytes, history: Iterable[bytes]) -> Task:
    """The task from its head and its history entries, in one parse."""
    return Task.FromString(head + b"".join(history))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_rows(conn: sqlite3.Connection, rows: Iterable[Rows]) -> int:
    """Write `rows` in order (the caller holds the transaction); the rows
    the last `tasks` upsert changed (0: the task is another owner's, and
    neither its row nor its history was touched)."""
    changed = 0
    for rows_ in rows:
        changed = conn.execute(_UPSERT, rows_.row).rowcount
        if not changed:
            continue
        task_id = rows_.task_id
        # Nothing to delete for an append (one index probe); a history
        # written whole, or one that became shorter, loses its old rows.
        conn.execute(
            "DELETE FROM task_history WHERE task_id = ? AND seq >= ?", (task_id, rows_.start)
        )
        conn.executemany(
            "INSERT INTO task_history (task_id, seq, data) VALUES (?, ?, ?)",
            [(task_id, seq, data) for seq, data in enumerate(rows_.messages, rows_.start)],
        )
    return changed


def read_history(conn: sqlite3.Connection, task_id: str) -> list[bytes]:
    """A stored task's history entries, in order."""
    return [
        data
        for (data,) in conn.execute(
            "SELECT data FROM task_history WHERE task_id = ? ORDER BY seq", (task_id,)
        )
    ]


def open_schema(conn: sqlite3.Connection) -> None:
    """Create the tables, or migrate a file of the whole-task layout (a
    `tasks` table and no `task_history`): in one transaction, so a file is
    in one layout or the other, never half of each."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        tables = {
            name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        for statement in _SCHEMA:
            conn.execute(statement)
        if "tasks" in tables and "task_history" not in tables:
            _migrate(conn)
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def _migrate(conn: sqlite3.Connection) -> None:
    """Move each task's embedded history into its rows, leaving the head."""
    ids = [task_id for (task_id,) in conn.execute("SELECT id FROM tasks")]
    for task_id in ids:
        (data,) = conn.execute("SELECT data FROM tasks WHERE id = ?", (task_id,)).fetchone()
        task = Task.FromString(data)
        if not task.history:
            continue
        conn.executemany(
            "INSERT INTO task_history (task_id, seq, data) VALUES (?, ?, ?)",
            [(task_id, seq, entry) for seq, entry in enumerate(entries(task))],
        )
        conn.execute("UPDATE tasks SET data = ? WHERE id = ?", (head_of(task), task_id))
