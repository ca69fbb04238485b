"""Which store a `--store` value names, opened: an SQLite file (the
embedded, zero-setup default) or a PostgreSQL database shared by
orchestrator replicas (`postgresql://...`). A module of its own so the
store's module never imports its PostgreSQL dialect (`store_pg.py`)."""

from __future__ import annotations

from pathlib import Path

from .store import Store

__all__ = ["is_store_url", "open_store"]


def is_store_url(location: str | Path) -> bool:
    """Whether a `--store` value names a database server (a PostgreSQL
    database shared by orchestrator replicas) rather than an SQLite file."""
    text = str(location)
    return "://" in text and text.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def open_store(location: str | Path) -> Store:
    """Open the store a `--store` value names: an SQLite file (the embedded,
    zero-setup default) or a PostgreSQL URL (`store_pg.PgStore`, imported only then)."""
    if is_store_url(location):
        from .store_pg import PgStore

        return PgStore(str(location))
    return Store(location)
