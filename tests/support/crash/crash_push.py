"""An orchestrator process with a child in push mode, for tests/server/test_push.py.

Run as `python crash_push.py STORE SESSION WORKDIR REMOTE_URL`: it serves
its webhook endpoint (`PushReceiver`) on a free port of 127.0.0.1, spawns
one remote child `p1` on an agent in push mode, prints READY, and waits to
be killed with SIGKILL.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import anyio
from starlette.applications import Starlette

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.push_receiver import PushReceiver
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store


def network(remote_url: str) -> Network:
    return Network.of(AgentSpec(name="pusher", role="coder", url=remote_url, push=True))


async def main(store_path: str, session_id: str, workdir: str, remote_url: str) -> None:
    store = Store(store_path)
    sock = bind_socket("127.0.0.1", 0)
    receiver = PushReceiver(store, f"http://127.0.0.1:{sock.getsockname()[1]}")
    async with anyio.create_task_group() as tg:
        await tg.start(serve, Starlette(routes=receiver.routes()), sock)
        async with Session(
            store,
            workdir=Path(workdir),
            network=network(remote_url),
            session_id=session_id,
            remote=functools.partial(RemoteDelegate, push=receiver),
        ) as session:
            await session.spawn(ChildConfig(role="pusher", prompt="remote slow"), child_id="p1")
            print("READY", flush=True)
            await anyio.sleep_forever()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:5])
