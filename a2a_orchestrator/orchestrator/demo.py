"""`a2a-orchestrator demo`: the whole network, offline, on embedded defaults.

Starts the four role servers on 127.0.0.1, each with a scripted model that
replays a recorded scenario (no API key, no network), copies a small sample
project into a temporary work directory, and runs the architect -> coder ->
reviewer pipeline through the real network: A2A over HTTP with SSE, real
tool calls that write real files and run the project's real tests. A pace
(on a terminal by default) holds each model turn a moment, so the tree can
be watched; the run ends saying how to look at what it left.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TextIO

from ..control.pipeline import Brief, Pipeline, PipelineResult, TaskSpec
from ..delegation.network import AgentSpec, Network
from ..delegation.session import Session
from ..errors import ConfigError
from ..models import ScriptedModel
from ..runtime.roles import find_role
from ..server.app import run_role_server
from ..storage.store import Store
from ..tools import Sandbox
from ..tools.sandbox import probe
from .view import LiveTree

__all__ = [
    "DEMO_BRIEF",
    "DEMO_ROLES",
    "SCENARIO",
    "TERMINAL_PACE",
    "prepare_workdir",
    "run_demo",
]

SCENARIO = Path(__file__).parent / "demo_scenario"
DEMO_ROLES = ("architect", "coder", "reviewer")
"""The pipeline's passes, each a role server of its own."""
TERMINAL_PACE = 0.8
"""Seconds each model turn is held on a terminal (`--pace` sets another):
unpaced, the scripted run ends before a person has read the first line."""
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
files and the test run are all real.
"""

NEXT = """
What it left, and what to run next:

  a2a-orchestrator status --store {store}
      the session: its signal, its children, the tokens they spent
  a2a-orchestrator events {session} --store {store}
      every event the network recorded, in order
  a2a-orchestrator serve orchestrator --workdir {workdir}
      the orchestrator as an A2A server over this store: open
      http://127.0.0.1:9100/ui for the web view of this session

A real model: point the roles at any OpenAI-compatible endpoint (Ollama,
vLLM, llama.cpp, OpenAI, ...) and run a task of your own:

  export A2A_MODEL_BASE_URL=http://127.0.0.1:11434/v1   # any /v1/chat/completions server
  export A2A_MODEL_API_KEY=...                          # if the endpoint needs one
  export A2A_MODEL_DEFAULT=qwen2.5-coder                # the model name it serves
  a2a-orchestrator run "your task" --workdir your/project
"""


def prepare_workdir(target: Path | None = None) -> Path:
    """A fresh copy of the sample project: in `target`, a new or empty
    directory (one with files in it is refused: the copy would overwrite
    them), else in a new temporary one."""
    if target is not None and target.is_dir() and any(target.iterdir()):
        raise ConfigError(
            f"--workdir {target} is not empty: the demo would write its sample project "
            "over the files there; give a new or empty directory, or leave --workdir out "
            "for a new temporary one"
        )
    workdir = target or Path(tempfile.mkdtemp(prefix="a2a-demo-"))
    shutil.copytree(SCENARIO / "project", workdir, dirs_exist_ok=True)
    return workdir


def paced_model(name: str, pace: float) -> ScriptedModel:
    """Role `name`'s recorded turns, each held `pace` seconds more before it answers."""
    path = SCENARIO / "scripts" / f"{name}.json"
    if not pace:
        return ScriptedModel.from_file(path)
    turns = json.loads(path.read_text(encoding="utf-8"))
    for turn in turns:
        turn["delay"] = float(turn.get("delay", 0.0)) + pace
    return ScriptedModel(turns, name=f"scripted:{name}")


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
    workdir: Path | None = None,
    *,
    out: TextIO,
    sandbox: Sandbox | None = None,
    pace: float = 0.0,
) -> PipelineResult:
    """Run the demo scenario; the live tree, and a line per event, go to `out`.

    `sandbox`: where the coder's and reviewer's commands run (default:
    `Sandbox.from_env()`). `pace`: seconds each model turn is held, so a
    person can follow the tree. `workdir` must be new or empty (`prepare_workdir`)."""
    workdir = prepare_workdir(workdir)
    state = workdir / ".a2a"
    out.write(NOTICE + "\n")
    sandbox = demo_sandbox(sandbox if sandbox is not None else Sandbox.from_env(), out)
    out.write(f"work directory: {workdir}\n\n")
    async with AsyncExitStack() as stack:
        specs = []
        for name in DEMO_ROLES:
            model = paced_model(name, pace)
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
                title=DEMO_BRIEF.task.title,
            )
        )
        tree = LiveTree(
            f"pipeline  session {session.id[:8]}  (scripted model)",
            out=out,
            expected=list(DEMO_ROLES),
            # On a terminal too: the lines a log gets, above the tree.
            log_events=True,
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
    store = shlex.quote(str(state / "orchestrator.db"))
    out.write(NEXT.format(store=store, session=session.id[:8], workdir=shlex.quote(str(workdir))))
    return result
