"""A follow-up sent to one role server replica while its task's turn runs on another.

Two `serve coder --db postgresql+asyncpg://...` processes (a scripted model,
the only fake) on a throwaway PostgreSQL (`postgres.py`). The first turn
runs on one replica (a command waiting for a file, then a question to the
caller: input required); the answer, sent to the other replica while that
turn still runs, waits for it, then runs there, on the stored history.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from support.postgres import Postgres
from support.replicas import role_replicas

pytestmark = pytest.mark.anyio

WAIT_FOR_GO = "echo ran >> ran.log; while [ ! -e go ]; do sleep 0.05; done; echo went"
SCRIPT = [
    {
        "text": "Waiting.",
        "tool_calls": [{"name": "run_command", "arguments": {"command": WAIT_FOR_GO}}],
    },
    {
        "text": "One question.",
        "tool_calls": [{"name": "ask_parent", "arguments": {"question": "Which colour?"}}],
    },
    {"text": "Painted it blue, as answered.\nTASK_DONE"},
]


async def send(url: str, message: dict[str, Any], *, at_once: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"message": message}
    if at_once:
        params["configuration"] = {"returnImmediately": True}
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params}
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(url + "/", json=body, headers={"A2A-Version": "1.0"})
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    return reply


def text(content: str, **ids: str) -> dict[str, Any]:
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": content}], **ids}


def ran(work: Path) -> int:
    log = work / "ran.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


async def test_a_follow_up_waits_for_the_turn_running_on_another_replica(
    postgres: Postgres, tmp_path: Path
) -> None:
    database = postgres.database("follow")
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    db_url = postgres.url(database, "postgresql+asyncpg")
    answers: list[dict[str, Any]] = []
    with (
        anyio.fail_after(55),
        role_replicas(["coder-1", "coder-2"], db_url, work, script, lease=3) as (one, two),
    ):
        first = (await send(one.url, text("paint the shed"), at_once=True))["result"]["task"]
        while ran(work) < 1:  # the first turn runs on replica one
            await anyio.sleep(0.1)
        answer = text("blue", taskId=first["id"], contextId=first["contextId"])

        async def follow_up() -> None:
            answers.append(await send(two.url, answer))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow_up)
            await anyio.sleep(1.5)
            waiting = not answers  # still waiting for the first turn
            (work / "go").touch()
        request = {"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": first["id"]}}
        async with httpx.AsyncClient(timeout=30) as http:
            got = await http.post(one.url + "/", json=request, headers={"A2A-Version": "1.0"})
        final = got.json()["result"]
    assert waiting, answers
    (reply,) = answers
    assert "result" in reply, reply
    assert reply["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    # Both turns in one task, in order: the question, the answer, the work on it.
    assert final["status"]["state"] == "TASK_STATE_COMPLETED"
    assert "Painted it blue" in json.dumps(final["status"]["message"])
    history = [json.dumps(message["parts"]) for message in final["history"]]
    question = next(i for i, parts in enumerate(history) if "Which colour?" in parts)
    answered = history.index(json.dumps([{"text": "blue"}]))
    assert question < answered
    # The first turn's command ran once.
    assert ran(work) == 1
