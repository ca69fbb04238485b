"""Role server replicas on one PostgreSQL database, behind a real HAProxy.

Three `a2a-orchestrator serve coder --db postgresql+asyncpg://...` processes
(a scripted model, the only fake) share a throwaway PostgreSQL
(`postgres.py`); HAProxy runs deploy/haproxy.cfg in front of them
(`support/replicas.py`). Tasks start through the balancer and are read,
streamed, continued and cancelled through other replicas directly; a replica
SIGKILLed mid-turn has its task adopted by another.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import anyio
import pytest
from a2a.types import CancelTaskRequest, SubscribeToTaskRequest
from support.deploy import needs_haproxy
from support.postgres import Postgres
from support.replicas import cluster, lease_of, ran, rpc, start_task, state_on, wait_for
from support.servers import a2a_client

from a2a_orchestrator.protocol.wire import EVENT_KEY

pytestmark = [pytest.mark.anyio, needs_haproxy]

WAIT_FOR_GO = "echo ran >> ran.log; while [ ! -e go ]; do sleep 0.05; done; echo went"
SCRIPT = [
    {
        "text": "Waiting.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": WAIT_FOR_GO}}],
    },
    {"text": "Went.\nTASK_DONE"},
    {"text": "Second turn, from the stored history.\nTASK_DONE"},
]


async def test_any_replica_reads_streams_continues_and_cancels_a_task(
    postgres: Postgres, tmp_path: Path
) -> None:
    with anyio.fail_after(90):
        async with cluster(postgres, tmp_path, SCRIPT) as c:
            # A task started through the balancer, running on some replica.
            first = await start_task(c.balancer, "wait for go")
            await wait_for(lambda: _true(ran(c.work) == 1))
            holder = await lease_of(c.database, first["contextId"])
            assert holder is not None
            runner = c.replica(holder)
            # Every replica reads it (GetTask, ListTasks), running.
            states = [await state_on(r.url, first["id"]) for r in c.replicas]
            listed = [
                [t["id"] for t in (await rpc(r.url, "ListTasks", {})).get("tasks", [])]
                for r in c.replicas
            ]
            # Cancelled through another replica: the turn stops where it runs.
            other = c.other_than(runner)
            async with a2a_client(other.url) as client:
                canceled = await client.cancel_task(CancelTaskRequest(id=first["id"]))
            await wait_for(lambda: _none(lease_of(c.database, first["contextId"])), timeout=15)
            after_cancel = await state_on(runner.url, first["id"])

            # A second task; another replica streams its live events.
            second = await start_task(c.balancer, "wait for go again")
            await wait_for(lambda: _true(ran(c.work) == 2))
            holder = await lease_of(c.database, second["contextId"])
            assert holder is not None
            runner = c.replica(holder)
            watcher = c.other_than(runner)
            kinds: list[str] = []
            final_state = ""
            async with a2a_client(watcher.url) as client:
                subscription = client.subscribe(SubscribeToTaskRequest(id=second["id"]))
                snapshot = await anext(subscription)
                # Only now does the command end: what follows is live.
                (c.work / "go").touch()
                async for response in subscription:
                    if response.HasField("status_update"):
                        status = response.status_update.status
                        kind = (
                            status.message.metadata[EVENT_KEY] if status.HasField("message") else ""
                        )
                        kinds.append(str(kind))
                        final_state = str(status.state)
                        if status.state in _ENDED:
                            break
                await subscription.aclose()  # type: ignore[attr-defined]
            await wait_for(lambda: _none(lease_of(c.database, second["contextId"])), timeout=15)

            # A new task in the same context, on a replica that did not run
            # the first turn: the conversation is rebuilt from the store (the
            # scripted model's third turn: it saw the two before).
            follow = c.other_than(runner)
            result = await rpc(
                follow.url,
                "SendMessage",
                {
                    "message": {
                        "messageId": uuid.uuid4().hex,
                        "role": "ROLE_USER",
                        "parts": [{"text": "and now?"}],
                        "contextId": second["contextId"],
                    }
                },
            )
    assert states == ["TASK_STATE_WORKING"] * 3
    assert all(first["id"] in ids for ids in listed)
    assert canceled.status.state == _state("TASK_STATE_CANCELED")
    assert after_cancel == "TASK_STATE_CANCELED"
    assert snapshot.task.id == second["id"]
    assert "tool_result" in kinds and kinds[-1] == "done", kinds
    assert final_state == str(_state("TASK_STATE_COMPLETED"))
    answer = result["task"]
    assert answer["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "Second turn, from the stored history." in str(answer)
    # The cancelled task's command never ran again, nor did the second's.
    assert ran(tmp_path / "work") == 2


async def test_a_killed_replicas_tasks_are_adopted_and_finish(
    postgres: Postgres, tmp_path: Path
) -> None:
    with anyio.fail_after(120):
        async with cluster(postgres, tmp_path, SCRIPT) as c:
            tasks = [await start_task(c.balancer, f"wait for go {i}") for i in range(3)]
            # Every task's command has started (and waits for `go`).
            await wait_for(lambda: _true(ran(c.work) == 3))
            holder = await lease_of(c.database, tasks[0]["contextId"])
            assert holder is not None
            victim = c.replica(holder)
            victims = [t for t in tasks if (await lease_of(c.database, t["contextId"])) == holder]
            victim.process.send_signal(signal.SIGKILL)
            await anyio.to_thread.run_sync(victim.process.wait)
            # The survivors' commands may end now; the victim's were interrupted.
            (c.work / "go").touch()
            survivor = c.other_than(victim)

            async def all_ended() -> bool:
                states = [await state_on(survivor.url, t["id"]) for t in tasks]
                return all(s in _ENDED_NAMES for s in states)

            await wait_for(all_ended, timeout=60)
            final = {t["id"]: await rpc(survivor.url, "GetTask", {"id": t["id"]}) for t in tasks}
            adopters = [await lease_of(c.database, t["contextId"]) for t in victims]
    assert {t["status"]["state"] for t in final.values()} == {"TASK_STATE_COMPLETED"}
    for task in victims:
        text = str(final[task["id"]])
        assert "Went." in text
    # Each started command ran once: the victim's were not re-run by their adopter.
    assert ran(tmp_path / "work") == 3
    # Their leases were taken over and given back.
    assert adopters == [None] * len(victims)


_ENDED_NAMES = {
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_REJECTED",
}


def _state(name: str) -> Any:
    from a2a.types import TaskState

    return TaskState.Value(name)


_ENDED = {_state(name) for name in _ENDED_NAMES}


async def _true(value: bool) -> bool:
    return value


async def _none(value: Awaitable[Any]) -> bool:
    return await value is None
