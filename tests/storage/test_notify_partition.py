"""A listening connection cut without a reset is found out and replaced.

A throwaway PostgreSQL (`postgres.py`) behind a TCP proxy on 127.0.0.1
that can stall: it keeps the connections open and drops every byte, as a
network partition or a firewall's idle timeout does, so no reset ever
reaches the notifier. It must then count its connection as down (its
users poll meanwhile) and not keep waiting on a connection that will never
deliver a notification again.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import anyio.abc
import pytest
from support.postgres import Postgres

from a2a_orchestrator.storage.notify import Notifier

pytestmark = pytest.mark.anyio


class Stall:
    """A TCP proxy to `target_port` that drops every byte once `stalled`."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.stalled = False

    async def serve(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started()
            await listener.serve(self._relay)

    async def _relay(self, client: Any) -> None:
        server = await anyio.connect_tcp("127.0.0.1", self.target_port)
        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(self._pump, client, server)
            tg.start_soon(self._pump, server, client)

    async def _pump(self, source: Any, sink: Any) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for data in source:
                if not self.stalled:
                    await sink.send(data)


async def test_a_stalled_listening_connection_counts_as_down(postgres: Postgres) -> None:
    database = postgres.database("stall")
    changes: list[bool] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            proxy = Stall(postgres.port)
            await tg.start(proxy.serve)
            url = postgres.url(database).replace(f":{postgres.port}/", f":{proxy.port}/")
            notifier = Notifier(url, retry=0.2, ping=0.5)
            notifier.on_change(changes.append)
            await notifier.listen("a2a_stall_test", lambda _payload: None)
            async with notifier.running():
                while not notifier.up:
                    await anyio.sleep(0.01)
                proxy.stalled = True
                # Found out within a ping and its answer's time.
                with anyio.move_on_after(5):
                    while notifier.up:
                        await anyio.sleep(0.05)
                down = not notifier.up
            tg.cancel_scope.cancel()
    assert down
    assert changes[:2] == [True, False]
