"""`Pipeline.restore`: a run rebuilt from its record in the session metadata.

The CLI tests kill real `run` processes (tests/cli/test_cli_sessions.py); these
reach the windows a kill cannot aim at: a step recorded whose child was
never spawned, and a run that had already ended. In-process children on a
real SQLite store; the model is scripted (by the role's prompt).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from a2a_orchestrator.control.pipeline import PROGRESS_KEY, Brief, Pipeline, PipelineError, TaskSpec
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio
ROLES = ("architect", "coder", "reviewer")


def by_role(messages: list[dict[str, Any]]) -> Any:
    system = messages[0]["content"]
    for name in ROLES:
        if f"You are the {name}" in system:
            return {"text": f"{name} output\nTASK_DONE"}
    raise AssertionError("unknown role prompt")


def session(tmp_path: Path, store: Store) -> Session:
    return Session(
        store,
        workdir=tmp_path,
        network=Network.of(*(AgentSpec(name=name, role=name) for name in ROLES)),
        models=lambda name: ScriptedModel(by_role),
        session_id="s1",
    )


async def test_a_step_recorded_before_its_child_existed_is_spawned_under_its_id(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "o.db")
    brief = Brief(task=TaskSpec(id="T7", title="Resume me"), goal="finish")
    with anyio.fail_after(30):
        async with session(tmp_path, store) as first:
            assert await Pipeline.restore(first) is None  # nothing recorded yet
            # What a run leaves when it dies between recording the coder's
            # step and spawning its child: the architect's output, and the
            # coder's child id with no child behind it.
            await store.set_session_metadata(
                first.id,
                PROGRESS_KEY,
                {
                    "brief": {
                        "task": {"id": "T7", "title": "Resume me", "description": ""},
                        "goal": "finish",
                        "instructions": "",
                        "project_context": "",
                        "notice": "",
                    },
                    "options": {"review_rounds": 1},
                    "steps": [
                        {
                            "pass": "architect",
                            "child_id": "arch1",
                            "text": "the recorded design",
                            "usage": {"input_tokens": 5, "output_tokens": 7},
                        },
                        {"pass": "coder", "child_id": "code1"},
                    ],
                    "state": "running",
                },
            )
        async with session(tmp_path, store) as second:
            pipeline = await Pipeline.restore(second)
            assert pipeline is not None and pipeline.brief == brief
            assert not pipeline.finished
            result = await pipeline.run()
            again = await Pipeline.restore(second)
            children = await store.list_children(session_id=second.id)
            coder_input = (await store.events(second.id, child_id="code1"))[0].payload["text"]
    assert [(c.child_id, c.role) for c in children][:1] == [("code1", "coder")]
    assert [c.role for c in children] == ["coder", "reviewer"]  # the architect did not run
    assert "the recorded design" in coder_input
    assert result.architect_output == "the recorded design"
    assert result.signal == "TASK_DONE" and result.coder_child_id == "code1"
    assert result.usage.input_tokens >= 5 and result.usage.output_tokens >= 7
    assert (tmp_path / result.artifact_dir / "architect.txt").read_text() == "the recorded design"
    # The record says how it ended; an ended run is not run again.
    assert again is not None and again.finished and again.signal == "TASK_DONE"
    with pytest.raises(PipelineError, match="already ended"):
        await again.run()


async def test_a_failed_run_records_its_error(tmp_path: Path) -> None:
    def failing(messages: list[dict[str, Any]]) -> Any:
        return {"error": "simulated outage"}

    store = Store(tmp_path / "o.db")
    network = Network.of(*(AgentSpec(name=name, role=name) for name in ROLES))
    with anyio.fail_after(30):
        async with Session(
            store, workdir=tmp_path, network=network, models=lambda n: ScriptedModel(failing)
        ) as opened:
            with pytest.raises(PipelineError, match="architect pass"):
                await Pipeline(opened, Brief(task=TaskSpec(id="1", title="t"))).run()
            restored = await Pipeline.restore(opened)
    assert restored is not None and restored.state == "failed"
    assert restored.error.startswith("architect pass: error:")
    assert restored.signal is None


async def test_an_unreadable_record_is_a_clear_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "o.db")
    with anyio.fail_after(30):
        async with session(tmp_path, store) as opened:
            await store.set_session_metadata(opened.id, PROGRESS_KEY, {"steps": "nonsense"})
            with pytest.raises(PipelineError, match="its pipeline record cannot be read"):
                await Pipeline.restore(opened)
            # Other metadata keys are left as they are.
            await store.set_session_metadata(opened.id, "workdir", "/somewhere")
            row = await store.get_session(opened.id)
    assert row is not None and row["metadata"]["workdir"] == "/somewhere"
    assert row["metadata"][PROGRESS_KEY] == {"steps": "nonsense"}
