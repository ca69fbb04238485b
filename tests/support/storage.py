"""SQLite files made to fail as SQLite itself fails a write."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def refuse_child(path: Path, child_id: str, when: str = "1") -> None:
    """A trigger, in the real file, that makes the event writes of
    `child_id` (those `when` selects) fail as SQLite itself fails a write."""
    conn = sqlite3.connect(path)
    conn.execute(
        f"""
        CREATE TRIGGER refuse_{child_id} BEFORE INSERT ON events
        WHEN NEW.child_id = '{child_id}' AND ({when})
        BEGIN SELECT RAISE(ABORT, 'child write refused'); END
        """
    )
    conn.commit()
    conn.close()
