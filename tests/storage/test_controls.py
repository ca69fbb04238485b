"""The control relay between replicas (`storage/controls.py`) on a real
PostgreSQL (`tests/support/postgres.py`): a message sent to a replica is
applied there once and its outcome answered; one nobody takes is withdrawn,
answered False, and never applied later."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import asyncpg
import pytest
from support.postgres import Postgres

from a2a_orchestrator.storage.controls import ControlMessage, ControlRelay
from a2a_orchestrator.storage.database.postgres import PgConnection
from a2a_orchestrator.storage.notify import Notifier

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def relay(
    url: str, replica: str, apply: Callable[[ControlMessage], bool], wait: float = 2.0
) -> AsyncIterator[ControlRelay]:
    async with AsyncExitStack() as stack:
        notifier = Notifier(url)
        made = ControlRelay(PgConnection(url, "control relay"), notifier, replica, apply, wait=wait)
        stack.callback(made.connection.close)
        await stack.enter_async_context(notifier.running())
        await stack.enter_async_context(made.running())
        while not notifier.up:
            await anyio.sleep(0.01)
        yield made


async def test_a_message_is_applied_by_its_replica_and_answered(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("controls"))
    taken: list[ControlMessage] = []

    def apply(message: ControlMessage) -> bool:
        taken.append(message)
        return message.action != "steer"  # a steer past the turn's last step

    with anyio.fail_after(30):
        async with relay(url, "A", lambda _m: False) as a, relay(url, "B", apply):
            paused = await a.send("B", "t1", "pause_on", "", {"r": {"tool": "x"}})
            steered = await a.send("B", "t1", "steer", "a long text " * 1000, {})
            conn = await asyncpg.connect(url)
            try:
                left = await conn.fetchval("SELECT count(*) FROM a2a_control")
            finally:
                await conn.close()
    assert (paused, steered) == (True, False)
    assert [(m.task_id, m.action, m.rules) for m in taken] == [
        ("t1", "pause_on", {"r": {"tool": "x"}}),
        ("t1", "steer", {}),
    ]
    assert taken[1].text == "a long text " * 1000
    assert left == 0


async def test_a_message_nobody_takes_is_withdrawn(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("controls"))
    taken: list[ControlMessage] = []
    with anyio.fail_after(30):
        async with relay(url, "A", lambda _m: False, wait=0.5) as a:
            answered = await a.send("B", "t1", "pause", "", {})
        # B starts later: the withdrawn message is not applied.
        async with relay(url, "B", lambda m: taken.append(m) is None):
            await anyio.sleep(0.5)
    assert answered is False
    assert taken == []


async def test_a_message_sent_while_its_replica_was_away_is_taken_when_it_listens(
    postgres: Postgres,
) -> None:
    url = postgres.url(postgres.database("controls"))
    taken: list[ControlMessage] = []
    answers: list[bool] = []
    with anyio.fail_after(30):
        async with relay(url, "A", lambda _m: False, wait=15) as a:
            async with anyio.create_task_group() as tg:

                async def send() -> None:
                    answers.append(await a.send("B", "t1", "resume", "", {}))

                tg.start_soon(send)
                conn = await asyncpg.connect(url)
                try:
                    while not await conn.fetchval("SELECT count(*) FROM a2a_control"):
                        await anyio.sleep(0.01)
                finally:
                    await conn.close()
                # Stored and notified before B listened: B takes it on starting.
                async with relay(url, "B", lambda m: taken.append(m) is None):
                    while not answers:
                        await anyio.sleep(0.01)
    assert answers == [True]
    assert [m.action for m in taken] == ["resume"]
