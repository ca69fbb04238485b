import pytest


@pytest.fixture
def anyio_backend() -> str:
    # The a2a-sdk server and client are asyncio-only.
    return "asyncio"


# -- role servers on loopback -------------------------------------------------

from collections.abc import AsyncIterator  # noqa: E402
from contextlib import asynccontextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory  # noqa: E402

from a2a_orchestrator.models import ScriptedModel  # noqa: E402
from a2a_orchestrator.protocol.cards import CardOptions  # noqa: E402
from a2a_orchestrator.runtime.roles import find_role  # noqa: E402
from a2a_orchestrator.server.app import RunningServer, run_role_server  # noqa: E402


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


# -- processes of sandboxed commands --------------------------------------------


def running_with_args(*argv: str) -> list[int]:
    """Host pids of live processes whose command line is exactly `argv`.

    A sandboxed command has a PID namespace of its own, so the pid it prints
    (`echo $$`) means nothing out here; a command line made unique by its
    test (`sleep 60.417`) finds it instead. Zombies have an empty command line.
    """
    wanted = b"".join(arg.encode() + b"\0" for arg in argv)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == wanted:
                    found.append(int(entry.name))
            except OSError:
                continue  # exited while we looked
    return found


# -- PostgreSQL (replicas sharing one database) --------------------------------

from postgres import postgres  # noqa: E402, F401  (a session fixture)
