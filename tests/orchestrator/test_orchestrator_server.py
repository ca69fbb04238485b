"""The orchestrator as an A2A server: a stock client calls the whole network as one agent."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.types import TaskState
from support.messages import collect, user_message
from support.servers import a2a_client, network_up

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.orchestrator.app import MODE_KEY
from a2a_orchestrator.orchestrator.demo import prepare_workdir
from a2a_orchestrator.protocol.wire import EVENT_KEY
from a2a_orchestrator.runtime.events import Done
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio


async def test_a_stock_client_runs_the_pipeline_through_the_orchestrator(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path / "project")
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            url = await network_up(stack, workdir)
            async with a2a_client(url) as client:
                card = client  # the client was built from the orchestrator's card
                responses, events = await collect(client, user_message("Add slugify to textkit"))
            context_id = responses[-1].status_update.context_id
            async with httpx.AsyncClient(base_url=url) as http:
                children = (await http.get(f"/api/sessions/{context_id}/children")).json()
                card_json = (await http.get("/.well-known/agent-card.json")).json()
    assert card is not None
    assert responses[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    done = events[-1]
    assert isinstance(done, Done) and done.text.startswith("TASK_DONE")
    progress = [
        r.status_update.status.message
        for r in responses
        if r.HasField("status_update")
        and r.status_update.status.message.metadata.fields.get(EVENT_KEY, None) is not None
        and r.status_update.status.message.metadata[EVENT_KEY] == "child_event"
    ]
    roles_seen = {m.parts[1].data.struct_value.fields["role"].string_value for m in progress}
    assert roles_seen == {"architect", "coder", "reviewer"}
    assert [c["role"] for c in children["children"]] == ["architect", "coder", "reviewer"]
    assert {c["status"] for c in children["children"]} == {"completed"}
    assert {s["id"] for s in card_json["skills"]} == {"pipeline", "delegate"}
    assert (workdir / "textkit" / "slug.py").exists()


def parent_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        task = {"role": "architect", "prompt": "Design slugify for textkit"}
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": [task]}}]}
    if steps == 1:
        return {"tool_calls": [{"name": "agent_manage", "arguments": {}}]}
    final = [m for m in messages if m["role"] == "user" and "FINAL_ANSWER" in m["content"]]
    return {"text": f"The architect answered ({len(final)} result).\nTASK_DONE"}


async def test_delegate_mode_and_the_orchestrator_as_a_child(tmp_path: Path) -> None:
    workdir = prepare_workdir(tmp_path / "project")
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            url = await network_up(stack, workdir, parent_script)
            # Another orchestrator (ours, here) delegates to this one as to any A2A agent.
            outer = Network.of(AgentSpec(name="network", role="orchestrator", url=url))
            async with Session(
                Store(tmp_path / "outer.db"), workdir=tmp_path, network=outer
            ) as session:
                handle = await session.spawn(ChildConfig(role="network", prompt="Add slugify"))
                nested = await handle.result()
                nested_kinds = [e.kind for e in handle.log]
            async with a2a_client(url) as client:
                request = user_message("Design slugify")
                request.message.metadata.update({MODE_KEY: "delegate"})
                responses, events = await collect(client, request)
    # The whole network answered as one child: started ... done, pipeline summary.
    assert isinstance(nested, Done) and nested.text.startswith("TASK_DONE")
    assert nested_kinds[0] == "started" and nested_kinds[-1] == "done"
    assert isinstance(events[-1], Done)
    assert events[-1].text == "The architect answered (1 result).\nTASK_DONE"
    assert responses[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
