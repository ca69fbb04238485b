"""Live events and control across role server replicas, by `LISTEN/NOTIFY`
(`storage/tasks/notified.py`, `storage/controls.py`): three `serve coder`
replicas on a real PostgreSQL behind HAProxy (`support/replicas.py`; the
scripted model is the only fake).

The replicas' fallback polling is made an hour long
(`$A2A_EVENT_POLL_SECONDS`), so a subscriber on a replica that does not run
the turn hears its live events only by notification; control messages are
sent to a replica that does not run the turn, and must reach the one that
does.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from a2a.types import SubscribeToTaskRequest, TaskState
from support.deploy import needs_haproxy
from support.postgres import Postgres
from support.replicas import Cluster, cluster, lease_of, ran, rpc, start_task, state_on, wait_for
from support.servers import a2a_client

from a2a_orchestrator.protocol.wire import CONTROL_KEY, EVENT_KEY, PAUSE_ON_KEY
from a2a_orchestrator.runtime.render import INTERRUPTED_TEXT

pytestmark = [pytest.mark.anyio, needs_haproxy]

NO_POLLING = {"A2A_EVENT_POLL_SECONDS": "3600"}
WAIT_FOR_GO = "echo ran >> ran.log; while [ ! -e go ]; do sleep 0.05; done; touch went"
STEP_TWO = "date +%s.%N >> stepped.log"
SCRIPT = [
    {
        "text": "Waiting.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": WAIT_FOR_GO}}],
    },
    {
        "text": "Second step.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": STEP_TWO}}],
    },
    {"text": "Went.\nTASK_DONE"},
]
ENDED = {
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_REJECTED",
}


async def control(
    url: str, task: dict[str, Any], action: str, text: str = "", **metadata: Any
) -> dict[str, Any]:
    """Send a control message for `task` to the replica at `url`; its answer."""
    message = {
        "messageId": uuid.uuid4().hex,
        "role": "ROLE_USER",
        "parts": [{"text": text}],
        "taskId": task["id"],
        "contextId": task["contextId"],
        "metadata": {CONTROL_KEY: action, **metadata},
    }
    result: dict[str, Any] = await rpc(url, "SendMessage", {"message": message})
    return result


async def running(c: Cluster, task: dict[str, Any]) -> tuple[str, str]:
    """The URLs of the replica running `task`'s turn and of another one."""
    holder = await lease_of(c.database, task["contextId"])
    assert holder is not None
    runner = c.replica(holder)
    return runner.url, c.other_than(runner).url


async def test_a_subscriber_on_another_replica_gets_live_events_by_notify(
    postgres: Postgres, tmp_path: Path
) -> None:
    with anyio.fail_after(55):
        async with cluster(postgres, tmp_path, SCRIPT, NO_POLLING) as c:
            task = await start_task(c.balancer, "wait for go")
            await wait_for(lambda: _true(ran(c.work) == 1))
            _runner, watcher = await running(c, task)
            kinds: list[str] = []
            final = TaskState.TASK_STATE_UNSPECIFIED
            async with a2a_client(watcher) as client:
                subscription = client.subscribe(SubscribeToTaskRequest(id=task["id"]))
                snapshot = await anext(subscription)
                # The subscription's first read of the log is done by then;
                # polling is an hour long: what follows comes by notify.
                await anyio.sleep(1.0)
                (c.work / "go").touch()
                async for response in subscription:
                    if response.HasField("status_update"):
                        status = response.status_update.status
                        if status.HasField("message"):
                            kinds.append(str(status.message.metadata[EVENT_KEY]))
                        final = status.state
                        if str(TaskState.Name(status.state)) in ENDED:
                            break
                await subscription.aclose()  # type: ignore[attr-defined]
    assert snapshot.task.id == task["id"]
    assert kinds.count("tool_result") == 2 and kinds[-1] == "done", kinds
    assert final == TaskState.TASK_STATE_COMPLETED


async def test_control_sent_to_another_replica_reaches_the_turn(
    postgres: Postgres, tmp_path: Path
) -> None:
    with anyio.fail_after(55):
        async with cluster(postgres, tmp_path, SCRIPT, NO_POLLING) as c:
            task = await start_task(c.balancer, "wait for go")
            await wait_for(lambda: _true(ran(c.work) == 1))
            runner, other = await running(c, task)
            # Sent to a replica that does not run the turn: each is applied
            # by the one that does, and answered with the task.
            paused = await control(other, task, "pause")
            rules = await control(
                other, task, "pause_on", **{PAUSE_ON_KEY: {"never": {"tool": "no_such_tool"}}}
            )
            # Answered (not refused) only if the running turn took it.
            steered = await control(other, task, "steer", "also say hello")
            # The command ends; the turn reaches its next step boundary, held there.
            (c.work / "go").touch()
            await wait_for(lambda: _true((c.work / "went").exists()))
            await anyio.sleep(1.0)  # time a turn not held would take its next step in
            held_state = await state_on(runner, task["id"])
            resumed_at = time.time()
            resumed = await control(other, task, "resume")
            await wait_for(lambda: _ended(runner, task["id"]), timeout=30)
            final = await rpc(runner, "GetTask", {"id": task["id"], "historyLength": 100})

            # Interrupt, relayed: a second task's turn stops.
            (c.work / "go").unlink()
            second = await start_task(c.balancer, "wait again")
            await wait_for(lambda: _true(ran(c.work) == 2))
            _runner, elsewhere = await running(c, second)
            interrupted = await control(elsewhere, second, "interrupt")
            await wait_for(lambda: _ended(c.balancer, second["id"]), timeout=30)
            stopped = await rpc(c.balancer, "GetTask", {"id": second["id"]})
    for answer in (paused, rules, steered, resumed, interrupted):
        assert "task" in answer, answer
    assert held_state == "TASK_STATE_WORKING"
    # The second step ran only once resumed: the pause held the turn.
    (stepped,) = (c.work / "stepped.log").read_text().split()
    assert float(stepped) > resumed_at
    assert final["status"]["state"] == "TASK_STATE_COMPLETED"
    assert stopped["status"]["state"] in ENDED - {"TASK_STATE_COMPLETED"}
    assert INTERRUPTED_TEXT in str(stopped)


async def _ended(url: str, task_id: str) -> bool:
    return await state_on(url, task_id) in ENDED


async def _true(value: bool) -> bool:
    return value
