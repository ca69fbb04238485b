"""Real servers on loopback: role servers in-process, `serve` as a subprocess
(its banner parsed), the orchestrator with its three role servers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import (
    AsyncIterator,
    Iterator,
    Sequence,
)
from contextlib import (
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
)
from pathlib import Path
from typing import (
    Any,
)

import anyio
import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from starlette.applications import Starlette

from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.orchestrator.app import run_orchestrator_server
from a2a_orchestrator.orchestrator.demo import SCENARIO
from a2a_orchestrator.protocol.cards import CardOptions
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import RunningServer, run_role_server
from a2a_orchestrator.server.serving import bind_socket, serve
from support.cli import CLI


@asynccontextmanager
async def role_server(
    workdir: Path,
    script: Any,
    *,
    role: str = "coder",
    db: Path | str | None = None,
    token: str | None = None,
    card_options: CardOptions | None = None,
    grpc_port: int | None = None,
    **overrides: Any,
) -> AsyncIterator[RunningServer]:
    """A real role server on 127.0.0.1 whose model is scripted (the only fake);
    `grpc_port` (0: any free one) serves gRPC too, preferred in its card."""
    the_role = find_role(role)
    if overrides:
        the_role = the_role.with_overrides(**overrides)
    async with run_role_server(
        the_role,
        ScriptedModel(script),
        workdir,
        db=str(db or workdir / ".a2a" / "tasks.db"),
        token=token,
        card_options=card_options,
        grpc_port=grpc_port,
    ) as server:
        yield server


@asynccontextmanager
async def a2a_client(
    url: str, *, token: str | None = None, streaming: bool = True
) -> AsyncIterator[Client]:
    """A stock a2a-sdk client, resolving the card like any peer would."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        card = await A2ACardResolver(http, url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)
        try:
            yield client
        finally:
            await client.close()


def start_role_server(
    tmp_path: Path,
    port: int,
    db: Path,
    script: Path | None = None,
    launcher: Sequence[str] = ("-m", "a2a_orchestrator.cli"),
) -> tuple[subprocess.Popen[str], str]:
    """`a2a-orchestrator serve coder` as its own process (tests SIGKILL it);
    its model plays `script`, by default one slow answer. `launcher`: how
    Python runs the CLI (`crash_serve.py` kills it at a chosen commit)."""
    if script is None:
        script = tmp_path / "slow.json"
        script.write_text('[{"text": "never", "delay": 60}]')
    env = {
        **os.environ,
        "A2A_MODEL_SCRIPT": str(script),
        "A2A_MODEL_BASE_URL": "",
        "A2A_MODEL_API_KEY": "",
        "OPENAI_BASE_URL": "",
        "OPENAI_API_KEY": "",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            *launcher,
            "serve",
            "coder",
            "--port",
            str(port),
            "--db",
            str(db),
            "--workdir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return process, served_url(process)


@contextmanager
def serve_process(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[str], str, str]]:
    process = subprocess.Popen(
        [*CLI, "serve", *args, "--port", "0", "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        banner = [process.stdout.readline()]
        match = BANNER.search(banner[0])
        assert match, banner[0] + (process.stderr.read() if process.stderr else "")
        while not banner[-1].startswith("  auth:"):
            banner.append(process.stdout.readline())
        yield process, match.group(1), "".join(banner)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


CARD_PATH = "/.well-known/agent-card.json"


@asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """`app` on a real uvicorn server on 127.0.0.1; yields its base URL."""
    async with anyio.create_task_group() as tg:
        port = await tg.start(serve, app, bind_socket("127.0.0.1", 0))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            tg.cancel_scope.cancel()


async def network_up(stack: AsyncExitStack, workdir: Path, parent_script: Any = None) -> str:
    specs = []
    for name in ("architect", "coder", "reviewer"):
        model = ScriptedModel.from_file(SCENARIO / "scripts" / f"{name}.json")
        server = await stack.enter_async_context(
            run_role_server(find_role(name), model, workdir, db=str(workdir.parent / f"{name}.db"))
        )
        specs.append(AgentSpec(name=name, role=name, url=server.url))
    parent_model = ScriptedModel(parent_script or [{"text": "unused"}])
    orchestrator = await stack.enter_async_context(
        run_orchestrator_server(
            store_path=workdir.parent / "orchestrator.db",
            workdir=workdir,
            network=Network.of(*specs),
            models=lambda name: parent_model,
            db=str(workdir.parent / "orchestrator-tasks.db"),
        )
    )
    return orchestrator.url


# The first line `serve` prints once it listens.
BANNER = re.compile(r"serving A2A at (http://\S+)")


def served_url(process: subprocess.Popen[str]) -> str:
    """The URL on the first line of `serve`'s banner; fails with that line
    and the server's stderr when it names none (the server did not start)."""
    assert process.stdout is not None
    first = process.stdout.readline()
    match = BANNER.search(first)
    assert match, first + (process.stderr.read() if process.stderr else "")
    return match.group(1)
