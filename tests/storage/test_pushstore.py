"""The SQLite push config store keeps each config's protocol version; a file
written before it did gets the column, its configs v1.0 (what they were sent)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from a2a.server.context import ServerCallContext
from a2a.types import TaskPushNotificationConfig

from a2a_orchestrator.storage.pushstore import SQLitePushConfigStore

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
