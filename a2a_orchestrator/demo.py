"""`a2a-orchestrator demo`: the whole network, offline, on embedded defaults.

Starts the four role servers on 127.0.0.1, each with a scripted model that
replays a recorded scenario (no API key, no network), copies a small sample
project into a temporary work directory, and runs the architect -> coder ->
reviewer pipeline through the real network: A2A over HTTP with SSE, real
tool calls that write real files and run the project's real tests.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TextIO

from .models import ScriptedModel
from .network import AgentSpec, Network
from .pipeline import Brief, Pipeline, PipelineResult, TaskSpec
from .roles import find_role
from .server import run_role_server
from .session import Session
from .store import Store
from .tools import Sandbox
from .tools.sandbox import probe
from .view import LiveTree

__all__ = ["DEMO_BRIEF", "DEMO_ROLES", "SCENARIO", "prepare_workdir", "run_demo"]

SCENARIO = Path(__file__).parent / "demo_scenario"
DEMO_ROLES = ("architect", "coder", "reviewer", "observer")
DEMO_BRIEF = Brief(
    task=TaskSpec(
        id="T1",
        title="Add slugify to textkit",
        description="textkit needs a `slugify(text)` helper that turns titles into URL slugs.",
    ),
    goal="`from textkit import slugify` works and is tested.",
    instructions="Standard library only. Tests run with `python3 -m unittest`.",
    project_context="A small pure-Python package `textkit` with unittest tests in `tests/`.",
)

NOTICE = """\
This demo runs on a scripted model: each role replays recorded turns, and no
language model is called. The network, the A2A calls, the tool calls, the
files and the test run are all real. To use a real model, point the roles at
any OpenAI-compatible endpoint and run a task of your own:

    export A2A_MODEL_BASE_URL=http://127.0.0.1:11434/v1   # any /v1/chat/completions server
    export A2A_MODEL_API_KEY=...                          # if the endpoint needs one
    export A2A_MODEL_DEFAULT=qwen2.5-coder                # the model name it serves
    a2a-orchestrator run "your task" --workdir your/project
"""


def prepare_workdir(target: Path | None = None) -> Path:
    """A fresh copy of the sample project."""
    workdir = target or Path(tempfile.mkdtemp(prefix="a2a-demo-"))
    shutil.copytree(SCENARIO / "project", workdir, dirs_exist_ok=True)
    return workdir


def demo_sandbox(sandbox: Sandbox, out: TextIO) -> Sandbox:
    """The sandbox the demo's commands run in: `sandbox`, or none where
    bubblewrap cannot run here.

    Elsewhere a missing sandbox refuses `run_command`: there a model chooses
    the commands. The demo's commands come from its shipped script (a test
    run of the sample project), not from a model, so the demo still runs on a
    machine without bubblewrap, and says so.
    """
    if not sandbox.enabled:
        return sandbox
    reason = probe(sandbox.bwrap, network=sandbox.network)
    if not reason:
        return sandbox
    out.write(
        f"sandbox: none ({reason}). The demo's commands come from its shipped "
        "script, not from a model, so they run unsandboxed here; a role that runs "
        "a model's commands refuses to start without bubblewrap "
        "(apt-get install bubblewrap).\n"
    )
    return dataclasses.replace(sandbox, enabled=False)


async def run_demo(
    workdir: Path | None = None, *, out: TextIO, sandbox: Sandbox | None = None
) -> PipelineResult:
    """Run the demo scenario; the live tree goes to `out`.

    `sandbox`: where the coder's and reviewer's commands run (default:
    `Sandbox.from_env()`)."""
    workdir = prepare_workdir(workdir)
    state = workdir / ".a2a"
    out.write(NOTICE + "\n")
    sandbox = demo_sandbox(sandbox if sandbox is not None else Sandbox.from_env(), out)
    out.write(f"work directory: {workdir}\n\n")
    async with AsyncExitStack() as stack:
        specs = []
        for name in DEMO_ROLES:
            model = ScriptedModel.from_file(SCENARIO / "scripts" / f"{name}.json")
            server = await stack.enter_async_context(
                run_role_server(
                    find_role(name),
                    model,
                    workdir,
                    db=str(state / f"tasks-{name}.db"),
                    sandbox=sandbox,
                )
            )
            specs.append(AgentSpec(name=name, role=name, url=server.url))
            out.write(f"  {name:<9} A2A server at {server.url}\n")
        out.write("\n")
        session = await stack.enter_async_context(
            Session(
                Store(state / "orchestrator.db"),
                workdir=workdir,
                network=Network.of(*specs),
                sandbox=sandbox,
            )
        )
        tree = LiveTree(
            f"pipeline  session {session.id[:8]}  (scripted model)",
            out=out,
            expected=["architect", "coder", "reviewer"],
        )
        async with session.relay() as relay:
            result = await tree.follow_while(relay, Pipeline(session, DEMO_BRIEF).run())
        if not tree.live:
            tree.draw()
    out.write(
        f"\nsignal: {result.signal}   tokens: {result.usage.input_tokens} in, "
        f"{result.usage.output_tokens} out\n"
        f"artifacts: {workdir / result.artifact_dir}\n"
        f"project:   {workdir} (textkit/slug.py and tests/test_slug.py were written by the coder)\n"
    )
    return result
