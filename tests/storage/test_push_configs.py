"""The SQLite push config store keeps each config's protocol version; a file
written before it did gets the column, its configs v1.0 (what they were
sent). The database store hands its configs out as v1.0."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from a2a.server.context import ServerCallContext
from a2a.server.tasks import DatabaseTaskStore
from a2a.types import TaskPushNotificationConfig
from sqlalchemy.ext.asyncio import create_async_engine

from a2a_orchestrator.storage.tasks.push import SQLitePushConfigStore, open_push_config_store
from a2a_orchestrator.storage.tasks.sqlite import TaskOwner

pytestmark = pytest.mark.anyio

# The table as files had it before configs kept their version.
OLD_SCHEMA = """
CREATE TABLE push_configs (
    task_id TEXT NOT NULL,
    config_id TEXT NOT NULL,
    owner TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (task_id, config_id, owner)
);
"""


def v0_3(context: ServerCallContext) -> str:
    return "0.3"


async def test_an_old_file_gets_the_version_column_and_its_configs_stay_v1_0(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tasks.db"
    old = TaskPushNotificationConfig(task_id="t", id="before", url="http://h/x")
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA)
        conn.execute(
            "INSERT INTO push_configs VALUES (?, ?, ?, ?)",
            ("t", "before", "", old.SerializeToString()),
        )
    conn.close()
    store = SQLitePushConfigStore(path, protocol_of=v0_3)
    try:
        await store.set_info(
            "t", TaskPushNotificationConfig(id="after", url="http://h/y"), ServerCallContext()
        )
        targets = await store.get_targets_for_dispatch("t")
    finally:
        store.close()
    assert [(t.config.id, t.config.url, t.protocol) for t in targets] == [
        ("after", "http://h/y", "0.3"),
        ("before", "http://h/x", "1.0"),
    ]
    reopened = SQLitePushConfigStore(path)
    try:
        again = await reopened.get_targets_for_dispatch("t")
    finally:
        reopened.close()
    assert [(t.config.id, t.protocol) for t in again] == [("after", "0.3"), ("before", "1.0")]


async def test_the_database_store_hands_out_its_configs_as_v1_0_with_their_owners(
    tmp_path: Path,
) -> None:
    # a2a-sdk's database store on SQLite through SQLAlchemy: the store replicas
    # use on PostgreSQL, which keeps no version (`tasks/push.py`).
    task_store = DatabaseTaskStore(
        create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'tasks.db'}"), create_table=True
    )
    store = open_push_config_store(task_store, protocol_of=v0_3)
    try:
        for owner in ("ann", "bob"):
            await store.set_info(
                "t",
                TaskPushNotificationConfig(id=owner, url=f"http://h/{owner}"),
                ServerCallContext(user=TaskOwner(owner)),
            )
        targets = await store.get_targets_for_dispatch("t")
    finally:
        await task_store.engine.dispose()
    assert sorted((t.config.url, t.owner, t.protocol) for t in targets) == [
        ("http://h/ann", "ann", "1.0"),
        ("http://h/bob", "bob", "1.0"),
    ]
