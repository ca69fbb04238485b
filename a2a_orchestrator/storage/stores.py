"""Which store a `--store` value names: an SQLite file (the embedded,
zero-setup default) or a PostgreSQL database shared by orchestrator replicas
(`postgresql://...`, `store_pg.py`)."""

from __future__ import annotations

from pathlib import Path

from .store import Store

__all__ = ["is_store_url", "open_store"]


def is_store_url(location: str | Path) -> bool:
    """Whether `location` names a database server rather than a file."""
    text = str(location)
    return "://" in text and text.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def open_store(location: str | Path) -> Store:
    """Open the store at `location` (a file path or a PostgreSQL URL)."""
    if is_store_url(location):
        from .store_pg import PgStore

        return PgStore(str(location))
    return Store(location)
