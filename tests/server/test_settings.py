"""Construction: servers take one settings object, checked once at their entry
point; a session is given its A2A transport; a conversation holds itself at a
pause rule's match. Real servers on 127.0.0.1; only the model is scripted."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import httpx
import pytest

from a2a_orchestrator.delegation.network import Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.runtime.conversation import Conversation
from a2a_orchestrator.runtime.events import ChildEvent, Done, ToolCalled, ToolResult
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.runtime.selectors import Selector
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.server.settings import RoleServerSettings
from a2a_orchestrator.storage.store import Store
from a2a_orchestrator.tools import Workspace, build_tools

pytestmark = pytest.mark.anyio

WRITE = {"path": "a", "content": "x"}


def test_bad_settings_are_refused_when_the_object_is_made() -> None:
    with pytest.raises(ConfigError, match=r"port 70000 is not in 0\.\.65535"):
        RoleServerSettings(db="tasks.db", port=70000)
    with pytest.raises(ConfigError, match="gRPC port"):
        RoleServerSettings(db="tasks.db", grpc_port=-1)
    with pytest.raises(ConfigError, match="body_timeout must be positive"):
        RoleServerSettings(db="tasks.db", body_timeout=0)


async def test_run_role_server_checks_its_keywords_before_binding(tmp_path: Path) -> None:
    role = find_role("coder")
    with pytest.raises(ConfigError, match="max_body must be a positive"):
        async with run_role_server(
            role, ScriptedModel([]), tmp_path, db=str(tmp_path / "t.db"), max_body=0
        ):
            pass
    # A keyword that names no setting is a TypeError, as for any function.
    with pytest.raises(TypeError, match="no_such_setting"):
        async with run_role_server(
            role, ScriptedModel([]), tmp_path, db=str(tmp_path / "t.db"), no_such_setting=1
        ):
            pass
    assert not (tmp_path / "t.db").exists()  # refused before anything was opened


async def test_a_settings_object_with_keywords_in_place_of_its_fields(tmp_path: Path) -> None:
    settings = RoleServerSettings(db=str(tmp_path / "t.db"), metrics=True)
    with anyio.fail_after(20):
        async with (
            run_role_server(
                find_role("coder"), ScriptedModel([]), tmp_path, settings, metrics=False
            ) as server,
            httpx.AsyncClient(timeout=10) as http,
        ):
            card = await http.get(f"{server.url}/.well-known/agent-card.json")
            metrics = await http.get(f"{server.url}/metrics")
    assert card.status_code == 200 and card.json()["name"] == "coder"
    # The keyword won over the object's field: no metrics route.
    assert metrics.status_code != 200
    assert settings.metrics  # the given object is frozen, never changed


async def test_a_session_closes_the_transport_it_made_and_not_a_given_one(
    tmp_path: Path,
) -> None:
    made: list[RemoteDelegate] = []

    def make() -> RemoteDelegate:
        made.append(RemoteDelegate(lost_after=5.0))
        return made[-1]

    store = Store(tmp_path / "o.db")
    try:
        with anyio.fail_after(20):
            async with Session(store, workdir=tmp_path, network=Network.of(), remote=make) as s:
                assert s.remote is made[0] and s.remote.lost_after == 5.0
            assert made[0].http.is_closed
            async with RemoteDelegate() as given:
                async with Session(store, workdir=tmp_path, network=Network.of(), remote=given):
                    pass
                assert not given.http.is_closed  # its owner's, still open
            assert given.http.is_closed
    finally:
        store.close()


async def test_a_conversation_holds_at_a_rule_match_until_the_rule_is_dropped(
    tmp_path: Path,
) -> None:
    conversation = Conversation(
        model=ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "write_file", "arguments": {"path": "a", "content": "x"}}
                    ]
                },
                {"text": "done"},
            ]
        ),
        tools=build_tools(["write_file"], Workspace(tmp_path)),
    )
    conversation.pause_on({"writes": Selector.from_dict({"kind": "tool_call"})})
    events: list[ChildEvent] = []
    held_at: list[bool] = []
    announced = anyio.Event()

    async def emit(event: ChildEvent) -> None:
        events.append(event)
        held_at.append(conversation.holds_at(event))
        if isinstance(event, ToolCalled):
            announced.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(conversation.run, "write a", emit)
            await announced.wait()
            # Held before the event was handed on: the call has not run.
            assert conversation.held == "writes"
            assert held_at[-1] is True
            for _ in range(20):  # the turn gets every chance to go on; it must not
                await anyio.lowlevel.checkpoint()
                assert not (tmp_path / "a").exists()
            assert not any(isinstance(e, ToolResult) for e in events)
            conversation.pause_on({})  # the rule dropped: the hold is released
    assert conversation.held is None and not conversation.paused
    assert (tmp_path / "a").read_text() == "x"
    assert isinstance(events[-1], Done) and events[-1].text == "done"
    assert held_at.count(True) == 1  # only the matching event held it
