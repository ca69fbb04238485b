"""Delegation round trips, one at a time: the bare a2a-sdk floor against ours.

    python bench/delegation.py [--rounds 7] [-n 40] [--quick]

Variants, each one call after another with an instant model, on 127.0.0.1:

  bare SDK     a bare a2a-sdk client streaming to a bare a2a-sdk server whose
               executor completes at once (the floor for a remote delegation)
  in-process   one turn of the same scripted model, awaited directly: no
               store, no session (the floor for a local child)
  local        `Session.spawn` of an in-process child, then `wait()`
  remote       `Session.spawn` of a child on a role server (`run_role_server`,
               the project's server with its SQLite task store), then `wait()`
  SDK->role    the bare client streaming to that role server, asking for
               the batch extension as the orchestrator does (so it gets the
               frames a remote child gets): what the role server adds
  Session->SDK `Session.spawn` of a child on the bare server, then `wait()`:
               what the orchestrator's side adds to the floor
  SDK->app     the bare client streaming to the project's server app
               (`build_app`: its middleware, request handler, metrics and
               SQLite task store, as a role server serves them) around the
               bare server's executor, with its three frames: the app's own cost
  bare +3      the bare server sending three working status updates before
               its result: what a frame costs a2a-sdk at both ends
  SDK->replay  the bare client to a bare server sending the frames the role
               server sent `SDK->role` for one turn (recorded first): what
               the role server's frames cost a2a-sdk, without its work
  app+replay   the bare client to the project's server app sending those
               frames: the role server without its executor's own work (no
               conversation, model call, batching or trace span), but with
               its middleware, request handler and task store, which save
               and send those frames
  bare gRPC    the bare client to the bare server's executor over gRPC
               (a2a-sdk's `GrpcHandler`): the floor over that binding
  remote gRPC  `Session.spawn` of a child on a role server whose card
               prefers gRPC (`grpc_port`, as `serve --grpc-port` runs it),
               then `wait()`: the remote delegation over gRPC

All in this process and one run, so CPU time (process time, which counts the
servers' and the stores' threads too) covers both ends of every variant alike.
The variants are interleaved: each of `--rounds` rounds runs `-n` calls of
every variant in turn, so a change in the machine's load falls on all of
them. Prints wall and CPU per call (min and median over all calls) and each
variant's median against the bare SDK's from the same run, with the range of
that ratio over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import grpc.aio
import httpx
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.client.interceptors import ClientCallInterceptor
from a2a.helpers import new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
    a2a_pb2_grpc,
)
from a2a.utils.constants import TransportProtocol
from anyio.abc import TaskGroup
from benchkit import collector_line, machine_line, min_median, scratch
from starlette.applications import Starlette

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.extensions import (
    ExtensionsInterceptor,
    wanted_extensions,
)
from a2a_orchestrator.models import ScriptedModel
from a2a_orchestrator.observe.metrics import Metrics
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.server.app import build_app, open_task_store, run_role_server
from a2a_orchestrator.server.grpc_serving import add_grpc_interfaces
from a2a_orchestrator.server.serving import bind_socket, serve
from a2a_orchestrator.storage.store import Store

Call = Callable[[], Awaitable[None]]

EXTRA_FRAMES = 3
FRAMED = f"bare +{EXTRA_FRAMES}"
APP_REPLAY = "app+replay"


class InstantExecutor(AgentExecutor):
    """Completes at once; `working` status updates first, each a frame more."""

    def __init__(self, working: int = 0) -> None:
        self.working = working

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
        for _ in range(self.working):
            message = updater.new_agent_message([new_text_part("working")])
            await updater.update_status(TaskState.TASK_STATE_WORKING, message)
        await updater.add_artifact([new_text_part("ok")], name="result")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        return None


class Served:
    """An executor as `build_app` serves executors (it shuts down and runs
    alongside the server)."""

    async def shutdown(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        yield


class ServedInstantExecutor(Served, InstantExecutor):
    """The instant executor as `build_app` serves executors."""


class ReplayExecutor(InstantExecutor):
    """Sends again, to each new task, the frames a role server sent for one
    instant turn (`frames`, recorded by the bench before it times anything):
    a bare a2a-sdk server with the role server's frames and none of its work."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[StreamResponse] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        for frame in self.frames:
            if frame.HasField("task"):
                task = Task()
                task.CopyFrom(frame.task)
                task.id, task.context_id = task_id, context_id
                del task.history[:]
                if context.message is not None:
                    task.history.append(context.message)
                await event_queue.enqueue_event(task)
            elif frame.HasField("status_update"):
                update = TaskStatusUpdateEvent()
                update.CopyFrom(frame.status_update)
                update.task_id, update.context_id = task_id, context_id
                if update.status.HasField("message"):
                    message = update.status.message
                    message.task_id, message.context_id = task_id, context_id
                    message.message_id = uuid.uuid4().hex
                await event_queue.enqueue_event(update)
            elif frame.HasField("artifact_update"):
                artifact = TaskArtifactUpdateEvent()
                artifact.CopyFrom(frame.artifact_update)
                artifact.task_id, artifact.context_id = task_id, context_id
                artifact.artifact.artifact_id = uuid.uuid4().hex
                await event_queue.enqueue_event(artifact)


class ServedReplayExecutor(Served, ReplayExecutor):
    """The replay executor as `build_app` serves executors."""


def bare_card(url: str) -> AgentCard:
    return AgentCard(
        name="bare",
        description="bare a2a-sdk server",
        version="1",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        # A spec-complete card, so the SDK does not warn on every start.
        skills=[AgentSkill(id="echo", name="echo", description="answers ok", tags=["bench"])],
    )


def bare_app(url: str, working: int = 0, executor: AgentExecutor | None = None) -> Starlette:
    card = bare_card(url)
    handler = DefaultRequestHandler(
        agent_executor=executor or InstantExecutor(working),
        task_store=InMemoryTaskStore(),
        agent_card=card,
    )
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])


@contextlib.asynccontextmanager
async def bare_grpc() -> AsyncIterator[Call]:
    """A call of the bare client to the bare server's executor over gRPC, on
    a free loopback port (the server stops on leaving)."""
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    card = bare_card(f"http://127.0.0.1:{port}")
    # Listed first, as a role server's card lists it (the client speaks only gRPC).
    add_grpc_interfaces(card, f"127.0.0.1:{port}")
    handler = DefaultRequestHandler(
        agent_executor=InstantExecutor(), task_store=InMemoryTaskStore(), agent_card=card
    )
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    await server.start()
    config = ClientConfig(
        streaming=True,
        supported_protocol_bindings=[TransportProtocol.GRPC],
        grpc_channel_factory=grpc.aio.insecure_channel,
    )
    client = ClientFactory(config).create(card)

    async def call() -> None:
        request = SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
        async for _ in client.send_message(request):
            pass

    try:
        yield call
    finally:
        await client.close()
        await server.stop(None)


async def timed(count: int, call: Call, wall: list[float], cpu: list[float]) -> None:
    for _ in range(count):
        started, used = time.perf_counter(), time.process_time()
        await call()
        cpu.append(time.process_time() - used)
        wall.append(time.perf_counter() - started)


async def started(tg: TaskGroup, app_for: Callable[[str], Starlette]) -> str:
    """The URL of `app_for(url)`, served on a free loopback port."""
    sock = bind_socket("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    await tg.start(serve, app_for(url), sock)
    return url


async def sdk_client(http: httpx.AsyncClient, url: str, *, batched: bool = False) -> Client:
    """A bare a2a-sdk client of the agent at `url`; `batched`: activating the
    extensions its card declares that the orchestrator reads, as the
    orchestrator's own client does (so it gets the frames a remote child gets)."""
    card = await A2ACardResolver(http, url).get_agent_card()
    interceptors: list[ClientCallInterceptor] = []
    if batched:
        interceptors.append(ExtensionsInterceptor(wanted_extensions(card)))
    return ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card, interceptors)


async def sdk_call(http: httpx.AsyncClient, url: str, *, batched: bool = False) -> Call:
    """One streamed message to the agent at `url`, through a bare a2a-sdk client."""
    client = await sdk_client(http, url, batched=batched)

    async def call() -> None:
        request = SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
        async for _ in client.send_message(request):
            pass

    return call


async def main(rounds: int, n: int) -> None:
    work = scratch("a2a-bench-")
    model = ScriptedModel(lambda messages: {"text": "ok"})
    replay = ReplayExecutor()
    served_replay = ServedReplayExecutor()
    async with anyio.create_task_group() as tg, httpx.AsyncClient(timeout=30) as http:
        bare_url = await started(tg, bare_app)
        app_url = await started(
            tg,
            lambda url: build_app(
                ServedInstantExecutor(),
                bare_card(url),
                open_task_store(str(work / "app.db")),
                metrics=Metrics(),  # as `run_role_server` serves by default
            ),
        )
        framed_url = await started(tg, lambda url: bare_app(url, working=EXTRA_FRAMES))
        replay_url = await started(tg, lambda url: bare_app(url, executor=replay))
        app_replay_url = await started(
            tg,
            lambda url: build_app(
                served_replay,
                bare_card(url),
                open_task_store(str(work / "replay.db")),
                metrics=Metrics(),
            ),
        )

        async def in_process() -> None:
            async for _ in model.stream([{"role": "user", "content": "hi"}], []):
                pass

        async with (
            run_role_server(find_role("coder"), model, work, db=str(work / "role.db")) as server,
            run_role_server(
                find_role("coder"), model, work, db=str(work / "grpc.db"), grpc_port=0
            ) as grpc_server,
            bare_grpc() as bare_grpc_call,
        ):
            # The frames the bare client gets from the role server, for the replay.
            role_client = await sdk_client(http, server.url, batched=True)
            request = SendMessageRequest(message=new_text_message("hi", role=Role.ROLE_USER))
            replay.frames = [frame async for frame in role_client.send_message(request)]
            served_replay.frames = replay.frames
            network = Network.of(
                AgentSpec(name="remote", role="coder", url=server.url),
                AgentSpec(name="local", role="coder"),
                # Any A2A agent can be a child: the bare server too.
                AgentSpec(name="bare", role="coder", url=bare_url),
                AgentSpec(name="remote-grpc", role="coder", url=grpc_server.url),
            )
            async with Session(
                Store(work / "o.db"), workdir=work, network=network, models=lambda name: model
            ) as session:

                def delegate(agent: str) -> Call:
                    async def call() -> None:
                        handle = await session.spawn(ChildConfig(role=agent, prompt="hi"))
                        await handle.wait()

                    return call

                variants: dict[str, Call] = {
                    "bare SDK": await sdk_call(http, bare_url),
                    "in-process": in_process,
                    "local": delegate("local"),
                    "remote": delegate("remote"),
                    "SDK->role": await sdk_call(http, server.url, batched=True),
                    "Session->SDK": delegate("bare"),
                    "SDK->app": await sdk_call(http, app_url),
                    FRAMED: await sdk_call(http, framed_url),
                    "SDK->replay": await sdk_call(http, replay_url),
                    APP_REPLAY: await sdk_call(http, app_replay_url),
                    "bare gRPC": bare_grpc_call,
                    "remote gRPC": delegate("remote-grpc"),
                }
                for call in variants.values():  # warm up connections and caches
                    for _ in range(min(10, n)):
                        await call()
                wall: dict[str, list[float]] = {name: [] for name in variants}
                cpu: dict[str, list[float]] = {name: [] for name in variants}
                # Each round's median wall and CPU per variant, for the ratios' spread.
                per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
                for _ in range(rounds):
                    for name, call in variants.items():
                        before = len(wall[name])
                        await timed(n, call, wall[name], cpu[name])
                        per_round[name].append(
                            (
                                statistics.median(wall[name][before:]),
                                statistics.median(cpu[name][before:]),
                            )
                        )
        tg.cancel_scope.cancel()

    print(f"delegation: {rounds} rounds x {n} calls per variant, instant model, 127.0.0.1")
    print(f"machine: {machine_line()}")
    print(f"collector: {collector_line()}")
    print(
        f"  {'variant':<13} {'wall min':>9} {'median':>9} {'cpu min':>9} {'median':>9}"
        "   vs bare SDK, medians: wall (round range)  cpu (round range)"
    )
    floor_wall, floor_cpu = statistics.median(wall["bare SDK"]), statistics.median(cpu["bare SDK"])
    for name in variants:
        wall_min, wall_median = min_median(wall[name])
        cpu_min, cpu_median = min_median(cpu[name])
        pairs = zip(per_round[name], per_round["bare SDK"], strict=True)
        ratios = [(w / fw, c / fc) for (w, c), (fw, fc) in pairs]
        wall_ratios, cpu_ratios = [r[0] for r in ratios], [r[1] for r in ratios]
        print(
            f"  {name:<13} {wall_min * 1000:6.2f} ms {wall_median * 1000:6.2f} ms"
            f" {cpu_min * 1000:6.2f} ms {cpu_median * 1000:6.2f} ms"
            f"   {wall_median / floor_wall:5.2f}x ({min(wall_ratios):.2f}-{max(wall_ratios):.2f})"
            f"  {cpu_median / floor_cpu:5.2f}x ({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f})"
        )

    def median_of(samples: dict[str, list[float]], name: str) -> float:
        return statistics.median(samples[name])

    print(
        "remote delegation / bare SDK (goal <= 1.5x):"
        f" wall {median_of(wall, 'remote') / floor_wall:.2f}x,"
        f" cpu {median_of(cpu, 'remote') / floor_cpu:.2f}x"
    )
    role_added = median_of(cpu, "SDK->role") - floor_cpu
    frames_added = median_of(cpu, "SDK->replay") - floor_cpu
    app_added = median_of(cpu, APP_REPLAY) - median_of(cpu, "SDK->replay")
    executor_added = median_of(cpu, "SDK->role") - median_of(cpu, APP_REPLAY)
    orchestrator_added = median_of(cpu, "Session->SDK") - floor_cpu
    print(
        f"added to the floor (cpu medians): by the role server {role_added * 1000:.2f} ms"
        f" (its frames {frames_added * 1000:.2f} ms, its app and task store on them"
        f" {app_added * 1000:.2f} ms, its executor's own work {executor_added * 1000:.2f} ms),"
        f" by the orchestrator's side {orchestrator_added * 1000:.2f} ms"
    )
    # What the remote figure would be if the role executor's own work cost
    # nothing: a2a-sdk's handler and client, the frames, both durable stores.
    without = median_of(cpu, APP_REPLAY) + orchestrator_added
    print(
        f"remote without the role executor's own work, ({APP_REPLAY} + orchestrator's side)"
        f" / bare SDK (cpu medians): {without / floor_cpu:.2f}x"
    )
    frame = (median_of(cpu, FRAMED) - floor_cpu) / EXTRA_FRAMES
    print(
        f"a frame costs a2a-sdk, both ends (cpu medians, ({FRAMED} - bare SDK) / {EXTRA_FRAMES}):"
        f" {frame * 1000:.2f} ms"
    )
    print(
        "over gRPC, remote / bare gRPC (cpu medians):"
        f" {median_of(cpu, 'remote gRPC') / median_of(cpu, 'bare gRPC'):.2f}x;"
        f" remote gRPC / bare SDK (JSON-RPC): {median_of(cpu, 'remote gRPC') / floor_cpu:.2f}x"
    )
    print(
        "local child overhead, local - in-process (goal <= 1 ms):"
        f" wall {(median_of(wall, 'local') - median_of(wall, 'in-process')) * 1000:.2f} ms,"
        f" cpu {(median_of(cpu, 'local') - median_of(cpu, 'in-process')) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds, each running every variant")
    parser.add_argument("-n", type=int, default=40, help="calls per variant per round")
    parser.add_argument("--quick", action="store_true", help="5 rounds of 2 calls: a smoke test")
    args = parser.parse_args()
    anyio.run(main, *((5, 2) if args.quick else (max(5, args.rounds), args.n)))
