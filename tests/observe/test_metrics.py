"""Prometheus metrics: a real orchestrator and role server on 127.0.0.1,
a scripted delegation, then what each server's /metrics says."""

from __future__ import annotations

import json
import re
import signal
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from a2a.types import TaskState
from prometheus_client.parser import text_string_to_metric_families
from support.messages import collect, user_message
from support.servers import a2a_client, role_server, serve_process

from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.observe.metrics import METRIC_NAMES
from a2a_orchestrator.orchestrator.app import MODE_KEY, run_orchestrator_server
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import run_role_server

pytestmark = pytest.mark.anyio

ARCHITECT_SCRIPT = [
    {
        "text": "Reading the project first.",
        "tool_calls": [
            {"name": "read_file", "arguments": {"path": "notes.txt"}},
            {"name": "read_file", "arguments": {"path": "missing.txt"}},
        ],
    },
    {"text": "## Approach\nA slug function.\nTASK_DONE"},
]


def parent_script(messages: list[dict[str, Any]]) -> dict[str, Any]:
    steps = sum(1 for m in messages if m["role"] == "assistant")
    if steps == 0:
        task = {"role": "architect", "prompt": "Design slugify"}
        return {"tool_calls": [{"name": "agent", "arguments": {"agents": [task]}}]}
    if steps == 1:
        return {"tool_calls": [{"name": "agent_manage", "arguments": {}}]}
    return {"text": "The architect answered.\nTASK_DONE"}


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in found.items() if n == name and wanted <= ls)


async def test_a_delegation_is_counted_by_each_server_for_its_own_work(tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("slugs are lower case\n")
    architect_model = ScriptedModel(ARCHITECT_SCRIPT)
    parent_model = ScriptedModel(parent_script)
    with anyio.fail_after(60):
        async with AsyncExitStack() as stack:
            architect = await stack.enter_async_context(
                run_role_server(
                    find_role("architect"),
                    architect_model,
                    workdir,
                    db=str(tmp_path / "architect.db"),
                )
            )
            orchestrator = await stack.enter_async_context(
                run_orchestrator_server(
                    store_path=tmp_path / "orchestrator.db",
                    workdir=workdir,
                    network=Network.of(
                        AgentSpec(name="architect", role="architect", url=architect.url)
                    ),
                    models=lambda name: parent_model,
                    db=str(tmp_path / "orchestrator-tasks.db"),
                )
            )
            async with a2a_client(orchestrator.url) as client:
                request = user_message("Design slugify")
                request.message.metadata.update({MODE_KEY: "delegate"})
                responses, events = await collect(client, request)
            async with httpx.AsyncClient() as http:
                role_text = (await http.get(f"{architect.url}/metrics")).text
                orchestrator_reply = await http.get(f"{orchestrator.url}/metrics")
    assert isinstance(events[-1], Done)
    assert responses[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert orchestrator_reply.headers["content-type"].startswith("text/plain")
    role, parent = samples(role_text), samples(orchestrator_reply.text)
    names = {f.name for f in text_string_to_metric_families(role_text)}
    assert {n.removesuffix("_total") for n in METRIC_NAMES} <= names

    # The role server: its task, its turn, its model calls and tools.
    assert value(role, "a2a_tasks_total", state="completed") == 1
    assert value(role, "a2a_tasks_total", state="working") == 1
    assert value(role, "a2a_tasks_active") == 0
    model = architect_model.name
    assert value(role, "a2a_tokens_total", role="architect", model=model, direction="input") > 0
    assert value(role, "a2a_tokens_total", role="architect", model=model, direction="output") > 0
    assert value(role, "a2a_model_call_duration_seconds_count", role="architect") == 2
    assert value(role, "a2a_turn_duration_seconds_count", role="architect", outcome="done") == 1
    assert value(role, "a2a_tool_calls_total", role="architect", tool="read_file") == 2
    assert value(role, "a2a_tool_failures_total", role="architect", tool="read_file") == 1
    assert value(role, "a2a_model_errors_total") == 0
    # Each server counts the work done in its own process, nothing else.
    assert value(role, "a2a_tokens_total", role="orchestrator") == 0

    # The orchestrator: its own A2A task and its parent agent's turn.
    assert value(parent, "a2a_tasks_total", state="completed") == 1
    assert value(parent, "a2a_tokens_total", role="orchestrator", direction="input") > 0
    assert value(parent, "a2a_tool_calls_total", role="orchestrator", tool="agent") == 1
    assert value(parent, "a2a_tool_calls_total", role="orchestrator", tool="agent_manage") == 1
    assert value(parent, "a2a_tokens_total", role="architect") == 0
    assert value(parent, "a2a_children_running") == 0


async def test_a_failing_model_is_counted_by_kind(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with role_server(tmp_path, [{"error": "simulated outage"}], role="architect") as s:
            async with a2a_client(s.url) as client:
                _, events = await collect(client, user_message("Design it"))
            async with httpx.AsyncClient() as http:
                found = samples((await http.get(f"{s.url}/metrics")).text)
    assert isinstance(events[-1], Failed)
    assert value(found, "a2a_model_errors_total", role="architect", kind="error") == 1
    assert value(found, "a2a_turn_duration_seconds_count", outcome="error") == 1
    assert value(found, "a2a_tasks_total", state="failed") == 1


async def test_tool_labels_are_the_roles_tools_never_names_the_model_made_up(
    tmp_path: Path,
) -> None:
    made_up = [{"name": f"bogus_{n}_" + "x" * 2000, "arguments": {}} for n in range(70)]
    script = [
        {"tool_calls": made_up},
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"text": "done\nTASK_DONE"},
    ]
    (tmp_path / "notes.txt").write_text("notes")
    with anyio.fail_after(30):
        async with role_server(tmp_path, script, role="architect") as s:
            async with a2a_client(s.url) as client:
                _, events = await collect(client, user_message("Design it"))
            async with httpx.AsyncClient() as http:
                text = (await http.get(f"{s.url}/metrics")).text
    assert isinstance(events[-1], Done)
    found = samples(text)
    tools = {dict(ls)["tool"] for n, ls in found if n == "a2a_tool_calls_total"}
    assert tools == {"other", "read_file"}
    assert value(found, "a2a_tool_calls_total", tool="other") == 70
    assert value(found, "a2a_tool_failures_total", tool="other") == 70
    assert value(found, "a2a_tool_calls_total", tool="read_file") == 1
    assert "bogus" not in text


async def test_metrics_sit_behind_the_api_auth_unless_made_public(tmp_path: Path) -> None:
    token = "metrics-test-token"

    def serving(db: str, **options: Any) -> Any:
        return run_role_server(
            find_role("architect"),
            ScriptedModel([{"text": "unused"}]),
            tmp_path,
            db=str(tmp_path / db),
            token=token,
            **options,
        )

    with anyio.fail_after(30):
        async with (
            serving("guarded.db") as guarded,
            serving("public.db", metrics_public=True) as public,
            serving("off.db", metrics=False) as off,
            httpx.AsyncClient() as http,
        ):
            anonymous = await http.get(f"{guarded.url}/metrics")
            authorized = await http.get(
                f"{guarded.url}/metrics", headers={"Authorization": f"Bearer {token}"}
            )
            wrong = await http.get(
                f"{guarded.url}/metrics", headers={"Authorization": "Bearer nope"}
            )
            open_to_all = await http.get(f"{public.url}/metrics")
            # Public metrics open nothing else: the A2A endpoints still ask.
            still_guarded = await http.post(f"{public.url}/", json={})
            absent = await http.get(
                f"{off.url}/metrics", headers={"Authorization": f"Bearer {token}"}
            )
    assert anonymous.status_code == 401
    assert wrong.status_code == 401
    assert authorized.status_code == 200 and "a2a_tasks_total" in authorized.text
    assert open_to_all.status_code == 200 and "a2a_tool_calls_total" in open_to_all.text
    assert still_guarded.status_code == 401
    # Off: no such endpoint (Starlette redirects the unknown path, never 200).
    assert absent.status_code != 200 and "a2a_" not in absent.text


def test_serve_flags_and_variables_choose_the_metrics(tmp_path: Path) -> None:
    offline = {"A2A_MODEL_BASE_URL": "", "OPENAI_BASE_URL": "", "A2A_AUTH_TOKEN": "cli-token"}
    with serve_process(tmp_path, "architect", "--metrics-public", env=offline) as (p, url, banner):
        public = httpx.get(f"{url}/metrics", timeout=10)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    assert f"metrics: {url}/metrics (public)" in banner
    assert public.status_code == 200 and "a2a_tasks_total" in public.text
    with serve_process(tmp_path, "architect", env=offline) as (p, url, banner):
        guarded = httpx.get(f"{url}/metrics", timeout=10)
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    assert "(behind the same auth)" in banner and guarded.status_code == 401
    off = {**offline, "A2A_METRICS": "off"}
    with serve_process(tmp_path, "architect", env=off) as (p, url, banner):
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=20)
    assert "  metrics: off" in banner


def test_the_grafana_dashboard_uses_the_metrics_we_serve() -> None:
    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "deploy/grafana-dashboard.json").read_text()
    )
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {
        re.sub(r"_(bucket|count|sum)$", "", name)
        for expr in exprs
        for name in re.findall(r"\ba2a_[a-z_]+", expr)
    }
    assert used == set(METRIC_NAMES)
