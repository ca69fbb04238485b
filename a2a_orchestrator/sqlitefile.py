"""`SQLiteFile`: one sqlite3 connection used from worker threads, safely.

Both of our SQLite stores (the orchestrator's `Store`, a role server's
`SQLiteTaskStore`) keep one connection per file and run every call in a
worker thread (`anyio.to_thread`) under a lock: the event loop never blocks
on disk, and calls from many tasks serialise. WAL lets readers (the CLI) see
a file while a server writes it; synchronous=NORMAL under WAL is durable
against a crash of the process (kill -9), the failure these files exist for.
A sqlite3 error raised by a call is raised as `StoreError` (its cause kept),
so callers catch one of this package's errors, naming the file.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio

from .errors import ConfigError, StoreError

__all__ = ["SQLiteFile"]

T = TypeVar("T")


class SQLiteFile:
    """An open SQLite file (see the module docstring); `what` names it in errors."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open {what} {self.path}: {exc}") from exc
        self._lock = threading.Lock()
        self._closed = False

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` in a worker thread, alone on the connection."""

        def locked() -> T:
            with self._lock:
                if self._closed:
                    raise ConfigError(f"{self.what} {self.path} is closed")
                try:
                    return fn()
                except sqlite3.Error as exc:
                    raise StoreError(f"{self.what} {self.path}: {exc}") from exc

        return await anyio.to_thread.run_sync(locked)

    def run_here(self, fn: Callable[[], T]) -> T:
        """Run `fn` on this thread, alone on the connection (for a last write
        on close, where there is no event loop to wait on)."""
        with self._lock:
            if self._closed:
                raise ConfigError(f"{self.what} {self.path} is closed")
            return fn()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self.conn.close()
