"""Sequential delegation round trips: bare a2a-sdk vs our remote and local transports.

    python bench/delegation.py [-n 200]

(a) a bare a2a-sdk client streaming to a bare a2a-sdk server whose executor
    completes at once;
(b) our remote transport (Session -> RemoteDelegate) to a role server whose
    scripted model answers at once;
(c) our local transport (Session -> in-process conversation), same model.

All three in this process, in one run, on 127.0.0.1; prints the median per
call and the ratios b/a and c/a. (b) and (c) include what a delegation costs
here: resolving the agent, recording the child and its events in SQLite.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette

from a2a_orchestrator.delegation import ChildConfig
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.network import AgentSpec, Network
from a2a_orchestrator.roles import find_role
from a2a_orchestrator.server import run_role_server
from a2a_orchestrator.serving import bind_socket, serve
from a2a_orchestrator.session import Session
from a2a_orchestrator.store import Store


class InstantExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        if context.current_task is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                )
            )
        updater = TaskUpdater(event_queue, task_id, context_id)
        await updater.add_artifact([new_text_part("ok")], name="result")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


def bare_app(url: str) -> Starlette:
    card = AgentCard(
        name="bare",
        description="bare a2a-sdk server",
        version="1",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
    )
    handler = DefaultRequestHandler(
        agent_executor=InstantExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])


async def timed(n: int, call: Callable[[], Awaitable[None]]) -> list[float]:
    for _ in range(min(10, n)):  # warm up connections and caches
        await call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return samples


async def main(n: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="a2a-bench-"))
    model = ScriptedModel(lambda messages: {"text": "ok"})
    results: dict[str, list[float]] = {}
    async with anyio.create_task_group() as tg:
        sock = bind_socket("127.0.0.1", 0)
        bare_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        await tg.start(serve, bare_app(bare_url), sock)
        async with httpx.AsyncClient(timeout=30) as http:
            card = await A2ACardResolver(http, bare_url).get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)

            async def bare() -> None:
                request = SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
                async for _ in client.send_message(request):
                    pass

            results["a  bare a2a-sdk"] = await timed(n, bare)

        async with run_role_server(
            find_role("coder"), model, work, db=str(work / "role.db")
        ) as server:
            network = Network.of(
                AgentSpec(name="remote", role="coder", url=server.url),
                AgentSpec(name="local", role="coder"),
            )
            async with Session(
                Store(work / "o.db"), workdir=work, network=network, models=lambda name: model
            ) as session:

                async def delegate(agent: str) -> None:
                    handle = await session.spawn(ChildConfig(role=agent, prompt="hi"))
                    await handle.wait()

                results["b  ours, remote"] = await timed(n, lambda: delegate("remote"))
                results["c  ours, local"] = await timed(n, lambda: delegate("local"))
        tg.cancel_scope.cancel()

    medians = {name: statistics.median(samples) for name, samples in results.items()}
    print(f"{n} sequential delegations each, instant model, 127.0.0.1")
    for name, median in medians.items():
        p90 = statistics.quantiles(results[name], n=10)[-1]
        print(f"  {name:<18} median {median * 1000:7.2f} ms   p90 {p90 * 1000:7.2f} ms")
    a = medians["a  bare a2a-sdk"]
    print(f"  ratio b/a (remote vs bare SDK): {medians['b  ours, remote'] / a:5.2f}")
    print(f"  ratio c/a (local  vs bare SDK): {medians['c  ours, local'] / a:5.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=200, help="delegations per variant")
    anyio.run(main, parser.parse_args().n)
