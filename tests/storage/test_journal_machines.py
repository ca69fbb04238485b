"""One recovery rule for every tool journal: a row is judged by the machine
it was written on (boot id and host). Another machine's row is never
signalled here, even when its process group's number and start time match a
live local process; only its owner, or the lease that replaced it, closes it.

Real parts: a real `sleep` in its own process group, the orchestrator's
SQLite store, the PostgreSQL store of orchestrator replicas and the role
replicas' shared journal on a real PostgreSQL (`tests/support/postgres.py`). The
other machine's rows are written by the journal's own `started` and
`process`, with the runner identity (`journal._RUNNER`) that machine would
have: no second machine is at hand, and that identity is all a row carries
of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest
from support.postgres import Postgres

from a2a_orchestrator.models.base import ToolCall
from a2a_orchestrator.storage import journal as journal_module
from a2a_orchestrator.storage.database.postgres import PgDatabase
from a2a_orchestrator.storage.journal import JournalRow, ToolJournal
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.storage.store_pg import PgStore
from a2a_orchestrator.tools.procs import start_ticks

pytestmark = pytest.mark.anyio

_, TICKS, BOOT, HOST = journal_module._runner()
ELSEWHERE = {
    # Another machine: another boot, another host.
    "another machine": ("0f0e0d0c-another-boot", "other-host"),
    # A container beside us: the kernel's boot id is shared, its pids are not.
    "a container on this kernel": (BOOT, "other-container"),
}


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A live local process leading its own group: the number and start time
    another machine's row happens to record."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextmanager
def written_as(boot: str, host: str) -> Iterator[None]:
    """Rows started inside name that machine; the runner's pid is ours (a
    pid means something only on the machine that wrote it)."""
    saved = journal_module._RUNNER
    journal_module._RUNNER = (os.getpid(), TICKS, boot, host)
    try:
        yield
    finally:
        journal_module._RUNNER = saved


async def plant(journal: ToolJournal, scope: str, process: subprocess.Popen[bytes]) -> list[str]:
    """One open `run_command` row per kind of elsewhere, each recording
    `process`'s group with its start time, as a group there could."""
    markers = []
    group_ticks = start_ticks(process.pid)
    assert group_ticks
    for call_id, (boot, host) in enumerate(ELSEWHERE.values()):
        call = ToolCall(id=f"c{call_id}", name="run_command", arguments={"command": "x"})
        with written_as(boot, host):
            marker = await journal.started(scope, call)
        await journal.process(marker, process.pid, group_ticks)
        markers.append(marker)
    return markers


async def recovered_nothing(
    journal: ToolJournal, scope: str, process: subprocess.Popen[bytes]
) -> list[JournalRow]:
    markers = await plant(journal, scope, process)
    rows = await journal.unfinished(scope)
    assert sorted(r.marker for r in rows) == sorted(markers)
    assert not any(row.written_here for row in rows)
    for recover in (journal.recover, lambda: journal.recover(scope)):
        assert await recover() == []
    assert process.poll() is None, "another machine's row signalled a process here"
    return await journal.unfinished(scope)


async def test_the_orchestrators_sqlite_journal_leaves_other_machines_rows(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    store = Store(tmp_path / "orchestrator.db")
    try:
        with anyio.fail_after(20):
            left = await recovered_nothing(store.journal, "child-1", bystander)
    finally:
        store.close()
    assert len(left) == len(ELSEWHERE)


async def test_the_postgresql_journal_leaves_other_machines_rows(
    postgres: Postgres, bystander: subprocess.Popen[bytes]
) -> None:
    store = PgStore(postgres.url(postgres.database("machines")))
    try:
        with anyio.fail_after(60):
            left = await recovered_nothing(store.journal, "child-1", bystander)
    finally:
        store.close()
    # Still open: the owner's to close (or the replica that adopts its session).
    assert len(left) == len(ELSEWHERE)


@asynccontextmanager
async def shared(postgres: Postgres) -> AsyncIterator[ToolJournal]:
    db = PgDatabase.open(postgres.url(postgres.database("shared")), "tool-call journal")
    journal = ToolJournal(db, shared=True)
    try:
        await journal.create()
        yield journal
    finally:
        journal.close()


async def test_the_lease_holder_closes_other_machines_rows_without_signalling(
    postgres: Postgres, bystander: subprocess.Popen[bytes]
) -> None:
    with anyio.fail_after(60):
        async with shared(postgres) as journal:
            markers = await plant(journal, "ctx-1", bystander)
            # A replica starting closes nobody's calls; the one that took the
            # conversation's lease closes them, and signals nothing here.
            assert await journal.recover() == []
            closed = await journal.recover("ctx-1")
            left = await journal.unfinished("ctx-1")
    assert sorted(row.marker for row in closed) == sorted(markers)
    assert left == []
    assert bystander.poll() is None


async def test_this_machines_dead_runner_still_has_its_group_ended(
    tmp_path: Path, bystander: subprocess.Popen[bytes]
) -> None:
    # The same row written here by a runner that is gone: its leftovers end.
    store = Store(tmp_path / "orchestrator.db")
    try:
        with anyio.fail_after(20):
            journal = store.journal
            call = ToolCall(id="c1", name="run_command", arguments={"command": "x"})
            with written_as(BOOT, HOST):
                marker = await journal.started("child-1", call)
            await journal.process(marker, bystander.pid, start_ticks(bystander.pid))
            # The recorded runner is this process itself, so it is not alive
            # as a runner (a pid reused by us): the row is a dead runner's.
            closed = await journal.recover("child-1")
            bystander.wait(timeout=10)
    finally:
        store.close()
    assert [row.marker for row in closed] == [marker]
    assert bystander.returncode == -signal.SIGKILL
