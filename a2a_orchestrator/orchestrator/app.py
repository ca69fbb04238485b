"""The orchestrator as an A2A server: the whole network as one agent.

Two skills. `pipeline` (the default) runs architect -> coder -> reviewer on
the message's text; `delegate` hands the text to a parent agent (role
`orchestrator`) that orchestrates through the control-plane tools. Choose
with message metadata `{"a2a_orchestrator.mode": "pipeline" | "delegate"}`.

One A2A context is one session: a follow-up in the same context continues
the parent agent's conversation. A pipeline pass that asks (`ask_parent`)
puts its question to the caller: the task goes INPUT_REQUIRED with the
question and who asks (a data part), the pipeline waits in the background,
and the caller's next message on that task is the answer (`questions.py`:
the web view may answer it too; the first answer counts). In `delegate`
mode the parent agent at the root asks the same way: its turn ends, the task
goes INPUT_REQUIRED, and its question waits in `session.questions` too; a
web view's answer goes to the task as the caller's next message would
(`_answer_from_view`), so the parent's next turn gets it as input.

The orchestrator's own progress travels as child events (the same wire
mapping as a role server, so it can itself be a child of another
orchestrator), and every child's event as a WORKING status update with
`kind = child_event` and a data part naming the child. The HTTP control API
(`api.py`) is served beside the A2A endpoint.

Sessions are held open by a task group the server's lifespan owns, so
children outlive the request that spawned them; a session closes when no
request uses it and none of its children runs. When the server stops, its
running A2A tasks fail with reason `lost` and the children are left as they
are: remote ones keep working, and `resume` (or the next request of a
delegate session) picks them up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from a2a.helpers import get_message_text, new_data_part, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import RequestHandler
from a2a.server.tasks import TaskUpdater
from a2a.types import (
    AgentCard,
    AgentSkill,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)
from anyio.abc import TaskGroup
from anyio.abc import TaskStatus as StartedStatus
from starlette.middleware import Middleware

from ..control.parent import ParentAgent
from ..control.pipeline import Brief, Pipeline, PipelineCancelled, PipelineError, TaskSpec
from ..control.plane import ControlPlane
from ..control.reactions import Reaction, Reactions
from ..delegation.hooks import Hooks
from ..delegation.network import Network
from ..delegation.policy import SpawnPolicy
from ..delegation.questions import Question
from ..delegation.session import RelayedEvent, Session
from ..delegation.transports.local import check_sandbox
from ..delegation.transports.push_receiver import PUSH_PREFIX, PushReceiver
from ..delegation.transports.remote import RemoteDelegate
from ..models.base import Model, Usage
from ..observe import tracing
from ..protocol.cards import CardOptions
from ..protocol.wire import EVENT_KEY, event_to_wire, metadata_of, publish
from ..runtime.budgets import PriceTable, Spend
from ..runtime.events import ChildEvent, Done, Failed, InputRequired, MessageDelta, Started
from ..runtime.render import describe_event
from ..server.app import (
    RunningServer,
    agent_card,
    bind_grpc,
    build_app,
    open_task_store,
    public_url_for,
    run_server,
)
from ..server.auth.access import Access
from ..server.auth.usage import UsageLog, usage_path
from ..server.requests import turn_request
from ..server.serving import bind_socket
from ..server.settings import settings_from
from ..server.streams import StreamLimits, StreamSlots
from ..storage.opening import open_store
from ..storage.session_leases import Leases, SessionOwnedElsewhere
from ..storage.store import Store
from ..storage.store_pg import PgStore
from ..tools import Sandbox
from ..tools.sandbox import UNSANDBOXED_NOTE, store_paths
from .api import OWNER_KEY, api_routes
from .forwarding import SessionForwarding
from .settings import OrchestratorSettings
from .ui import ui_routes
from .ui_auth import BrowserLogin

if TYPE_CHECKING:
    from a2a.server.cluster import VersionedTaskStore
    from a2a.server.tasks import TaskStore

    from ..observe.metrics import Metrics
    from ..server.auth.quotas import Quotas

__all__ = ["MODE_KEY", "OrchestratorExecutor", "build_orchestrator_card", "run_orchestrator_server"]

logger = logging.getLogger(__name__)

MODE_KEY = "a2aOrchestrator.mode"
ANSWERS_KEY = "a2aOrchestrator.answers"
"""Metadata of the message that brings a web view's answer to the root
parent's question (its id) to the task that asked."""
MODES = ("pipeline", "delegate")
_UNFOLLOWED = 1000
"""Endings of runs answered from the web view kept for their task's next message."""
_TITLE_CHARS = 2000
"""A session's title is its task's text, whitespace folded, at most this long."""


def build_orchestrator_card(
    url: str,
    *,
    auth: bool = False,
    unsandboxed: bool = False,
    access: Access | None = None,
    legacy: bool = True,
) -> AgentCard:
    """The orchestrator's card; `unsandboxed`: its in-process agents run
    commands without a sandbox (the operator opted out), and it says so.
    `access`: the credentials it accepts (`auth` alone: a bearer token).
    `legacy`: also list the A2A 0.3 endpoints (see `server.agent_card`)."""
    return agent_card(
        name="orchestrator",
        description="An A2A agent network as one agent: architect, coder and reviewer "
        "role agents (local or remote) orchestrated over A2A."
        + (f" (in-process agents: {UNSANDBOXED_NOTE})" if unsandboxed else ""),
        url=url,
        auth=auth,
        access=access,
        legacy=legacy,
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


class Run(Protocol):
    """What an A2A task of the orchestrator runs: a pipeline or a parent
    agent's turn, cancelled alike."""

    async def cancel(self) -> None:
        """Stop the run: its children are stopped, it ends as aborted."""
        ...


@dataclass(eq=False)
class _TaskRun:
    """One A2A task running in a session."""

    task_id: str
    scope: anyio.CancelScope
    """Cancelled when the server stops (the task ends as `lost`): the scope
    of the request following the task now."""
    run: Run | None = None
    """What it runs, once it started one (cancel goes there)."""
    ended: anyio.Event = field(default_factory=anyio.Event)
    """A pipeline run in the background has ended (`ending` says how)."""
    ending: ChildEvent | None = None
    asks: Callable[[Question], bool] | None = None
    """Which of the session's questions are this run's (a pipeline's, in the
    background while its task waits for the answer)."""
    following: bool = True
    """A request follows the task now (one, or none while it is INPUT_REQUIRED)."""
    question: str = ""
    """The id of the root parent agent's question its task waits on (delegate
    mode), while the answer has not gone to the parent."""
    answer: str | None = None
    """The web view's answer to `question`, on its way to the task."""
    waiter: anyio.CancelScope | None = None
    """The scope `question` waits in (cancelling the task withdraws it)."""


@dataclass(eq=False)
class _SessionRecord:
    """Everything the orchestrator holds for one open session."""

    release: anyio.Event = field(default_factory=anyio.Event)
    """Set to close the session (no request uses it, nothing of it runs)."""
    session: Session | None = None
    """The open session (None while it is being opened)."""
    users: int = 0
    """Requests using the session now."""
    plane: ControlPlane | None = None
    """Its root control plane (the HTTP control API's view of it)."""
    parent: ParentAgent | None = None
    """Its parent agent (delegate mode), kept while the session is open."""
    reactions: Reactions | None = None
    """The configured reactions, attached to its root parent once."""
    reported: Spend | None = None
    """The session's total when one of its tasks last reported its spend (or
    when the first started): each turn end reports what the session spent
    since (`OrchestratorExecutor._reported`), so tasks at once, or a turn
    that asked and the one that answers, count each call once between them."""
    reporting: anyio.Lock = field(default_factory=anyio.Lock)
    """Held while a report reads the total and moves `reported` on."""
    tasks: dict[str, _TaskRun] = field(default_factory=dict)
    """A2A task id -> the task running in it."""
    lost: bool = False
    """Its lease ran out here (another replica may run it now)."""

    def close(self) -> None:
        """Let go of what belonged to the session (it closed)."""
        self.plane = None
        if self.reactions is not None:
            self.reactions.close()
            self.reactions = None
        if self.parent is not None:
            self.parent.close()
            self.parent = None


class _Host:
    """Holds sessions open in a task group owned by the server's lifespan.

    A session is opened once (concurrent requests for it wait for that one
    opening), counted per request using it, and closed when the last one
    lets it go and it has nothing running. Each open session has one
    `_SessionRecord`, dropped (and closed) when the session closes.
    """

    def __init__(self, open_session: Callable[[str], Session]) -> None:
        self._open = open_session
        self._tg: TaskGroup | None = None
        self.records: dict[str, _SessionRecord] = {}
        self._lock = anyio.Lock()
        self.leases: Leases | None = None
        """Replicas on a shared store: a session is opened only under its lease."""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            if self.leases is not None:
                tg.start_soon(self.leases.run, name="session leases")
            try:
                yield
            finally:
                self._tg = None
                tg.cancel_scope.cancel()

    async def acquire(self, session_id: str) -> _SessionRecord:
        async with self._lock:
            record = self.records.get(session_id)
            if record is None or record.session is None:
                if self._tg is None:
                    raise RuntimeError("the orchestrator is not running")
                record = await self._tg.start(self._hold, session_id)
            record.users += 1
            return record

    async def _hold(
        self,
        session_id: str,
        *,
        task_status: StartedStatus[_SessionRecord] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        record = _SessionRecord()
        if self.leases is not None:
            await self.leases.claim(session_id)  # SessionOwnedElsewhere: not opened here
        try:
            async with self._open(session_id) as session:
                record.session = session
                self.records[session_id] = record
                task_status.started(record)
                await record.release.wait()
        finally:
            if self.records.get(session_id) is record:
                del self.records[session_id]
            record.close()
            if self.leases is not None:
                # Closed idle: nothing to take over. Closed with work left
                # (the server stops, or the lease ran out): hand it on now.
                hand_off = record.lost or not record.release.is_set()
                await self.leases.release(session_id, hand_off=hand_off)

    def lose(self, session_id: str) -> None:
        """Stop running a session whose lease ran out here: its A2A tasks end
        as `lost` and it closes (its new owner recovers its children)."""
        record = self.records.get(session_id)
        if record is None:
            return
        record.lost = True
        for task in list(record.tasks.values()):
            task.scope.cancel()
        record.release.set()

    def hold(self, record: _SessionRecord) -> None:
        """One more user of an open session (a run that outlives its request);
        `release` it as a request's."""
        record.users += 1

    def release(self, record: _SessionRecord) -> None:
        """One request is done with the session; it closes once no request
        uses it and no child of it is running (maybe later, when they end)."""
        record.users = max(record.users - 1, 0)
        session = record.session
        if record.users > 0 or session is None:
            return

        def close_when_idle(_handle: object = None) -> None:
            if record.users > 0:
                return  # a new request came: it releases the session again
            if any(h.running for h in session.children.values()):
                return
            remove()
            record.release.set()

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
        sandbox: Sandbox | None = None,
        policy: SpawnPolicy | None = None,
        remote: Callable[[], RemoteDelegate] = RemoteDelegate,
        model_names: Collection[str] | None = None,
    ) -> None:
        """`policy`: the spawn policy of every session's children; `remote`
        makes each session's A2A transport (e.g. with the webhook endpoint
        children of agents in push mode receive their updates at);
        `model_names`: what a parent or pipeline may choose for a child
        besides `default`, `mini` and the role's `models` (None: `$A2A_MODELS`)."""
        self.store = store
        self.model_names = model_names
        self.reactions = list(reactions)
        self.network = network
        self.models = models
        self.parent_model = parent_model
        self.hooks = hooks or Hooks()
        self.max_concurrent = max_concurrent
        self._parent_lock = anyio.Lock()
        self._unfollowed: dict[str, ChildEvent] = {}
        """Task id -> how its run ended while no request followed the task."""
        self.handler: RequestHandler | None = None
        """The A2A request handler that drives it (`served_by`): a web view's
        answer to the root parent's question goes to its task through it."""
        # The operator's price table (`A2A_PRICES`), read once at start like
        # the rest of the configuration: not again for each session opened.
        prices = PriceTable.from_env()
        self.host = _Host(
            lambda session_id: Session(
                store,
                workdir=workdir,
                network=network,
                models=models,
                session_id=session_id,
                parent_model=parent_model,
                remote=remote,
                sandbox=sandbox,
                policy=policy,
                prices=prices,
            ),
        )

    @property
    def planes(self) -> dict[str, ControlPlane]:
        """The open sessions' root control planes, by session id."""
        return {
            session_id: record.plane
            for session_id, record in self.host.records.items()
            if record.plane is not None
        }

    @property
    def sessions(self) -> dict[str, Session]:
        """The sessions this server holds open, by id."""
        return {
            session_id: record.session
            for session_id, record in self.host.records.items()
            if record.session is not None
        }

    def running(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.host.running()

    def served_by(
        self, handler: RequestHandler, store: TaskStore | VersionedTaskStore, quotas: Quotas | None
    ) -> TaskStore | VersionedTaskStore:
        """Wired to the request handler that drives it (by the handler's
        constructor): its store is left as it is."""
        self.handler = handler
        return store

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task
        context_id = task.context_id if task is not None else (context.context_id or "")
        # The caller's trace goes on here: the session's children are under this turn.
        with tracing.served_turn(
            context.call_context,
            role="orchestrator",
            task_id=context.task_id or "",
            context_id=context_id,
        ):
            await self._execute(context, event_queue)

    async def _execute(self, context: RequestContext, event_queue: EventQueue) -> None:
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
        # As the request handler parsed it (`server/requests.py`), once.
        metadata = turn_request(context.call_context).metadata
        # A follow-up on a task runs as the task does unless it says otherwise:
        # a stock client's answer to a parent agent's question (delegate mode)
        # carries no metadata of ours.
        opening = task.history[0] if task is not None and task.history else None
        mode = str(metadata.get(MODE_KEY) or metadata_of(opening).get(MODE_KEY) or "pipeline")
        # The task's turn ends report what the whole session spent (see
        # `_reported`), once the session is open to count from.
        reporting: _SessionRecord | None = None

        async def emit(event: ChildEvent) -> None:
            if reporting is not None:
                event = await self._reported(reporting, context_id, event)
            await publish(updater, event)

        if mode not in MODES:
            await emit(Started(role="orchestrator"))
            await emit(Failed(reason="error", message=f"unknown mode {mode!r}; use {MODES}"))
            return
        if not await self._owns_session(context_id, context, title=text):
            await emit(Started(role="orchestrator"))
            await emit(
                Failed(
                    reason="error",
                    message=f"context {context_id} cannot be used by this caller; "
                    "send the task in a new context id",
                )
            )
            return
        try:
            record = await self.host.acquire(context_id)
        except SessionOwnedElsewhere as exc:
            await emit(Started(role="orchestrator"))
            await emit(Failed(reason="error", message=str(exc)))
            return
        session = record.session
        assert session is not None  # acquire gives an open session
        run = record.tasks.get(task_id)
        waiting = task is not None and task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        ending = self._unfollowed.pop(task_id, None)
        if waiting and run is None and ending is not None:
            # Answered elsewhere (the web view), it ended while nobody
            # followed its task: the ending goes out now.
            await emit(ending)
            self.host.release(record)
            return
        answers = str(metadata.get(ANSWERS_KEY) or "")
        if answers and (run is None or run.question != answers):
            # The web view's answer, after the caller's message had taken the
            # question (and that answer): the task has moved on without it.
            self.host.release(record)
            return
        note = ""
        if run is not None and run.question:
            # The root parent's question: this message is its answer, unless
            # the web view answered first; then the parent gets that answer
            # (this message brings it, or came just before it).
            if not session.questions.answer(run.question, text) and run.answer is not None:
                if not answers:
                    note = f"answered first in the web view: {run.answer}"
                text = run.answer
            run.question, run.answer = "", None
        if waiting and mode == "pipeline" and (run is None or run.asks is None):
            # A pipeline's question this server no longer has (it restarted,
            # or another replica had the task): the answer has nowhere to go.
            # A parent agent's question (delegate mode) is in its stored
            # conversation: the message goes to it as its next input.
            await emit(
                Failed(
                    reason="error",
                    message="the run that asked is gone (the orchestrator restarted); "
                    f"resume the session: a2a-orchestrator resume {context_id}",
                )
            )
            self.host.release(record)
            return
        if run is None:
            run = record.tasks[task_id] = _TaskRun(task_id, anyio.CancelScope())
        async with record.reporting:
            if record.reported is None:
                record.reported = await self.store.session_usage(context_id)
        reporting = record
        if note:
            await updater.update_status(
                TaskState.TASK_STATE_WORKING, updater.new_agent_message([new_text_part(note)])
            )
        try:
            with anyio.CancelScope() as scope:
                run.scope, run.following = scope, True
                async with session.relay() as relay, anyio.create_task_group() as tg:
                    tg.start_soon(self._forward, relay, updater)
                    try:
                        if run.asks is not None:
                            await self._answer(session, run, text, updater)
                        elif mode == "pipeline":
                            await self._pipeline(record, session, run, text, emit, updater)
                        else:
                            await self._delegate(
                                record, session, run, text, emit, context.call_context
                            )
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
            run.following = False
            if (run.asks is None and not run.question) or run.ended.is_set():
                record.tasks.pop(task_id, None)
            self.host.release(record)

    def use_leases(self, store: PgStore, *, url: str, seconds: float) -> Leases:
        """Run sessions under leases in `store`, shared with other replicas
        (`session_leases.py`): this replica takes over the sessions of dead ones."""
        self.host.leases = Leases(
            store, url=url, seconds=seconds, on_takeover=self._take_over, on_lost=self.host.lose
        )
        return self.host.leases

    async def _take_over(self, session_id: str) -> None:
        """Open a dead replica's session here and recover its children (remote
        ones re-attached, local ones resumed under the at-most-once rule); it
        closes again once they have ended."""
        record = await self.host.acquire(session_id)
        try:
            session = record.session
            assert session is not None  # acquire gives an open session
            if record.plane is None:
                record.plane = ControlPlane(session, hooks=self.hooks, model_names=self.model_names)
            recovered = await session.recover()
            logger.info("took over session %s: %d children recovered", session_id, len(recovered))
        finally:
            self.host.release(record)

    async def _owns_session(
        self, session_id: str, context: RequestContext, *, title: str = ""
    ) -> bool:
        """Whether the request's caller owns the session (it does a new one,
        titled with the task that opened it, as `run` titles its sessions).

        The handler already refuses a context in which another caller has
        A2A tasks; a session opened otherwise (`run --session`) has its
        owner too, recorded in the session's metadata.
        """
        call = context.call_context
        owner = call.user.user_name if call is not None else ""
        await self.store.create_session(
            session_id, title=" ".join(title.split())[:_TITLE_CHARS], metadata={OWNER_KEY: owner}
        )
        record = await self.store.get_session(session_id)
        return record is not None and record["metadata"].get(OWNER_KEY, "") == owner

    async def _forward(
        self, relay: anyio.abc.ObjectReceiveStream[RelayedEvent], updater: TaskUpdater
    ) -> None:
        async for relayed in relay:
            if isinstance(relayed.event, MessageDelta):
                continue  # the whole message follows; deltas would flood the history
            data = {
                "childId": relayed.child_id,
                "parentId": relayed.parent_id,
                "agent": relayed.agent,
                "role": relayed.role,
                "transport": relayed.transport,
                "event": event_to_wire(relayed.event),
            }
            line = f"[{relayed.agent} {relayed.child_id[:6]}] {describe_event(relayed.event)}"
            message = updater.new_agent_message(
                [new_text_part(line), new_data_part(data)],
                metadata={EVENT_KEY: "child_event"},
            )
            await updater.update_status(TaskState.TASK_STATE_WORKING, message)

    async def _pipeline(
        self,
        record: _SessionRecord,
        session: Session,
        run: _TaskRun,
        text: str,
        emit: Callable[[ChildEvent], Any],
        updater: TaskUpdater,
    ) -> None:
        """Run a pipeline for the task. It runs in the session's task group,
        not in this request: a pass's question ends the request with
        INPUT_REQUIRED while the pipeline waits for the answer (`_answer`)."""
        if record.plane is None:
            record.plane = ControlPlane(session, hooks=self.hooks, model_names=self.model_names)
        self._react(record, record.plane)
        # A new pipeline run does not resume an earlier, interrupted one's
        # passes (`a2a-orchestrator resume` does, when asked).
        title = text.strip().splitlines()[0][:80] if text.strip() else "task"
        brief = Brief(task=TaskSpec(id=run.task_id[:8], title=title, description=text))
        pipeline = Pipeline(session, brief)
        run.run = pipeline
        run.asks = lambda question: question.child_id in pipeline.child_ids
        await emit(Started(role="orchestrator", model="pipeline"))

        async def work() -> None:
            try:
                try:
                    run.ending = await self._pipeline_ending(pipeline)
                except Exception as exc:  # contained: the task ends failed
                    logger.exception("orchestrator task %s failed", run.task_id)
                    run.ending = Failed(reason="error", message=f"{type(exc).__name__}: {exc}")
                # Sent by `_follow` (or kept for the task's next message), not
                # through the request's `emit`: it reports the run's spend here.
                run.ending = await self._reported(record, session.id, run.ending)
            finally:
                run.ended.set()
                if not run.following:
                    record.tasks.pop(run.task_id, None)
                    self._keep_unfollowed(run)
                self.host.release(record)

        # The run keeps the session open while its task waits for an answer.
        self.host.hold(record)
        session.start_soon(work, name=f"pipeline of task {run.task_id}")
        await self._follow(session, run, updater)

    async def _reported(
        self, record: _SessionRecord, session_id: str, event: ChildEvent
    ) -> ChildEvent:
        """`event`, when it ends a turn, with what the whole session spent
        since its last report (the parent agent's or the pipeline's calls and
        every child's), so a caller that delegates to this orchestrator counts
        all of it, not only the root's own calls, and each call once."""
        if record.reported is None or not isinstance(event, Done | Failed | InputRequired):
            return event
        async with record.reporting:
            total = await self.store.session_usage(session_id)
            spent = dataclasses.replace(total - record.reported, seconds=event.spent.seconds)
            record.reported = total
        event = dataclasses.replace(event, spent=spent)
        if isinstance(event, InputRequired):
            return event
        usage = Usage(input_tokens=spent.input_tokens, output_tokens=spent.output_tokens)
        return dataclasses.replace(event, usage=usage)

    def _keep_unfollowed(self, run: _TaskRun) -> None:
        """Keep how a run ended while no request followed its task, for the
        task's next message (at most `_UNFOLLOWED` of them, oldest dropped)."""
        if run.ending is None:
            return
        self._unfollowed[run.task_id] = run.ending
        while len(self._unfollowed) > _UNFOLLOWED:
            del self._unfollowed[next(iter(self._unfollowed))]

    @staticmethod
    async def _pipeline_ending(pipeline: Pipeline) -> ChildEvent:
        try:
            result = await pipeline.run()
        except PipelineCancelled as exc:
            return Failed(reason="aborted", message=str(exc))
        except PipelineError as exc:
            return Failed(reason="error", message=str(exc))
        summary = (
            f"{result.signal}\n\nArtifacts: {result.artifact_dir}\n\n"
            f"# Review\n\n{result.reviewer_output}\n\n# Implementation\n\n{result.coder_output}"
        )
        return Done(text=summary, usage=result.usage)

    async def _answer(
        self, session: Session, run: _TaskRun, text: str, updater: TaskUpdater
    ) -> None:
        """The caller's message on a task that asked: the answer to its
        pending question (unless the web view answered it first), then the
        run is followed again."""
        assert run.asks is not None
        for question in session.questions.pending():
            if run.asks(question):
                session.questions.answer(question.id, text)
                break
        await self._follow(session, run, updater)

    async def _follow(self, session: Session, run: _TaskRun, updater: TaskUpdater) -> None:
        """Until the run ends (its ending goes out) or one of its children
        asks: then the task goes INPUT_REQUIRED with the question, and who
        asks in a data part."""
        assert run.asks is not None
        asks = run.asks
        asked: Question | None = None
        async with anyio.create_task_group() as tg:

            async def question() -> None:
                nonlocal asked
                asked = await session.questions.wait_pending(asks)
                tg.cancel_scope.cancel()

            tg.start_soon(question)
            await run.ended.wait()
            tg.cancel_scope.cancel()
        if asked is None:
            assert run.ending is not None
            await publish(updater, run.ending)
            return
        data = {
            "questionId": asked.id,
            "question": asked.text,
            "childId": asked.child_id,
            "agent": asked.agent,
            "role": asked.role,
        }
        message = updater.new_agent_message(
            [new_text_part(asked.describe()), new_data_part(data)],
            metadata={EVENT_KEY: "input_required"},
        )
        await updater.update_status(TaskState.TASK_STATE_INPUT_REQUIRED, message)

    async def _delegate(
        self,
        record: _SessionRecord,
        session: Session,
        run: _TaskRun,
        text: str,
        emit: Callable[[ChildEvent], Any],
        caller: ServerCallContext | None,
    ) -> None:
        # One parent agent per session while the session is open; a later
        # request restores it from the store.
        async with self._parent_lock:
            parent = record.parent
            if parent is None:
                parent = await ParentAgent.restore(
                    session,
                    self.models(self.parent_model),
                    hooks=self.hooks,
                    max_concurrent=self.max_concurrent,
                    model_names=self.model_names,
                )
                record.parent = parent
        record.plane = parent.plane
        self._react(record, parent.plane)
        await session.recover()
        run.run = parent
        ending = await parent.run(text, emit)
        if isinstance(ending, InputRequired) and self.handler is not None:
            self._ask_root(record, session, run, parent, ending.question, caller)

    def _ask_root(
        self,
        record: _SessionRecord,
        session: Session,
        run: _TaskRun,
        parent: ParentAgent,
        question: str,
        caller: ServerCallContext | None,
    ) -> None:
        """Put the root parent's question in `session.questions`, where the
        web view shows it with its box, while its task waits INPUT_REQUIRED.
        The task's next message takes it (`_execute`); the web view's answer,
        if it comes first, goes to the task as that message would
        (`_answer_from_view`). Its conversation is in the store, so after a
        restart the next message still answers it, without the box."""
        asked = run.question = uuidlib.uuid4().hex[:12]
        context_id = session.id

        async def wait() -> None:
            try:
                if run.question == asked:  # else the task's next message came first
                    await ask()
            finally:
                self.host.release(record)

        async def ask() -> None:
            answer: str | None = None
            try:
                with anyio.CancelScope() as run.waiter:
                    answer = await session.questions.ask(
                        question, agent=parent.role.name, role=parent.role.name, question_id=asked
                    )
            finally:
                run.waiter = None
            if answer is None or run.question != asked:
                # Withdrawn (the task was canceled), or the task's next
                # message answered it (that request goes on with it).
                if run.question == asked:
                    run.question = ""
                if not run.following and not run.question:
                    record.tasks.pop(run.task_id, None)
                return
            run.answer = answer
            await self._answer_from_view(run, context_id, answer, caller)

        # The question keeps the session open while it waits, and until its
        # answer's request holds the session in turn.
        self.host.hold(record)
        session.start_soon(wait, name=f"question of task {run.task_id}")

    async def _answer_from_view(
        self, run: _TaskRun, context_id: str, answer: str, caller: ServerCallContext | None
    ) -> None:
        """Send the web view's answer to the task that asked, as its caller's
        next message: through the same request path, so the parent's next
        turn gets it as input and the task's events are stored and streamed
        to whoever follows it (a caller re-subscribing sees it go on)."""
        assert self.handler is not None
        message = new_text_message(
            answer, context_id=context_id, task_id=run.task_id, role=Role.ROLE_USER
        )
        message.metadata.update({ANSWERS_KEY: run.question})
        request = SendMessageRequest(
            message=message, configuration=SendMessageConfiguration(return_immediately=True)
        )
        call = ServerCallContext(user=caller.user) if caller is not None else ServerCallContext()
        try:
            await self.handler.on_message_send(request, call)
        except Exception:
            # Contained (a caller's quota refused it, say): the task still
            # waits INPUT_REQUIRED, and its next message goes to the parent
            # as the answer (the web view's, while the session is open).
            logger.exception("the web view's answer to task %s was not sent", run.task_id)

    def _react(self, record: _SessionRecord, plane: ControlPlane) -> None:
        """Attach the configured reactions to a session's root parent (once)."""
        if self.reactions and record.reactions is None:
            record.reactions = Reactions(plane, self.reactions)

    def _task(self, task_id: str) -> _TaskRun | None:
        for record in self.host.records.values():
            run = record.tasks.get(task_id)
            if run is not None:
                return run
        return None

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = self._task(context.task_id or "")
        if task is not None and task.waiter is not None:
            task.waiter.cancel()  # its root parent's question goes
        if task is not None and task.run is not None:
            await task.run.cancel()

    async def shutdown(self) -> None:
        """End the running A2A tasks as failed (reason `lost`); the children
        are not stopped: a later session resumes or re-attaches them."""
        for record in list(self.host.records.values()):
            for task in list(record.tasks.values()):
                task.scope.cancel()


@contextlib.asynccontextmanager
async def run_orchestrator_server(
    settings: OrchestratorSettings | None = None,
    *,
    store_path: Path | str,
    workdir: Path,
    network: Network,
    models: Callable[[str], Model],
    access: Access | None = None,
    hooks: Hooks | None = None,
    reactions: Sequence[Reaction] = (),
    sandbox: Sandbox | None = None,
    policy: SpawnPolicy | None = None,
    **options: Any,
) -> AsyncIterator[RunningServer]:
    """Serve the orchestrator (A2A + the HTTP control API) until the block exits.

    `settings` (`settings.OrchestratorSettings`: its task store `db`, where
    it listens, its limits) is validated once here and passed down;
    `options` are its fields given as keywords (`db=..., port=...`), alone
    or in place of the given object's. The rest are its collaborators.

    `sandbox` is where in-process agents run commands (default:
    `Sandbox.from_env()`). Raises `ConfigError` before binding when one of
    them lists `run_command` and the sandbox cannot be had here.

    `access` says who may call (`token` alone: one caller with that token);
    each caller sees only its own tasks and sessions, on the A2A endpoint
    and the HTTP API alike. `card_options`: the protocol versions its card
    lists and its signing key (default: both, unsigned). `grpc_port` (0: any
    free one): A2A over gRPC too, listed first in the card, or in a second
    card (`card_options.grpc_card`; `grpc_serving.py`, `cards.py`).

    `metrics`: serve Prometheus metrics at `/metrics` (behind the callers'
    auth unless `metrics_public`), with the sessions' running children.

    `push_policy`: the webhook URLs its callers may register (`push.py`);
    its own webhook endpoint for agents in push mode is served at
    /a2a/push/ (`transports/push_receiver.py`). `stream_limits`: the
    A2A streams it holds open, per caller and in all, and the web view's
    (`streams.py`; default: `StreamLimits()`).

    `store_path` may be a PostgreSQL URL (`store_pg.py`): replicas sharing it
    run each session under a lease of `lease_seconds` and take over the
    sessions of a replica that dies (`session_leases.py`).

    `body_timeout`: seconds a client has to send a request body, else 408 (as
    a role server). `model_names`: the model names a parent may choose for a
    child besides `default`, `mini` and the role's `models` (None: `$A2A_MODELS`).
    """
    settings = settings_from(OrchestratorSettings, settings, options)
    db = settings.db
    sandbox = sandbox if sandbox is not None else Sandbox.from_env()
    if "://" not in db:
        sandbox = sandbox.hiding(*store_paths(db))
    check_sandbox(network.agents.values(), sandbox)
    unsandboxed = not sandbox.enabled and any(not s.remote for s in network.agents.values())
    if unsandboxed:
        logger.warning("orchestrator: in-process agents: %s", sandbox.describe())
    sock = bind_socket(settings.host, settings.port)
    url = public_url_for(settings.host, sock.getsockname()[1], settings.public_url)
    if access is None and settings.token:
        access = Access(token=settings.token)
    grpc = bind_grpc(settings.host, settings.grpc_port, url, access, sock)
    store = open_store(store_path)
    receiver = PushReceiver(store, url)
    executor = OrchestratorExecutor(
        store,
        workdir=workdir,
        network=network,
        models=models,
        hooks=hooks,
        reactions=reactions,
        sandbox=sandbox,
        policy=policy,
        # Each session's own A2A transport, taking push-mode children's
        # updates at this server's webhook endpoint.
        remote=functools.partial(RemoteDelegate, push=receiver),
        model_names=settings.model_names,
    )
    card_options = settings.card_options or CardOptions()
    card = build_orchestrator_card(
        url, unsandboxed=unsandboxed, access=access, legacy=card_options.legacy
    )
    # Signed last: after every interface is listed.
    card, more_cards = card_options.served(card, grpc.list_in if grpc is not None else None)
    forwarding: list[Middleware] = []
    if isinstance(store, PgStore):
        leases = executor.use_leases(store, url=url, seconds=settings.lease_seconds)
        logger.info("orchestrator replica %s (leases of %ss)", leases.owner, settings.lease_seconds)
        # A message for a session another replica runs is sent on to it.
        forwarding.append(Middleware(SessionForwarding, leases=leases))
    limits = settings.stream_limits or StreamLimits()
    streams = StreamSlots(limits)
    view = [
        *api_routes(store, lambda: executor.planes),
        # Slots of their own, fewer per caller: a person has a few tabs open.
        *ui_routes(store, lambda: executor.sessions, StreamSlots(limits.for_view())),
    ]
    app = build_app(
        executor,
        card,
        open_task_store(db),
        more_cards=more_cards,
        access=access,
        usage=UsageLog(usage_path(db, "orchestrator", workdir)) if access is not None else None,
        settings=settings,
        extra_routes=[*view, *receiver.routes()],
        metrics=_server_metrics(executor) if settings.metrics else None,
        # Agents post there with the child's own token, not a caller's,
        # checked before their body is read.
        own_credentials={PUSH_PREFIX: receiver.check},
        streams=streams,
        inner_middleware=forwarding,
    )
    # Outermost: a browser's login cookie becomes the bearer header that the
    # server's own authentication then checks (ui_auth.py), on the view's
    # own routes only.
    app.add_middleware(BrowserLogin, access=access, cookie_routes=view)
    try:
        async with run_server(
            app,
            sock,
            url,
            executor,
            install_signal_handlers=settings.install_signal_handlers,
            grpc=grpc,
        ) as server:
            yield server
    finally:
        store.close()


def _server_metrics(executor: OrchestratorExecutor) -> Metrics:
    # Imported here: prometheus-client is loaded only by a server that counts.
    from ..observe.metrics import Metrics, running_children

    return Metrics(children=lambda: running_children(executor.sessions.values()))
