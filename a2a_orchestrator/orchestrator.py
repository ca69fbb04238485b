"""The orchestrator as an A2A server: the whole network as one agent.

Two skills. `pipeline` (the default) runs architect -> coder -> reviewer on
the message's text; `delegate` hands the text to a parent agent (role
`orchestrator`) that orchestrates through the control-plane tools. Choose
with message metadata `{"a2a_orchestrator.mode": "pipeline" | "delegate"}`.

One A2A context is one session: a follow-up in the same context continues
the parent agent's conversation. The orchestrator's own progress travels as
child events (the same wire mapping as a role server, so it can itself be a
child of another orchestrator), and every child's event as a WORKING status
update with `kind = child_event` and a data part naming the child. The HTTP
control API (`api.py`) is served beside the A2A endpoint.

Sessions are held open by a task group the server's lifespan owns, so
children outlive the request that spawned them; a session closes when no
request uses it and none of its children runs. When the server stops, its
running A2A tasks fail with reason `lost` and the children are left as they
are: remote ones keep working, and `resume` (or the next request of a
delegate session) picks them up.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from a2a.helpers import get_message_text, new_data_part, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import (
    AgentCard,
    AgentSkill,
    Task,
    TaskState,
    TaskStatus,
)
from anyio.abc import TaskGroup
from anyio.abc import TaskStatus as StartedStatus
from google.protobuf.json_format import MessageToDict

from .access import Access
from .api import OWNER_KEY, api_routes
from .control import ControlPlane
from .events import ChildEvent, Done, Failed, MessageDelta, Started, event_to_dict
from .hooks import Hooks
from .models.base import Model
from .network import Network
from .parent import ParentAgent
from .pipeline import Brief, Pipeline, PipelineError, TaskSpec
from .policy import SpawnPolicy
from .reactions import Reaction, Reactions
from .server import (
    RunningServer,
    agent_card,
    build_app,
    open_task_store,
    public_url_for,
    run_server,
)
from .serving import bind_socket
from .session import RelayedEvent, Session
from .store import Store
from .tools import Sandbox
from .tools.sandbox import UNSANDBOXED_NOTE, store_paths
from .transports.local import check_sandbox
from .usage import UsageLog, usage_path
from .view import describe_event
from .wire import EVENT_KEY, publish

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["MODE_KEY", "OrchestratorExecutor", "build_orchestrator_card", "run_orchestrator_server"]

logger = logging.getLogger(__name__)

MODE_KEY = "a2a_orchestrator.mode"
MODES = ("pipeline", "delegate")


def build_orchestrator_card(
    url: str, *, auth: bool = False, unsandboxed: bool = False, access: Access | None = None
) -> AgentCard:
    """The orchestrator's card; `unsandboxed`: its in-process agents run
    commands without a sandbox (the operator opted out), and it says so.
    `access`: the credentials it accepts (`auth` alone: a bearer token)."""
    return agent_card(
        name="orchestrator",
        description="An A2A agent network as one agent: architect, coder and reviewer "
        "role agents (local or remote) orchestrated over A2A."
        + (f" (in-process agents: {UNSANDBOXED_NOTE})" if unsandboxed else ""),
        url=url,
        auth=auth,
        access=access,
        skills=[
            AgentSkill(
                id="pipeline",
                name="architect, coder, reviewer",
                description="Designs, implements and reviews a software task in the work "
                "directory; ends with TASK_DONE, TASK_FAILED or TASK_SKIPPED.",
                tags=["software", "pipeline"],
                examples=["Add a --verbose flag to the CLI and test it"],
            ),
            AgentSkill(
                id="delegate",
                name="general delegation",
                description="A parent agent splits the task among the network's agents. "
                f"Send metadata {{{MODE_KEY!r}: 'delegate'}}.",
                tags=["delegation"],
            ),
        ],
    )


class _Host:
    """Holds sessions open in a task group owned by the server's lifespan.

    A session is opened once (concurrent requests for it wait for that one
    opening), counted per request using it, and closed when the last one
    lets it go and it has nothing running.
    """

    def __init__(
        self, open_session: Callable[[str], Session], closed: Callable[[str], None]
    ) -> None:
        self._open = open_session
        self._closed = closed
        self._tg: TaskGroup | None = None
        self.sessions: dict[str, Session] = {}
        self._release: dict[str, anyio.Event] = {}
        self._users: dict[str, int] = {}
        self._lock = anyio.Lock()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    async def acquire(self, session_id: str) -> Session:
        async with self._lock:
            session = self.sessions.get(session_id)
            if session is None:
                if self._tg is None:
                    raise RuntimeError("the orchestrator is not running")
                session = await self._tg.start(self._hold, session_id)
            self._users[session_id] = self._users.get(session_id, 0) + 1
            return session

    async def _hold(
        self, session_id: str, *, task_status: StartedStatus[Session] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        release = self._release[session_id] = anyio.Event()
        try:
            async with self._open(session_id) as session:
                self.sessions[session_id] = session
                task_status.started(session)
                await release.wait()
        finally:
            self.sessions.pop(session_id, None)
            self._release.pop(session_id, None)
            self._closed(session_id)

    def release(self, session_id: str) -> None:
        """One request is done with the session; it closes once no request
        uses it and no child of it is running (maybe later, when they end)."""
        users = self._users.get(session_id, 1) - 1
        if users > 0:
            self._users[session_id] = users
            return
        self._users.pop(session_id, None)
        session = self.sessions.get(session_id)
        if session is None:
            return

        def close_when_idle(_handle: object = None) -> None:
            if session_id in self._users:
                return  # a new request came: it releases the session again
            if any(h.running for h in session.children.values()):
                return
            remove()
            event = self._release.get(session_id)
            if event is not None:
                event.set()

        remove = session.add_settle_listener(close_when_idle)
        close_when_idle()


class OrchestratorExecutor(AgentExecutor):
    """Runs the pipeline or a parent agent for each A2A task."""

    def __init__(
        self,
        store: Store,
        *,
        workdir: Path,
        network: Network,
        models: Callable[[str], Model],
        parent_model: str = "default",
        hooks: Hooks | None = None,
        reactions: Sequence[Reaction] = (),
        max_concurrent: int = 4,
        lost_after: float = 30.0,
        sandbox: Sandbox | None = None,
        policy: SpawnPolicy | None = None,
    ) -> None:
        """`policy`: the spawn policy of every session's children."""
        self.store = store
        self.reactions = list(reactions)
        self.network = network
        self.models = models
        self.parent_model = parent_model
        self.hooks = hooks or Hooks()
        self.max_concurrent = max_concurrent
        self.planes: dict[str, ControlPlane] = {}
        self._runs: dict[str, Pipeline | ParentAgent] = {}
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._parents: dict[str, ParentAgent] = {}
        self._parent_lock = anyio.Lock()
        self._reacting: dict[str, Reactions] = {}
        self.host = _Host(
            lambda session_id: Session(
                store,
                workdir=workdir,
                network=network,
                models=models,
                session_id=session_id,
                parent_model=parent_model,
                lost_after=lost_after,
                sandbox=sandbox,
                policy=policy,
            ),
            self._session_closed,
        )

    def running(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.host.running()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        task_id = context.task_id or ""
        context_id = task.context_id if task is not None else (context.context_id or "")
        updater = TaskUpdater(event_queue, task_id, context_id)
        if task is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message] if context.message else [],
                )
            )
        text = get_message_text(context.message) if context.message else ""
        metadata = (
            MessageToDict(context.message.metadata)
            if context.message is not None and context.message.HasField("metadata")
            else {}
        )
        mode = str(metadata.get(MODE_KEY, "pipeline"))

        async def emit(event: ChildEvent) -> None:
            await publish(updater, event)

        if mode not in MODES:
            await emit(Started(role="orchestrator"))
            await emit(Failed(reason="error", message=f"unknown mode {mode!r}; use {MODES}"))
            return
        if not await self._owns_session(context_id, context):
            await emit(Started(role="orchestrator"))
            await emit(
                Failed(
                    reason="error",
                    message=f"context {context_id} cannot be used by this caller; "
                    "send the task in a new context id",
                )
            )
            return
        session = await self.host.acquire(context_id)
        try:
            with anyio.CancelScope() as scope:
                self._scopes[task_id] = scope
                async with session.relay() as relay, anyio.create_task_group() as tg:
                    tg.start_soon(self._forward, relay, updater)
                    try:
                        if mode == "pipeline":
                            await self._pipeline(session, task_id, text, emit)
                        else:
                            await self._delegate(session, task_id, text, emit)
                    except Exception as exc:  # contained: the client gets a failed task
                        logger.exception("orchestrator task %s failed", task_id)
                        await emit(Failed(reason="error", message=f"{type(exc).__name__}: {exc}"))
                    finally:
                        tg.cancel_scope.cancel()
            if scope.cancelled_caught:
                # The server is stopping: the children are left as they are
                # (remote ones keep working, local ones resume with the session).
                await emit(
                    Failed(
                        reason="lost",
                        message="the orchestrator stopped; resume the session to continue",
                    )
                )
        finally:
            self._runs.pop(task_id, None)
            self._scopes.pop(task_id, None)
            self.host.release(context_id)

    async def _owns_session(self, session_id: str, context: RequestContext) -> bool:
        """Whether the request's caller owns the session (it does a new one).

        The handler already refuses a context in which another caller has
        A2A tasks; a session opened otherwise (`run --session`) has its
        owner too, recorded in the session's metadata.
        """
        call = context.call_context
        owner = call.user.user_name if call is not None else ""
        await self.store.create_session(session_id, metadata={OWNER_KEY: owner})
        record = await self.store.get_session(session_id)
        return record is not None and record["metadata"].get(OWNER_KEY, "") == owner

    async def _forward(
        self, relay: anyio.abc.ObjectReceiveStream[RelayedEvent], updater: TaskUpdater
    ) -> None:
        async for relayed in relay:
            if isinstance(relayed.event, MessageDelta):
                continue  # the whole message follows; deltas would flood the history
            data = {
                "child_id": relayed.child_id,
                "parent_id": relayed.parent_id,
                "agent": relayed.agent,
                "role": relayed.role,
                "transport": relayed.transport,
                "event": event_to_dict(relayed.event),
            }
            line = f"[{relayed.agent} {relayed.child_id[:6]}] {describe_event(relayed.event)}"
            message = updater.new_agent_message(
                [new_text_part(line), new_data_part(data)],
                metadata={EVENT_KEY: "child_event"},
            )
            await updater.update_status(TaskState.TASK_STATE_WORKING, message)

    async def _pipeline(
        self, session: Session, task_id: str, text: str, emit: Callable[[ChildEvent], Any]
    ) -> None:
        plane = self.planes.get(session.id)
        if plane is None:
            plane = self.planes[session.id] = ControlPlane(session, hooks=self.hooks)
        self._react(plane)
        # A new pipeline run does not resume an earlier, interrupted one's
        # passes (`a2a-orchestrator resume` does, when asked).
        title = text.strip().splitlines()[0][:80] if text.strip() else "task"
        brief = Brief(task=TaskSpec(id=task_id[:8], title=title, description=text))
        pipeline = Pipeline(session, brief)
        self._runs[task_id] = pipeline
        await emit(Started(role="orchestrator", model="pipeline"))
        try:
            result = await pipeline.run()
        except PipelineError as exc:
            await emit(
                Failed(reason="aborted" if "cancelled" in str(exc) else "error", message=str(exc))
            )
            return
        summary = (
            f"{result.signal}\n\nArtifacts: {result.artifact_dir}\n\n"
            f"# Review\n\n{result.reviewer_output}\n\n# Implementation\n\n{result.coder_output}"
        )
        await emit(Done(text=summary, usage=result.usage))

    async def _delegate(
        self, session: Session, task_id: str, text: str, emit: Callable[[ChildEvent], Any]
    ) -> None:
        # One parent agent per session while the session is open; a later
        # request restores it from the store.
        async with self._parent_lock:
            parent = self._parents.get(session.id)
            if parent is None:
                parent = await ParentAgent.restore(
                    session,
                    self.models(self.parent_model),
                    hooks=self.hooks,
                    max_concurrent=self.max_concurrent,
                )
                self._parents[session.id] = parent
        self.planes[session.id] = parent.plane
        self._react(parent.plane)
        await session.recover()
        self._runs[task_id] = parent
        await parent.run(text, emit)

    def _session_closed(self, session_id: str) -> None:
        """Forget what belonged to a session the host closed."""
        self.planes.pop(session_id, None)
        reactions = self._reacting.pop(session_id, None)
        if reactions is not None:
            reactions.close()
        parent = self._parents.pop(session_id, None)
        if parent is not None:
            parent.close()

    def _react(self, plane: ControlPlane) -> None:
        """Attach the configured reactions to a session's root parent (once)."""
        if self.reactions and plane.session.id not in self._reacting:
            self._reacting[plane.session.id] = Reactions(plane, self.reactions)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        run = self._runs.get(context.task_id or "")
        if isinstance(run, Pipeline):
            await run.cancel()
        elif isinstance(run, ParentAgent):
            await run.plane.stop_children()
            run.conversation.abort("aborted", "canceled by request")

    async def shutdown(self) -> None:
        """End the running A2A tasks as failed (reason `lost`); the children
        are not stopped: a later session resumes or re-attaches them."""
        for scope in list(self._scopes.values()):
            scope.cancel()


@contextlib.asynccontextmanager
async def run_orchestrator_server(
    *,
    store_path: Path,
    workdir: Path,
    network: Network,
    models: Callable[[str], Model],
    db: str,
    host: str = "127.0.0.1",
    port: int = 0,
    token: str | None = None,
    access: Access | None = None,
    public_url: str | None = None,
    hooks: Hooks | None = None,
    reactions: Sequence[Reaction] = (),
    sandbox: Sandbox | None = None,
    policy: SpawnPolicy | None = None,
    metrics: bool = True,
    metrics_public: bool = False,
    install_signal_handlers: bool = False,
) -> AsyncIterator[RunningServer]:
    """Serve the orchestrator (A2A + the HTTP control API) until the block exits.

    `sandbox` is where in-process agents run commands (default:
    `Sandbox.from_env()`). Raises `ConfigError` before binding when one of
    them lists `run_command` and the sandbox cannot be had here.

    `access` says who may call (`token` alone: one caller with that token);
    each caller sees only its own tasks and sessions, on the A2A endpoint
    and the HTTP API alike.

    `metrics`: serve Prometheus metrics at `/metrics` (behind the callers'
    auth unless `metrics_public`), with the sessions' running children.
    """
    sandbox = sandbox if sandbox is not None else Sandbox.from_env()
    if "://" not in db:
        sandbox = sandbox.hiding(*store_paths(db))
    check_sandbox(network.agents.values(), sandbox)
    unsandboxed = not sandbox.enabled and any(not s.remote for s in network.agents.values())
    if unsandboxed:
        logger.warning("orchestrator: in-process agents: %s (sandbox turned off)", UNSANDBOXED_NOTE)
    sock = bind_socket(host, port)
    url = public_url_for(host, sock.getsockname()[1], public_url)
    store = Store(store_path)
    executor = OrchestratorExecutor(
        store,
        workdir=workdir,
        network=network,
        models=models,
        hooks=hooks,
        reactions=reactions,
        sandbox=sandbox,
        policy=policy,
    )
    if access is None and token:
        access = Access(token=token)
    app = build_app(
        executor,
        build_orchestrator_card(url, unsandboxed=unsandboxed, access=access),
        open_task_store(db),
        access=access,
        usage=UsageLog(usage_path(db, "orchestrator", workdir)) if access is not None else None,
        extra_routes=api_routes(store, lambda: executor.planes),
        metrics=_server_metrics(executor) if metrics else None,
        metrics_public=metrics_public,
    )
    try:
        async with run_server(
            app, sock, url, executor, install_signal_handlers=install_signal_handlers
        ) as server:
            yield server
    finally:
        store.close()


def _server_metrics(executor: OrchestratorExecutor) -> Metrics:
    # Imported here: prometheus-client is loaded only by a server that counts.
    from .metrics import Metrics, running_children

    return Metrics(children=lambda: running_children(executor.host.sessions.values()))
