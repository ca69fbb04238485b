"""A real PostgreSQL server for the tests that need one (replicas sharing a
database), started from Debian's `postgresql` binaries in a throwaway
directory and stopped after the test session.

The server runs as the `postgres` system user when the tests run as root
(CI): PostgreSQL refuses to run as root. It listens on 127.0.0.1 on a free
port with trust authentication; each test gets its own database from
`Postgres.database()`. Without the binaries the tests using the fixture skip,
naming the package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.ports import free_port

__all__ = ["Postgres", "Unavailable", "pg_bin", "postgres", "running_postgres"]

USER = "a2a"


def pg_bin() -> Path | None:
    """The newest PostgreSQL server's bin directory, or None."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda path: int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    bin: Path

    def url(self, database: str, driver: str = "postgresql") -> str:
        """A SQLAlchemy-style URL (`driver`: e.g. `postgresql+asyncpg`)."""
        return f"{driver}://{USER}@{self.host}:{self.port}/{database}"

    def database(self, prefix: str = "t") -> str:
        """A new, empty database; its name."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        subprocess.run(
            [str(self.bin / "createdb"), "-h", self.host, "-p", str(self.port), "-U", USER, name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        return name


class Unavailable(Exception):
    """This machine cannot run a throwaway PostgreSQL (the reason says why)."""


def _as_postgres(command: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return command
    runuser = shutil.which("runuser")
    if runuser is None:
        raise Unavailable("PostgreSQL cannot run as root and runuser (util-linux) is missing")
    return [runuser, "-u", "postgres", "--", *command]


@contextmanager
def running_postgres(options: str = "") -> Iterator[Postgres]:
    """A throwaway PostgreSQL server until the block exits; `Unavailable`
    when this machine cannot run one (the fixture skips, a bench stops).
    `options`: more server options (`-c name=value ...`)."""
    bin_dir = pg_bin()
    if bin_dir is None:
        raise Unavailable("needs a PostgreSQL server (Debian package postgresql)")
    # Not under pytest's tmp dir: that is private to root, and the server
    # runs as the postgres user when the tests run as root.
    base = Path(tempfile.mkdtemp(prefix="a2a-pg-"))
    base.chmod(0o755)
    data = base / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    try:
        subprocess.run(
            _as_postgres(
                [str(bin_dir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust", "-E", "UTF8"]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        port = free_port()
        options = (
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c max_connections=300"
            # A throwaway server: durability across a power cut is not tested.
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            f" {options}"
        )
        start = [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(data / "log")]
        subprocess.run(
            _as_postgres([*start, "-w", "start"]),
            check=True,
            capture_output=True,
            timeout=120,
        )
        try:
            yield Postgres(host="127.0.0.1", port=port, bin=bin_dir)
        finally:
            subprocess.run(
                _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
                capture_output=True,
                timeout=60,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    try:
        with running_postgres() as server:
            yield server
    except Unavailable as exc:
        pytest.skip(str(exc))
