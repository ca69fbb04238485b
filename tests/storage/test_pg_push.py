"""Replicas' push configs (`PgPushConfigStore`, `storage/tasks/push.py`) on a
real PostgreSQL (`tests/support/postgres.py`): a config registered on one
replica is delivered by another, scoped to its caller, within the limits,
and gone once deleted."""

from __future__ import annotations

import anyio
import pytest
from a2a.server.context import ServerCallContext
from a2a.types import InvalidParamsError, TaskPushNotificationConfig
from support.postgres import Postgres

from a2a_orchestrator.storage.tasks.postgres import PgTaskStore
from a2a_orchestrator.storage.tasks.push import (
    PgPushConfigStore,
    PushLimits,
    open_push_config_store,
)
from a2a_orchestrator.storage.tasks.sqlite import TaskOwner

pytestmark = pytest.mark.anyio

ALICE = ServerCallContext(user=TaskOwner("alice"))
BOB = ServerCallContext(user=TaskOwner("bob"))


def config(config_id: str, token: str = "t") -> TaskPushNotificationConfig:
    return TaskPushNotificationConfig(id=config_id, url="http://127.0.0.1:9/hook", token=token)


async def test_a_config_set_on_one_replica_is_delivered_by_another(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("pgpush"))
    tasks_a, tasks_b = PgTaskStore(url), PgTaskStore(url)
    limits = PushLimits(per_task=2, per_owner=3)
    a = open_push_config_store(tasks_a, limits)
    b = open_push_config_store(tasks_b, limits)
    try:
        with anyio.fail_after(30):
            await a.set_info("t1", config("c1"), ALICE)
            await a.set_info("t1", config("c1", token="again"), ALICE)  # replaces: counts once
            await b.set_info("t1", config("c2"), BOB)
            with pytest.raises(InvalidParamsError, match="per task"):
                await b.set_info("t1", config("c3"), BOB)
            await a.set_info("t2", config("c1"), ALICE)
            await a.set_info("t3", config("c1"), ALICE)
            with pytest.raises(InvalidParamsError, match="per caller"):
                await b.set_info("t4", config("c1"), ALICE)
            dispatched = await b.get_info_for_dispatch("t1")
            alices = await b.get_info("t1", ALICE)
            await b.delete_info("t1", ALICE, "c1")
            after = await a.get_info_for_dispatch("t1")
    finally:
        tasks_a.close()
        tasks_b.close()
    assert isinstance(a, PgPushConfigStore)
    assert [(c.id, c.token) for c in dispatched] == [("c1", "again"), ("c2", "t")]
    assert [c.id for c in alices] == ["c1"]
    assert [c.id for c in after] == ["c2"]


async def test_each_config_keeps_the_version_it_was_registered_in(postgres: Postgres) -> None:
    url = postgres.url(postgres.database("pgpushversions"))
    tasks_a, tasks_b = PgTaskStore(url), PgTaskStore(url)

    def version(context: ServerCallContext) -> str:
        # A v0.3 registration is Bob's here; which one is the server's to tell.
        return "0.3" if context is BOB else "1.0"

    a = open_push_config_store(tasks_a, protocol_of=version)
    b = open_push_config_store(tasks_b, protocol_of=version)
    try:
        with anyio.fail_after(30):
            await a.set_info("t1", config("c1"), ALICE)
            await a.set_info("t1", config("c2"), BOB)
            targets = await b.get_targets_for_dispatch("t1")
    finally:
        tasks_a.close()
        tasks_b.close()
    assert [(t.config.id, t.protocol, t.owner) for t in targets] == [
        ("c1", "1.0", "alice"),
        ("c2", "0.3", "bob"),
    ]
