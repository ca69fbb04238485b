"""`timeout=0` means no time limit of the caller's own (cloop: "a zero
Timeout still means none"), for a pipeline's passes and a child's config,
while a caller over A2A still cannot lift a role server's limit.

The model is scripted (the only fake): it answers after a delay longer than
the role's limit, so the limit, or its absence, decides the outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from a2a_orchestrator.control.pipeline import Brief, PassOptions, Pipeline, PipelineError, TaskSpec
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError
from a2a_orchestrator.models import ChatMessage, ScriptedModel
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.runtime.overrides import check_wire_overrides
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

BRIEF = Brief(task=TaskSpec(id="T0", title="No limit"))
ROLE_LIMIT = 0.5
SLOW = 1.5
"""Seconds a slow answer takes: three times the role's limit."""


def answer(messages: list[ChatMessage]) -> dict[str, Any]:
    # A user message with "slow" in it is answered after SLOW seconds.
    slow = any("slow" in str(m.get("content", "")) for m in messages if m["role"] == "user")
    return {"text": "Looked at it.\nTASK_DONE", "delay": SLOW if slow else 0.0}


@pytest.fixture
def quick_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A role with a half-second limit, found first in ./roles/."""
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "quick.md").write_text(
        f"---\ntools: [read_file]\ntimeout: {ROLE_LIMIT}\n---\nAnswer.\n"
    )
    monkeypatch.chdir(tmp_path)
    return "quick"


def test_zero_is_no_limit_and_is_never_sent_to_a_role_server(quick_role: str) -> None:
    unlimited = ChildConfig(role=quick_role, prompt="x", timeout=0)
    assert unlimited.unlimited and "timeout" not in unlimited.overrides()
    assert ChildConfig(role=quick_role, prompt="x", timeout=2).overrides()["timeout"] == 2
    assert not ChildConfig(role=quick_role, prompt="x").unlimited
    # False is not a number of seconds; the config check refuses it by name.
    odd = ChildConfig(role=quick_role, prompt="x", timeout=False)  # type: ignore[arg-type]
    assert not odd.unlimited and odd.overrides()["timeout"] is False
    # The wire keeps refusing a caller's 0: over A2A a limit can be lowered, not lifted.
    with pytest.raises(ConfigError, match="timeout"):
        check_wire_overrides({"timeout": 0}, find_role(quick_role), ())


async def test_pipeline_timeout_zero_runs_in_process_passes_without_a_limit(
    tmp_path: Path, quick_role: str
) -> None:
    network = Network.of(AgentSpec(name=quick_role, role=quick_role))
    model = ScriptedModel(answer)
    brief = Brief(task=TaskSpec(id="T1", title="Slow work"), instructions="slow")
    roles = {"architect": quick_role, "coder": quick_role, "reviewer": quick_role}
    with anyio.fail_after(30):
        async with Session(
            Store(tmp_path / "o.db"), workdir=tmp_path, network=network, models=lambda n: model
        ) as session:
            result = await Pipeline(session, brief, PassOptions(timeout=0, **roles)).run()
            # The same run with the role's own limit: its first pass times out.
            with pytest.raises(PipelineError, match=r"^architect pass: timeout: timed out"):
                await Pipeline(session, brief, PassOptions(**roles)).run()
    assert result.signal == "TASK_DONE"
    assert (tmp_path / result.artifact_dir / "reviewer.txt").read_text().endswith("TASK_DONE")


async def test_timeout_zero_over_a2a_is_accepted_and_keeps_the_servers_limit(
    tmp_path: Path, quick_role: str
) -> None:
    model = ScriptedModel(answer)
    with anyio.fail_after(30):
        async with run_role_server(
            find_role(quick_role), model, tmp_path, db=str(tmp_path / "role.db")
        ) as server:
            network = Network.of(AgentSpec(name=quick_role, role=quick_role, url=server.url))
            async with Session(Store(tmp_path / "o.db"), workdir=tmp_path, network=network) as s:
                roles = {"architect": quick_role, "coder": quick_role, "reviewer": quick_role}
                result = await Pipeline(s, BRIEF, PassOptions(timeout=0, **roles)).run()
                slow = await (
                    await s.spawn(ChildConfig(role=quick_role, prompt="slow", timeout=0))
                ).result()
    # Not refused as a bad config: the passes ran, under the server's limit.
    assert result.signal == "TASK_DONE"
    assert isinstance(slow, Failed) and slow.reason == "timeout", slow
    assert f"{ROLE_LIMIT:g} s" in slow.message


async def test_a_local_child_with_timeout_zero_outlives_its_roles_limit(
    tmp_path: Path, quick_role: str
) -> None:
    network = Network.of(AgentSpec(name=quick_role, role=quick_role))
    model = ScriptedModel(answer)
    with anyio.fail_after(30):
        async with Session(
            Store(tmp_path / "o.db"), workdir=tmp_path, network=network, models=lambda n: model
        ) as session:
            unlimited = await (
                await session.spawn(ChildConfig(role=quick_role, prompt="slow", timeout=0))
            ).result()
            limited = await (
                await session.spawn(ChildConfig(role=quick_role, prompt="slow"))
            ).result()
    assert isinstance(unlimited, Done) and unlimited.text.endswith("TASK_DONE")
    assert isinstance(limited, Failed) and limited.reason == "timeout"
