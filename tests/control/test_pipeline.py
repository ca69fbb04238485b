"""The architect -> coder -> reviewer pipeline: rules, errors, and full runs both ways."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from a2a_orchestrator.control.pipeline import (
    Brief,
    PassOptions,
    Pipeline,
    PipelineCancelled,
    PipelineError,
    TaskSpec,
    extract_signal,
    slugify,
)
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.demo import DEMO_BRIEF, SCENARIO, prepare_workdir
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio
ROLES = ("architect", "coder", "reviewer")


def test_signal_rule() -> None:
    assert extract_signal("work\nTASK_DONE") == "TASK_DONE"
    assert extract_signal("a\n  TASK_FAILED  \nmore text\n") == "TASK_FAILED"
    # Only the last five lines count, and the first match from the top wins.
    assert extract_signal("TASK_DONE\n1\n2\n3\n4\n5") is None
    assert extract_signal("x\nTASK_SKIPPED\nTASK_DONE\n") == "TASK_SKIPPED"
    assert extract_signal("TASK_DONE.") is None and extract_signal("") is None


def test_slug() -> None:
    assert slugify("Add slugify to textkit") == "add-slugify-to-textkit"
    assert slugify("  Fix: the -- BUG!! ") == "fix-the-bug"
    assert slugify("x" * 50) == "x" * 40
    assert slugify("a" * 39 + " b") == "a" * 39


def scripted(name: str) -> ScriptedModel:
    return ScriptedModel.from_file(SCENARIO / "scripts" / f"{name}.json")


async def run_network(
    workdir: Path, transport: str, brief: Brief = DEMO_BRIEF, **options: Any
) -> Any:
    """The demo scenario's pipeline with every role remote or every role in-process."""
    async with AsyncExitStack() as stack:
        models = {name: scripted(name) for name in ROLES}
        if transport == "remote":
            specs = []
            for name in ROLES:
                server = await stack.enter_async_context(
                    run_role_server(
                        find_role(name),
                        models[name],
                        workdir,
                        db=str(workdir.parent / f"{workdir.name}-{name}.db"),
                    )
                )
                specs.append(AgentSpec(name=name, role=name, url=server.url))
            network = Network.of(*specs)
        else:
            network = Network.of(*(AgentSpec(name=name, role=name) for name in ROLES))
        store = Store(workdir.parent / f"{workdir.name}-orchestrator.db")
        session = await stack.enter_async_context(
            Session(
                store,
                workdir=workdir,
                network=network,
                # In-process children pick their role's script by the role's prompt.
                models=lambda name: ScriptedModel(_by_role(models)),
            )
        )
        return await Pipeline(session, brief, PassOptions(**options)).run()


def _by_role(models: dict[str, ScriptedModel]) -> Any:
    def choose(messages: list[dict[str, Any]]) -> Any:
        system = messages[0]["content"]
        for name in ROLES:
            if f"You are the {name}" in system:
                index = sum(1 for m in messages if m["role"] == "assistant")
                return models[name].turns[index]
        raise AssertionError("unknown role prompt")

    return choose


async def test_the_pipeline_end_to_end_over_real_role_servers_and_in_process(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        remote = await run_network(prepare_workdir(tmp_path / "remote"), "remote")
        local = await run_network(prepare_workdir(tmp_path / "local"), "local")
    for result, root in ((remote, tmp_path / "remote"), (local, tmp_path / "local")):
        assert result.signal == "TASK_DONE"
        assert result.artifact_dir == ".a2a/tasks/T1-add-slugify-to-textkit-multiagent"
        assert (root / "textkit" / "slug.py").exists() and (
            root / "tests" / "test_slug.py"
        ).exists()
        assert "from .slug import slugify" in (root / "textkit" / "__init__.py").read_text()
        assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
        assert result.coder_child_id
    # Same artifacts either way.
    for name in ROLES:
        remote_text = (tmp_path / "remote" / remote.artifact_dir / f"{name}.txt").read_text()
        local_text = (tmp_path / "local" / local.artifact_dir / f"{name}.txt").read_text()
        assert remote_text == local_text
    architect = (tmp_path / "remote" / remote.artifact_dir / "architect.txt").read_text()
    for section in ("## Approach", "## Components", "## Design decisions", "## Risks"):
        assert section in architect
    assert remote.reviewer_output.endswith("TASK_DONE")


def _fixed(texts: dict[str, Any]) -> Any:
    def choose(messages: list[dict[str, Any]]) -> Any:
        system = messages[0]["content"]
        steps = sum(1 for m in messages if m["role"] == "assistant")
        for name in ROLES:
            if f"You are the {name}" in system:
                value = texts[name]
                return value(messages, steps) if callable(value) else value
        raise AssertionError("unknown role prompt")

    return choose


async def run_local(
    tmp_path: Path, texts: dict[str, Any], **options: Any
) -> tuple[Any, Session, list[str]]:
    calls: list[str] = []
    inner = _fixed(texts)

    def model_fn(messages: list[dict[str, Any]]) -> Any:
        calls.append(messages[0]["content"][:20])
        return inner(messages)

    network = Network.of(*(AgentSpec(name=name, role=name) for name in ROLES))
    async with Session(
        Store(tmp_path / "o.db"),
        workdir=tmp_path,
        network=network,
        models=lambda n: ScriptedModel(model_fn),
    ) as session:
        brief = Brief(task=TaskSpec(id="42", title="Do it"))
        pipeline = Pipeline(session, brief, PassOptions(**options))
        try:
            result = await pipeline.run()
        except PipelineError as exc:
            return exc, session, calls
        return result, session, calls


async def test_signals_reviewer_overrides_coder_and_default_is_done(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        overridden, _, _ = await run_local(
            tmp_path / "a",
            {
                "architect": {"text": "design"},
                "coder": {"text": "code\nTASK_DONE"},
                "reviewer": {"text": "bad\nTASK_FAILED"},
            },
        )
        fallback, _, _ = await run_local(
            tmp_path / "b",
            {
                "architect": {"text": "design"},
                "coder": {"text": "code\nTASK_SKIPPED"},
                "reviewer": {"text": "fine"},
            },
        )
        neither, _, _ = await run_local(
            tmp_path / "c",
            {
                "architect": {"text": "design"},
                "coder": {"text": "code"},
                "reviewer": {"text": "fine"},
            },
        )
    assert overridden.signal == "TASK_FAILED"
    assert fallback.signal == "TASK_SKIPPED"
    assert neither.signal == "TASK_DONE"


async def test_pass_errors_end_the_run_with_the_pass_name(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        empty, _, calls = await run_local(
            tmp_path / "a",
            {"architect": {"text": "design"}, "coder": {"text": "   "}, "reviewer": {"text": "x"}},
        )
        broken, _, _ = await run_local(
            tmp_path / "b",
            {
                "architect": {"error": "provider exploded"},
                "coder": {"text": "x"},
                "reviewer": {"text": "x"},
            },
        )
    assert isinstance(empty, PipelineError) and str(empty) == "coder pass: returned empty output"
    assert not any(c.startswith("You are the reviewer") for c in calls)  # no further pass ran
    assert isinstance(broken, PipelineError) and str(broken).startswith("architect pass: error: ")
    assert "provider exploded" in str(broken)
    assert not (tmp_path / "a" / ".a2a" / "tasks").exists()  # no partial success


async def test_cancellation_is_checked_before_each_pass(tmp_path: Path) -> None:
    calls: list[str] = []
    pipeline_box: list[Pipeline] = []

    def model_fn(messages: list[dict[str, Any]]) -> Any:
        system = messages[0]["content"]
        calls.append(system[:24])
        if "You are the architect" in system:
            return {"text": "design", "delay": 0.3}
        return {"text": "should never run"}

    network = Network.of(*(AgentSpec(name=name, role=name) for name in ROLES))
    with anyio.fail_after(20):
        async with Session(
            Store(tmp_path / "o.db"),
            workdir=tmp_path,
            network=network,
            models=lambda n: ScriptedModel(model_fn),
        ) as session:
            pipeline = Pipeline(session, Brief(task=TaskSpec(id="1", title="t")))
            pipeline_box.append(pipeline)
            async with anyio.create_task_group() as tg:
                outcome: list[BaseException] = []

                async def run() -> None:
                    try:
                        await pipeline.run()
                    except PipelineError as exc:
                        outcome.append(exc)

                tg.start_soon(run)
                while "architect" not in pipeline.passes:
                    await anyio.sleep(0.01)
                await pipeline.cancel()
    assert isinstance(outcome[0], PipelineCancelled)
    assert str(outcome[0]).startswith("architect pass: cancelled")
    assert all("You are the architect" in c for c in calls)  # no coder or reviewer model call


async def test_review_rounds_continue_the_coders_conversation(tmp_path: Path) -> None:
    def coder(messages: list[dict[str, Any]], steps: int) -> Any:
        users = [m["content"] for m in messages if m["role"] == "user"]
        return {"text": f"attempt {len(users)}\nTASK_DONE"}

    def reviewer(messages: list[dict[str, Any]], steps: int) -> Any:
        return {"text": "needs work\nTASK_FAILED" if steps == 0 else "good now\nTASK_DONE"}

    with anyio.fail_after(20):
        result, session, _ = await run_local(
            tmp_path,
            {"architect": {"text": "design"}, "coder": coder, "reviewer": reviewer},
            review_rounds=2,
        )
        children = await session.store.list_children(session_id=session.id)
    assert result.signal == "TASK_DONE"
    # The second attempt happened in the same conversation: it saw both user turns.
    assert result.coder_output.startswith("attempt 2")
    assert [c.role for c in children] == ["architect", "coder", "reviewer"]
    artifacts = json.dumps(sorted(p.name for p in (tmp_path / result.artifact_dir).iterdir()))
    assert artifacts == '["architect.txt", "coder.txt", "reviewer.txt"]'
