"""The role server: one role served as an A2A v1.0 agent.

a2a-sdk does the protocol (`DefaultRequestHandler`, its route builders, the
SQL task store); this module assembles them around a `RoleExecutor`: the
agent card built from the role, JSON-RPC at `/`, HTTP+JSON under `/rest`,
the v0.3 compatibility layer on both, optional caller authentication
(`access.py`: tokens, a callers file, JWTs) checked before any body byte is
read, per-caller quotas and usage (`quotas.py`), and a request body bounded
in size and time.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
from a2a.helpers import new_text_part
from a2a.server.agent_execution import RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import DatabaseTaskStore, TaskStore
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Message,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    TaskState,
    TaskStatus,
)
from a2a.types import (
    Role as A2ARole,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from anyio.abc import TaskStatus as StartedStatus
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import BaseRoute

from .._version import __version__ as VERSION
from ..errors import ConfigError
from ..models.base import Model
from ..observe import tracing
from ..protocol.cards import CardOptions
from ..protocol.guards import guard_routes
from ..protocol.numbers import integral_routes
from ..protocol.wire import (
    BATCH_EXTENSION,
    BATCH_EXTENSION_V1,
    BATCH_KIND,
    CONTROL_EXTENSION,
    CONTROL_KEY,
    EVENT_ID_KEY,
    EVENT_KEY,
    PAUSE_ON_KEY,
    write_at_once,
)
from ..runtime.budgets import PriceTable
from ..runtime.events import new_uuid
from ..runtime.factory import CONTROL_ACTIONS, RoleRuntime
from ..runtime.overrides import offered_models
from ..runtime.roles import Role
from ..storage.database.postgres import PgConnection
from ..storage.journal import ToolJournal
from ..storage.quota_slots import QuotaSlots
from ..storage.tasks.observed import observed as observing
from ..storage.tasks.sqlite import SQLiteTaskStore, TaskOwner
from ..tools import Sandbox, Workspace
from ..tools.sandbox import UNSANDBOXED_NOTE, store_paths
from .auth.access import Access
from .auth.callers import Limits
from .auth.quotas import QuotaContextBuilder, Quotas, RefusalMiddleware
from .auth.usage import PgUsageLog, UsageLog, usage_path
from .executor import HOLD_LIMIT, RoleExecutor
from .handler import RoleRequestHandler
from .middleware import (
    BodyLimitMiddleware,
    CallerBackend,
    HeaderCheck,
    auth_error,
)
from .push import PushService
from .serving import bind_socket, serve
from .settings import AppSettings, RoleServerSettings, settings_from
from .streams import StreamSlots

if TYPE_CHECKING:
    from a2a.server.cluster import TaskEventStream, VersionedTaskStore

    from .grpc_serving import GrpcServing

if TYPE_CHECKING:
    from ..observe.metrics import Metrics

__all__ = [
    "REST_PREFIX",
    "RunningServer",
    "agent_card",
    "bind_grpc",
    "build_app",
    "build_card",
    "fail_orphaned_tasks",
    "journal_path",
    "open_task_store",
    "public_url_for",
    "run_role_server",
    "run_server",
]

logger = logging.getLogger(__name__)

REST_PREFIX = "/rest"
BEARER_SCHEME = "bearer"

DEFAULT_APP = AppSettings()
"""`build_app`'s settings when it is given none: every default."""

FRAME_WRITE_DELAY = 0.05
"""Seconds a task's frames that change neither its state nor its artifacts
(text, messages, tool calls) may wait in memory to be written together."""


def agent_card(
    *,
    name: str,
    description: str,
    url: str,
    skills: Sequence[AgentSkill],
    auth: bool = False,
    extensions: Sequence[AgentExtension] = (),
    access: Access | None = None,
    legacy: bool = True,
) -> AgentCard:
    """A card for one of our A2A servers at `url`: JSON-RPC and HTTP+JSON on
    protocol 1.0, on 0.3 too unless `legacy` is off, streaming, push
    notifications (`push.py`), and the security schemes `access` accepts
    (`auth` alone: the bearer scheme).

    Without the 0.3 interfaces a2a-sdk serves the card without the v0.3
    top-level fields (`url`, `protocolVersion`, ...): a pure v1.0 card
    (`cards.py`). The 0.3 routes keep answering either way."""
    url = url.rstrip("/")
    interfaces = [
        AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
        AgentInterface(url=url + REST_PREFIX, protocol_binding="HTTP+JSON", protocol_version="1.0"),
    ]
    if legacy:
        # Peers still on a2a-sdk 0.3 (Strands Agents, older ADK) pick these.
        interfaces += [
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
            AgentInterface(
                url=url + REST_PREFIX, protocol_binding="HTTP+JSON", protocol_version="0.3"
            ),
        ]
    card = AgentCard(
        name=name,
        description=description,
        version=VERSION,
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=True, extensions=list(extensions)
        ),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain", "application/json"],
        skills=list(skills),
    )
    if access is not None:
        schemes, requirements = access.security()
        for name, scheme in schemes.items():
            card.security_schemes[name].CopyFrom(scheme)
        card.security_requirements.extend(requirements)
    elif auth:
        card.security_schemes[BEARER_SCHEME].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer", description="Token shared with the server's operator"
                )
            )
        )
        card.security_requirements.append(
            SecurityRequirement(schemes={BEARER_SCHEME: StringList()})
        )
    return card


CONTROL_CARD_EXTENSION = AgentExtension(
    uri=CONTROL_EXTENSION,
    description="Pause, resume, interrupt or steer a running task: send a message naming "
    f"the task with metadata {{{CONTROL_KEY!r}: 'pause' | 'resume' | 'interrupt' | 'steer'}} "
    "(steer: the message text is absorbed at the task's next step). Pause rules: "
    f"{{{CONTROL_KEY!r}: 'pause_on', {PAUSE_ON_KEY!r}: {{rule id: {{kind?, tool?, success?, "
    "contains?}}} replaces the task's rules (the same key on a turn's message sets them "
    "for that turn); the task is held at the step boundary right after an event a rule "
    "selects, until 'pause' confirms or 'resume' releases the hold (released by itself "
    f"after {HOLD_LIMIT:g} s). params.actions lists the actions this server takes.",
    required=False,
    params={"actions": list(CONTROL_ACTIONS)},
)


_BATCH_FORMAT = (
    "Batched child events: a request that activates this extension "
    "(A2A-Extensions header) may get several WORKING events of its task in one status "
    f"update: its message's metadata is {{{EVENT_KEY!r}: {BATCH_KIND!r}}}, and each part "
    f"is one event, whose part metadata {{{EVENT_KEY!r}: kind, {EVENT_ID_KEY!r}: uuid}} "
    "names it. Without it, every event is a status update of its own."
)

BATCH_CARD_EXTENSION = AgentExtension(
    uri=BATCH_EXTENSION,
    description=f"{_BATCH_FORMAT} The event that ends the turn (done, failed, "
    "input_required), when it follows queued events at once, is the batch's last part "
    "(its usage, spent and reason in the part's metadata) and the update has its state; "
    "a done's result artifact comes just before that update.",
    required=False,
)

BATCH_V1_CARD_EXTENSION = AgentExtension(
    uri=BATCH_EXTENSION_V1,
    description=f"{_BATCH_FORMAT} A batch holds WORKING events only.",
    required=False,
)


def build_card(
    role: Role,
    url: str,
    *,
    auth: bool = False,
    sandbox: Sandbox | None = None,
    access: Access | None = None,
    legacy: bool = True,
) -> AgentCard:
    """The agent card of a role served at `url` (`legacy`: see `agent_card`).

    A role with `run_command` whose operator turned the sandbox off says so
    in its description: callers should know their task runs unconfined.
    """
    skills = [
        AgentSkill(
            id=skill,
            name=skill.replace("-", " "),
            description=f"{role.description} ({skill})".strip(),
            tags=[role.name, skill],
        )
        for skill in role.skills
    ] or [AgentSkill(id=role.name, name=role.name, description=role.description, tags=[role.name])]
    description = role.description or f"The {role.name} role"
    if sandbox is not None and not sandbox.enabled and "run_command" in role.tools:
        description += f" ({UNSANDBOXED_NOTE})"
    return agent_card(
        name=role.name,
        description=description,
        url=url,
        skills=skills,
        auth=auth,
        extensions=[CONTROL_CARD_EXTENSION, BATCH_CARD_EXTENSION, BATCH_V1_CARD_EXTENSION],
        access=access,
        legacy=legacy,
    )


def journal_path(db: str, role: str, workdir: Path) -> Path:
    """Where a role server keeps its tool-call journal: in its SQLite task
    file, or beside its work directory's stores when the tasks live elsewhere."""
    if "://" in db:
        return workdir / ".a2a" / f"journal-{role}.db"
    return Path(db).expanduser()


def open_task_store(db: str) -> TaskStore:
    """The task store for `db`: a file path gives an `SQLiteTaskStore`
    (coalescing frame saves, `FRAME_WRITE_DELAY`), an
    SQLAlchemy async URL (PostgreSQL for replicas, or any other) gives
    a2a-sdk's `DatabaseTaskStore`."""
    if "://" in db:
        return DatabaseTaskStore(_engine(db), create_table=True)
    return SQLiteTaskStore(
        Path(db).expanduser(), coalesce=FRAME_WRITE_DELAY, write_now=write_at_once
    )


def is_replica_url(db: str) -> bool:
    """Whether a task store URL is one that replicas share (PostgreSQL)."""
    return db.split("://", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def _engine(db: str) -> AsyncEngine:
    try:
        return create_async_engine(db)
    except (ImportError, SQLAlchemyError, ValueError) as exc:
        raise ConfigError(
            f"task store URL {db!r} cannot be used: {exc} (an async driver is needed, "
            "e.g. sqlite+aiosqlite:// or postgresql+asyncpg:// with "
            "pip install 'a2a-orchestrator[postgresql]')"
        ) from exc


async def fail_orphaned_tasks(task_store: TaskStore | VersionedTaskStore) -> int:
    """Mark tasks a dead server left working as failed (reason `lost`).

    Nothing runs them any more: a client re-attaching would otherwise wait on
    them forever. Only for a server's own SQLite file; replicas sharing one
    database (PostgreSQL) may be running each other's tasks.
    """
    if not isinstance(task_store, SQLiteTaskStore):
        return 0
    failed = 0
    for task, owner in await task_store.unfinished():
        message = Message(
            role=A2ARole.ROLE_AGENT,
            message_id=new_uuid(),
            task_id=task.id,
            context_id=task.context_id,
            parts=[new_text_part("the role server stopped while this task ran")],
        )
        message.metadata.update({EVENT_KEY: "failed", "reason": "lost"})
        if task.status.HasField("message"):
            task.history.append(task.status.message)
        status = TaskStatus(state=TaskState.TASK_STATE_FAILED, message=message)
        status.timestamp.GetCurrentTime()
        task.status.CopyFrom(status)
        await task_store.save(task, ServerCallContext(user=TaskOwner(owner)))
        failed += 1
    return failed


class ServedExecutor(Protocol):
    """What `build_app` serves: an a2a-sdk executor that can end its work on
    shutdown. One that needs its request handler (to read the tasks it
    saves, to run turns through it) also has `served_by`, called by the
    handler's constructor (`handler.py`)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None: ...

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None: ...

    async def shutdown(self) -> None: ...

    def running(self) -> AbstractAsyncContextManager[None]:
        """Entered for the server's lifetime (the lifespan owns what it starts)."""
        ...


def build_app(
    executor: ServedExecutor,
    card: AgentCard,
    task_store: TaskStore | VersionedTaskStore,
    *,
    settings: AppSettings = DEFAULT_APP,
    access: Access | None = None,
    usage: UsageLog | PgUsageLog | None = None,
    quota_slots: QuotaSlots | None = None,
    metrics: Metrics | None = None,
    streams: StreamSlots | None = None,
    extra_routes: Sequence[BaseRoute] = (),
    own_credentials: Mapping[str, HeaderCheck] | None = None,
    event_stream: TaskEventStream | None = None,
    more_cards: Mapping[str, AgentCard] | None = None,
    inner_middleware: Sequence[Middleware] = (),
) -> Starlette:
    """The Starlette app of an A2A server; its lifespan owns the handler,
    `access` and `usage` (and closes them). `settings`: its body limits,
    whether its metrics are public and its push policy (`settings.py`; a
    server's own settings object, passed down as it is).

    `access` says who may call (None: anyone); each caller sees only its
    own tasks, and is held to its limits, its usage recorded in `usage`.
    `extra_routes` (the orchestrator's HTTP control API) sit behind the
    same auth and body limits as the A2A endpoints, except paths under a
    prefix of `own_credentials` (routes that take a credential of their
    own, the orchestrator's webhooks), which its check lets in on their
    headers before their body is read. `streams`: the slots its A2A
    streams take (default: a `StreamSlots` of the default limits;
    `streams.py`).

    `inner_middleware` runs innermost, after the callers' auth and the body
    limits (the orchestrator's forwarding of a session's messages).

    `metrics` (None: none) are served at `/metrics`, behind the same auth
    unless `settings.metrics_public`, and fed from this app's task saves and
    the conversations its requests run (`metrics.py`). `event_stream`
    carries a versioned (replicas') `task_store`'s events to other
    replicas' subscribers (`replicas.py`).

    `card` is served at the well-known path, `more_cards` at theirs (the
    card listing gRPC, `CardOptions.served`), as public as it.
    """
    quotas = (
        Quotas(access.limits if access is not None else _no_limits, usage, slots=quota_slots)
        if access is not None or usage is not None
        else None
    )
    observed: TaskStore | VersionedTaskStore = task_store
    watchers = [quotas.observe if quotas is not None else None]
    watchers.append(metrics.task_saved if metrics is not None else None)
    for on_save in watchers:
        if on_save is not None:
            observed = observing(observed, on_save)
    push = PushService(task_store, settings.push_policy)
    handler = RoleRequestHandler(
        agent_executor=executor,
        task_store=observed,
        agent_card=card,
        quotas=quotas,
        streams=streams,
        **push.handler_args(),
        event_stream=event_stream,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Deliveries outlive the handler: the last events of the tasks it
        # drains on the way out still reach their webhooks.
        async with push.running(), quotas_kept(), serving(app):
            yield

    def quotas_kept() -> contextlib.AbstractAsyncContextManager[None]:
        return quotas.kept() if quotas is not None else contextlib.nullcontext()

    @contextlib.asynccontextmanager
    async def serving(app: Starlette) -> AsyncIterator[None]:
        if isinstance(task_store, DatabaseTaskStore):
            await task_store.initialize()
        try:
            # Entered first: it ends what a crashed predecessor left running
            # before that predecessor's tasks are marked lost.
            async with executor.running():
                orphans = await fail_orphaned_tasks(task_store)
                if orphans:
                    logger.warning(
                        "marked %d task(s) left running by a stopped server as failed", orphans
                    )
                yield
                await executor.shutdown()
        finally:
            await handler.aclose()
            if isinstance(task_store, DatabaseTaskStore):
                await task_store.engine.dispose()
            elif isinstance(task_store, SQLiteTaskStore):
                task_store.close()
            if access is not None:
                await access.aclose()
            if usage is not None:
                usage.close()

    # The builder hands the handler the request's refusal cell (quotas).
    builder = QuotaContextBuilder()
    more_cards = more_cards or {}
    public = {AGENT_CARD_WELL_KNOWN_PATH, *more_cards}
    metrics_routes = [metrics.route()] if metrics is not None else []
    if settings.metrics_public:
        public.update(route.path for route in metrics_routes)
    routes = [
        *create_agent_card_routes(card, cache_control="public, max-age=60"),
        *(
            route
            for path, other in more_cards.items()
            for route in create_agent_card_routes(
                other, card_url=path, cache_control="public, max-age=60"
            )
        ),
        *metrics_routes,
        *extra_routes,
        *create_jsonrpc_routes(
            handler, rpc_url="/", enable_v0_3_compat=True, context_builder=builder
        ),
        *create_rest_routes(
            handler, path_prefix=REST_PREFIX, enable_v0_3_compat=True, context_builder=builder
        ),
    ]
    # Bad input gets the spec's error where the SDK's routes answer 500.
    routes = guard_routes(routes, rpc_path="/", rest_prefix=REST_PREFIX)
    # Whole numbers in metadata and data parts go out as JSON integers.
    routes = integral_routes(routes, rpc_path="/", rest_prefix=REST_PREFIX)
    middleware = [
        Middleware(
            BodyLimitMiddleware,
            max_bytes=settings.max_body,
            timeout=settings.body_timeout,
            bodyless_paths=public,
            header_checks=own_credentials,
        )
    ]
    if metrics is not None:
        from ..runtime.instruments import InstrumentsMiddleware

        middleware.append(Middleware(InstrumentsMiddleware, instruments=metrics))
    # A quota's or a stream cap's refusal gets its HTTP shape (429, Retry-After).
    middleware.append(Middleware(RefusalMiddleware))
    middleware.extend(inner_middleware)
    if access is not None:
        backend = CallerBackend(
            access, public_paths=public, public_prefixes=list(own_credentials or ())
        )
        # Outermost (first): a request without a good credential is refused
        # on its headers, before the body middleware reads a byte.
        middleware.insert(
            0, Middleware(AuthenticationMiddleware, backend=backend, on_error=auth_error)
        )
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.executor = executor
    app.state.handler = handler
    return app


def _metrics(**kwargs: Any) -> Metrics:
    # Imported here: prometheus-client is loaded only by a server that counts.
    from ..observe.metrics import Metrics

    return Metrics(**kwargs)


def _no_limits(owner: str) -> Limits:
    return Limits()


@dataclass(frozen=True, kw_only=True)
class RunningServer:
    """An A2A server that is up: where it listens and what runs it."""

    url: str
    """Base URL (the card's JSON-RPC endpoint)."""
    port: int
    executor: Any
    stopped: anyio.Event
    """Set once the server has shut down (e.g. after SIGTERM)."""
    app: Starlette | None = None
    """The app served (its routes, for tools and tests that walk them)."""
    grpc_address: str | None = None
    """host:port of its gRPC binding (None: not served)."""


def public_url_for(host: str, port: int, public_url: str | None) -> str:
    """The URL clients reach a server at: `public_url`, else host and port."""
    reachable = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return (public_url or f"http://{reachable}:{port}").rstrip("/")


@contextlib.asynccontextmanager
async def run_server(
    app: Starlette,
    sock: socket.socket,
    url: str,
    executor: ServedExecutor,
    *,
    install_signal_handlers: bool = False,
    grpc: GrpcServing | None = None,
) -> AsyncIterator[RunningServer]:
    """Serve `app` on `sock` until the block exits (or a signal stops it);
    `grpc` (bound) serves the app's handler too, from when the app is up
    until its running tasks have ended (`grpc_serving.py`)."""
    stopped = anyio.Event()

    async def before_shutdown() -> None:
        await executor.shutdown()
        if grpc is not None:
            await grpc.stop()

    async def run(*, task_status: StartedStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await serve(
                app,
                sock,
                before_shutdown=before_shutdown,
                install_signal_handlers=install_signal_handlers,
                task_status=task_status,
            )
        finally:
            stopped.set()

    try:
        async with anyio.create_task_group() as tg:
            port = await tg.start(run)
            if grpc is not None:
                await grpc.start(app.state.handler)
            yield RunningServer(
                url=url,
                port=port,
                executor=executor,
                stopped=stopped,
                grpc_address=grpc.address if grpc is not None else None,
                app=app,
            )
            tg.cancel_scope.cancel()
    finally:
        if grpc is not None:
            # Stopped already at an orderly shutdown; this frees the port
            # when the HTTP side never came up.
            with anyio.CancelScope(shield=True):
                await grpc.stop()


@contextlib.asynccontextmanager
async def run_role_server(
    role: Role,
    model: Model,
    workdir: Path,
    settings: RoleServerSettings | None = None,
    *,
    access: Access | None = None,
    models: Callable[[str], Model] | None = None,
    sandbox: Sandbox | None = None,
    prices: PriceTable | None = None,
    **options: Any,
) -> AsyncIterator[RunningServer]:
    """Serve `role` until the block exits (or a signal stops it).

    `settings` (`settings.RoleServerSettings`: its task store `db`, where it
    listens, its limits) is validated once here and passed down; `options`
    are its fields given as keywords (`db=..., port=...`), alone or in
    place of the given object's.

    A PostgreSQL `db` makes this server one of the role's replicas sharing
    that database (`replicas.py`; `settings.replica`: its id and lease,
    default `ReplicaSettings.from_env()`).

    The socket is bound before the card is built, so the card names the real
    port; `public_url` replaces it where clients reach the server by another
    name (a container's service name). `models` resolves a model name a
    child asks for (None: children get the server's model only); a caller
    may ask for `default`, `mini`, the role's `models` and `model_names`.
    `max_memory` bounds the conversations held in memory (bytes).

    `access` says who may call (`token` alone: one caller with that token);
    the server owns it from here (closes it when it stops). With it, each
    caller's usage is recorded in the server's SQLite file (`usage.py`).

    `prices` is the operator's price table for cost budgets (default:
    `A2A_PRICES`). `sandbox` is where `run_command` runs commands (default:
    `Sandbox.from_env()`); a file task store is hidden from them. Raises
    `ConfigError` before binding when the role lists `run_command` and the
    sandbox cannot be had here; an operator's opt-out is logged as a warning
    and shown in the card's description. `card_options`: the protocol
    versions the card lists and its signing key (default: both, unsigned).

    `metrics`: serve Prometheus metrics at `/metrics` (behind the callers'
    auth unless `metrics_public`).

    `push_policy`: the webhook URLs callers may register (`push.py`).
    `stream_limits`: the streams it holds open, per caller and in all
    (`streams.py`; default: `StreamLimits()`).
    """
    settings = settings_from(RoleServerSettings, settings, options)
    db = settings.db
    # A script in the model allow-list is refused before the port is taken.
    offered_models(role, settings.model_names)
    sandbox = sandbox if sandbox is not None else Sandbox.from_env()
    if "://" not in db:
        sandbox = sandbox.hiding(*store_paths(db))
    if "run_command" in role.tools:
        # Refuse before anything is bound or opened.
        sandbox.allowing_network(role.sandbox_network).check()
        if not sandbox.enabled:
            # describe() also says whether a detached process outlives its command.
            logger.warning(
                "%s: the operator turned the sandbox off: %s", role.name, sandbox.describe()
            )
    sock = bind_socket(settings.host, settings.port)
    url = public_url_for(settings.host, sock.getsockname()[1], settings.public_url)
    if access is None and settings.token:
        access = Access(token=settings.token)
    grpc = bind_grpc(settings.host, settings.grpc_port, url, access, sock)
    prices = prices if prices is not None else PriceTable.from_env()
    runtime = RoleRuntime(sandbox=sandbox, prices=prices, spans=tracing.CONVERSATION_SPANS)
    executor: RoleExecutor
    event_stream: TaskEventStream | None = None
    task_store: TaskStore | VersionedTaskStore
    usage: UsageLog | PgUsageLog | None = None
    quota_slots: QuotaSlots | None = None
    if is_replica_url(db):
        from ..storage.tasks.cluster import ClusterStores
        from .replicas import ReplicaExecutor, ReplicaSettings

        cluster = ClusterStores.on(_engine(db))
        task_store, event_stream = cluster.tasks, cluster.events
        executor = ReplicaExecutor(
            role,
            model,
            Workspace(workdir),
            cluster=cluster,
            settings=settings.replica or ReplicaSettings.from_env(),
            models=models,
            model_names=settings.model_names,
            max_memory=settings.max_memory,
            runtime=runtime,
        )
        if access is not None:
            # Quotas across the replicas: usage and running turns counted in
            # their database (`quotas.py`).
            shared = cluster.engine.url.render_as_string(hide_password=False)
            usage = PgUsageLog(shared)
            quota_slots = QuotaSlots(
                PgConnection(shared, "quota slots"),
                executor.settings.replica_id,
                executor.settings.lease,
            )
    else:
        task_store = open_task_store(db)
        executor = RoleExecutor(
            role,
            model,
            Workspace(workdir),
            task_store=task_store,
            models=models,
            journal=ToolJournal.open(journal_path(db, role.name, workdir)),
            model_names=settings.model_names,
            max_memory=settings.max_memory,
            runtime=runtime,
        )
    card_options = settings.card_options or CardOptions()
    card = build_card(role, url, sandbox=sandbox, access=access, legacy=card_options.legacy)
    # Signed last: after every interface is listed.
    card, more_cards = card_options.served(card, grpc.list_in if grpc is not None else None)
    app = build_app(
        executor,
        card,
        task_store,
        more_cards=more_cards,
        access=access,
        # Usage is kept per caller: with auth off there is one anonymous
        # caller and nothing to tell apart (nor a write per task to pay).
        usage=usage
        if usage is not None or access is None
        else UsageLog(usage_path(db, role.name, workdir)),
        quota_slots=quota_slots,
        settings=settings,
        metrics=_metrics() if settings.metrics else None,
        streams=StreamSlots(settings.stream_limits),
        event_stream=event_stream,
    )
    async with run_server(
        app,
        sock,
        url,
        executor,
        install_signal_handlers=settings.install_signal_handlers,
        grpc=grpc,
    ) as server:
        yield server


def bind_grpc(
    host: str, port: int | None, url: str, access: Access | None, sock: socket.socket
) -> GrpcServing | None:
    """The gRPC binding of a server whose HTTP socket `sock` is bound (None
    without a port); if it cannot bind, `sock` is closed and the error raised."""
    if port is None:
        return None
    from .grpc_serving import GrpcServing

    try:
        if port and port == sock.getsockname()[1]:
            # Both sockets allow address reuse, and the HTTP one does not
            # listen yet: gRPC would bind beside it instead of failing.
            raise ConfigError(f"the gRPC port {port} is the HTTP port: give another")
        return GrpcServing.bind(host, port, public_url=url, access=access)
    except (OSError, ConfigError):
        sock.close()
        raise
