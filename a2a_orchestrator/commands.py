"""What each `a2a-orchestrator` command does (the parser lives in `cli.py`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import time
import uuid as uuidlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .budgets import Spend
from .clidefaults import DEFAULT_PORTS, DEFAULT_STORE, DEFAULT_TOKEN_ENV, EXIT_CODES
from .errors import OrchestratorError
from .events import (
    CHILD_EVENT_KINDS,
    ChildEvent,
    Done,
    Failed,
    event_from_dict,
    event_to_dict,
)
from .heap import settle
from .pipeline import (
    PROGRESS_KEY,
    Brief,
    PassOptions,
    Pipeline,
    PipelineError,
    Signal,
    TaskSpec,
    extract_signal,
)
from .runner import Liveness, liveness, stop_signal_listener
from .store import RunnerRecord, Store
from .view import LiveTree, describe_event

# What only the commands that run something need (the session with its
# transports, the role server, the parent agent, models, tools, hooks,
# policy, reactions, httpx) is imported in those commands: the session alone
# loads the SDK's server side, and `status`, `children` and `events` should
# start in a fraction of that time. Names used only in annotations are here.
if TYPE_CHECKING:
    from .access import Access
    from .control import ControlPlane
    from .hooks import Hooks
    from .models import ModelSettings
    from .network import Network
    from .policy import SpawnPolicy
    from .reactions import Reaction, Reactions
    from .replicas import ReplicaSettings
    from .session import Session
    from .tools import Sandbox

__all__ = [
    "ASYNC_COMMANDS",
    "DEFAULT_PORTS",
    "DEFAULT_STORE",
    "DEFAULT_TOKEN_ENV",
    "EXIT_CODES",
]

logger = logging.getLogger(__name__)

STOPPED_LINE = "stopped by `a2a-orchestrator stop`: its children ended aborted"

SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

MODEL_HINT = (
    "set A2A_MODEL_BASE_URL (and A2A_MODEL_API_KEY if needed) to use a real OpenAI-compatible model"
)


# -- helpers ----------------------------------------------------------------------


def say(text: str = "") -> None:
    print(text, flush=True)


def _settings_and_models() -> tuple[ModelSettings, Any]:
    from .models import ModelSettings, resolve_model

    settings = ModelSettings.from_env()
    return settings, lambda name: resolve_model(name, settings)


def _model_notice(settings: ModelSettings) -> None:
    if settings.offline:
        say(f"model: scripted (offline) - no model endpoint is configured; {MODEL_HINT}")


def _policy(path: Path | None, config_dir: Path) -> SpawnPolicy | None:
    """The spawn policy: `--policy FILE`, else `policy.toml` beside the hooks."""
    from .policy import SpawnPolicy, load_policy_file

    candidate = path or config_dir / "policy.toml"
    if path is not None or candidate.exists():
        return load_policy_file(candidate, SpawnPolicy(cwd=config_dir.parent))
    return None


def _hooks(path: Path | None, config_dir: Path) -> Hooks:
    from .hooks import Hooks, load_hook_file

    candidate = path or config_dir / "hooks.toml"
    if path is not None or candidate.exists():
        return load_hook_file(candidate)
    return Hooks()


def sandbox_of(args: argparse.Namespace) -> Sandbox:
    """The operator's sandbox for commands: `--no-sandbox`/`--allow-network`,
    else the A2A_SANDBOX* variables. Turning it off is said out loud."""
    from .tools import Sandbox

    sandbox = Sandbox.from_env(no_sandbox=args.no_sandbox, allow_network=args.allow_network)
    if not sandbox.enabled:
        logger.warning("the operator turned the command sandbox off: %s", sandbox.describe())
        say(f"sandbox: {sandbox.describe()}")
    return sandbox


def _existing_store(path: Path | str) -> Store:
    from .stores import open_store

    if isinstance(path, Path) and not path.exists():
        raise OrchestratorError(f"no store at {path} (run a task first, or pass --store)")
    return open_store(path)


def _new_store(path: Path | str) -> Store:
    """The store a command writes; a `.a2a` directory made for it is kept out of git.
    A PostgreSQL URL (a string) opens the shared store (`store_pg.py`)."""
    from .session import keep_out_of_git
    from .stores import open_store

    if isinstance(path, Path) and path.parent.name == ".a2a":
        keep_out_of_git(path.parent)
    return open_store(path)


async def session_id_of(
    store: Store, given: str, where: Path | str, *, missing_ok: bool = False
) -> str:
    """The session `given` names: its id, or any unique prefix of one (the
    tree and `status` print short ids). One it does not name at all is an
    error, or (`missing_ok`) `given` itself."""
    if await store.get_session(given) is not None:
        return given
    matches = [row["id"] for row in await store.list_sessions() if row["id"].startswith(given)]
    if len(matches) == 1:
        return str(matches[0])
    if not matches:
        if missing_ok:
            return given
        raise OrchestratorError(f"no session {given!r} in {where}")
    more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
    raise OrchestratorError(
        f"session {given!r} is ambiguous in {where}: it starts {len(matches)} sessions "
        f"({', '.join(matches[:10])}{more}); give more of the id"
    )


async def _child_id_of(store: Store, session_id: str, given: str) -> str:
    """A child of the session by its id or a unique prefix (the tree prints six characters)."""
    ids = [record.child_id for record in await store.list_children(session_id=session_id)]
    if given in ids:
        return given
    matches = [child_id for child_id in ids if child_id.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise OrchestratorError(f"session {session_id} has no child {given!r}")
    raise OrchestratorError(
        f"child {given!r} is ambiguous: it starts {', '.join(matches)}; give more of the id"
    )


def _check_agents(network: Network, agents: list[str], settings: ModelSettings) -> None:
    """Each agent resolves, and each in-process one's role file and model
    script load: bad configuration is a clear error (exit 2) before anything
    runs, not a failed pass halfway through."""
    from .conversations import CONTROL_TOOL_NAMES
    from .models import resolve_model
    from .roles import find_role
    from .runtime import ASK_PARENT
    from .tools import TOOL_NAMES

    for agent in agents:
        spec = network.resolve(agent)
        if spec.remote:
            continue  # reached at run time; an unreachable agent fails its pass
        role = find_role(spec.role)
        # The check the pass would make when its conversation is built.
        known = (*TOOL_NAMES, ASK_PARENT, *sorted(CONTROL_TOOL_NAMES))
        unknown = [name for name in role.tools if name not in known]
        if unknown:
            where = f" ({role.source})" if role.source else ""
            raise OrchestratorError(
                f"role {role.name!r}{where} lists unknown tools {unknown}; "
                f"known tools: {', '.join(known)}"
            )
        model = role.model
        concrete = {None: settings.default, "default": settings.default, "mini": settings.mini}
        name = concrete.get(model, model) or settings.default
        if settings.offline or name.startswith("scripted"):
            # Only scripted models are built here: they read their file and
            # hold nothing open, where a client for an endpoint would.
            resolve_model(model, settings)


def workdir_of(path: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_dir():
        raise OrchestratorError(f"work directory {resolved} does not exist")
    return resolved


# -- commands ------------------------------------------------------------------------


async def _demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise OrchestratorError(f"--workdir {args.workdir} is not a directory")
    result = await run_demo(args.workdir, out=sys.stdout, sandbox=sandbox_of(args))
    return EXIT_CODES[result.signal]


def _reaction_rules(config_dir: Path) -> list[Reaction]:
    from .reactions import load_reactions

    path = config_dir / "reactions.toml"
    return load_reactions(path) if path.exists() else []


def _reactions(plane: ControlPlane, rules: list[Reaction]) -> Reactions | None:
    from .reactions import Reactions

    return Reactions(plane, rules) if rules else None


async def _run(args: argparse.Namespace) -> int:
    from .network import Network
    from .roles import find_role
    from .session import Session

    workdir = workdir_of(args.workdir)
    if not args.task.strip():
        raise OrchestratorError("TASK is empty: say what to do")
    if args.session is not None and not SESSION_ID.fullmatch(args.session):
        raise OrchestratorError(
            f"session id {args.session!r}: use 1-128 letters, digits, '.', '_' or '-'"
        )
    settings, models = _settings_and_models()
    # Configuration is read before anything starts, so a bad file is a clear error.
    if args.parent:
        find_role(args.role)  # an unknown role is a clear error before anything starts
    else:
        _check_agents(Network.load(), list(PIPELINE_PASSES), settings)
    hooks = _hooks(args.hooks, workdir / ".a2a")
    policy = _policy(args.policy, workdir / ".a2a")
    rules = _reaction_rules(workdir / ".a2a")
    _model_notice(settings)
    sandbox = sandbox_of(args)
    store = _new_store(args.store)
    settle()
    async with Session(
        store,
        workdir=workdir,
        models=models,
        session_id=args.session,
        title=args.task,
        sandbox=sandbox,
        policy=policy,
    ) as session:
        # `resume` finds the work directory here when it is not given one.
        await store.set_session_metadata(session.id, "workdir", str(workdir))
        say(f"session {session.id}  (a2a-orchestrator events {session.id})")
        if args.parent:
            return await _run_parent(args, session, models, hooks, rules)
        brief = Brief(task=TaskSpec(id=session.id[:8], title=args.task[:80], description=args.task))
        pipeline = Pipeline(session, brief, PassOptions(review_rounds=args.review_rounds))
        return await _follow_pipeline(session, pipeline, hooks, rules, workdir)


PIPELINE_PASSES = ("architect", "coder", "reviewer")


async def _follow_pipeline(
    session: Session,
    pipeline: Pipeline,
    hooks: Hooks,
    rules: list[Reaction],
    workdir: Path,
    *,
    resume: bool = False,
) -> int:
    """Run (or, `resume`, continue) `pipeline` with its live tree; the exit
    code is its signal."""
    from .control import ControlPlane
    from .session import RelayedEvent

    plane = ControlPlane(session, hooks=hooks)
    reactions = _reactions(plane, rules)
    tree = LiveTree(f"pipeline  session {session.id[:8]}", expected=list(PIPELINE_PASSES))
    # A stop request cancels the pipeline first, so no pass starts after it.
    session.add_stop_listener(pipeline.cancel)
    try:
        async with session.relay() as relay:
            if resume:
                # The passes that had finished show as they ended; then the
                # unfinished children (the pass under way among them) resume
                # inside the relay, so the tree sees their events.
                for _name, child_id, output in pipeline.recorded:
                    record = await session.store.get_child(child_id)
                    if output is not None and record is not None:
                        tree.show_earlier(
                            RelayedEvent(
                                child_id=child_id,
                                parent_id="",
                                agent=record.agent or record.role,
                                role=record.role,
                                transport=record.transport,
                                event=output,
                            )
                        )
                await session.recover()
            result = await tree.follow_while(relay, pipeline.run())
    except PipelineError as exc:
        say(f"\npipeline failed: {exc}")
        if session.stop_requested:
            say(STOPPED_LINE)
        return 1
    finally:
        if reactions is not None:
            reactions.close()
        plane.close()
    if not tree.live:
        tree.draw()
    say(f"\nsignal: {result.signal}   artifacts: {workdir / result.artifact_dir}")
    say(f"usage: {result.total.describe()}")
    return EXIT_CODES[result.signal]


async def _run_parent(
    args: argparse.Namespace,
    session: Session,
    models: Any,
    hooks: Hooks,
    rules: list[Reaction],
) -> int:
    """A parent agent's turn, then whatever it set going: its children, and the
    turns their events start in it (an observer's injections), until all rest."""
    from .parent import ParentAgent

    parent = await ParentAgent.restore(session, models("default"), role=args.role, hooks=hooks)
    reactions = _reactions(parent.plane, rules)
    tree = LiveTree(f"{args.role}  session {session.id[:8]}")

    async def show(event: ChildEvent) -> None:
        if event.kind != "message_delta":
            say(f"[{args.role}] {describe_event(event)}")

    parent.emit = show

    async def stop_turn() -> None:
        parent.conversation.abort("aborted", "stopped by `a2a-orchestrator stop`")

    session.add_stop_listener(stop_turn)

    async def everything() -> ChildEvent | None:
        await parent.run(args.task)
        while parent.conversation.running or any(h.running for h in session.children.values()):
            await session.wait_all()
            await anyio.sleep(0.05)
        return parent.last

    try:
        async with session.relay() as relay:
            outcome = await tree.follow_while(relay, everything())
    finally:
        if reactions is not None:
            reactions.close()
        parent.close()
    text = outcome.text if isinstance(outcome, Done) else getattr(outcome, "message", "")
    say("\n" + text)
    if session.stop_requested:
        say(STOPPED_LINE)
    signal: Signal = "TASK_FAILED"
    if isinstance(outcome, Done):
        signal = extract_signal(text) or "TASK_DONE"
    # `status` shows it, as it shows a pipeline's.
    await session.store.set_session_metadata(session.id, "signal", signal)
    return EXIT_CODES[signal]


async def _serve(args: argparse.Namespace) -> int:
    from .cards import CardOptions
    from .models import describe_model, is_scripted, resolve_model
    from .network import Network
    from .push import PushPolicy
    from .roles import find_role
    from .server import run_role_server
    from .session import keep_out_of_git

    workdir = workdir_of(args.workdir)
    # A role server keeps its journal (and by default its task store) there.
    keep_out_of_git(workdir / ".a2a")
    settings, models = _settings_and_models()
    port = args.port if args.port is not None else DEFAULT_PORTS.get(args.role, 9110)
    if not 0 <= port <= 65535:
        raise OrchestratorError(f"port {port} is not in 0..65535")
    access = access_of(args)
    sandbox = sandbox_of(args)
    metrics = metrics_of(args)
    common = dict(
        host=args.host,
        port=port,
        access=access,
        public_url=args.public_url,
        sandbox=sandbox,
        card_options=CardOptions.from_settings(
            protocol=args.protocol, key_path=args.card_key, key_id=args.card_key_id
        ),
        install_signal_handlers=True,
        grpc_port=_grpc_port(args),
        **metrics,
        push_policy=PushPolicy.from_settings(
            args.push_allow,
            max_per_task=args.push_max_per_task,
            max_per_owner=args.push_max_per_owner,
        ),
    )
    if args.role == "orchestrator":
        from .orchestrator import run_orchestrator_server

        db = args.db or str(workdir / ".a2a" / "tasks-orchestrator.db")
        store_path = args.store or workdir / ".a2a" / "orchestrator.db"
        # Hooks, reactions and policy are read beside a store file; a shared
        # (PostgreSQL) store has no directory, so from the work directory's .a2a.
        config_dir = store_path.parent if isinstance(store_path, Path) else workdir / ".a2a"
        network = Network.load()
        context = run_orchestrator_server(
            store_path=store_path,
            workdir=workdir,
            network=network,
            models=models,
            db=db,
            # Read beside the store, not from the work directory the agents
            # can write: in a container the store lives on a private volume.
            hooks=_hooks(None, config_dir),
            reactions=_reaction_rules(config_dir),
            policy=_policy(None, config_dir),
            lease_seconds=args.lease or float(os.environ.get("A2A_LEASE_SECONDS") or 15),
            **common,
        )
        name = "orchestrator"
        model_line = describe_model(models("default"))
        extra = [
            "  agents: "
            + ", ".join(
                f"{s.name}={'remote ' + str(s.url) if s.remote else 'in-process'}"
                for s in network.agents.values()
            ),
            "  control API: /api/sessions   store: "
            + (str(store_path) if isinstance(store_path, Path) else "PostgreSQL (replicas)"),
        ]
        scripted = settings.offline
        commands = any(not s.remote for s in network.agents.values())
    else:
        role = find_role(args.role)
        if args.model:
            role = role.with_overrides(model=args.model)
        model = resolve_model(role.model, settings)
        db = args.db or str(workdir / ".a2a" / f"tasks-{role.name}.db")
        context = run_role_server(
            role,
            model,
            workdir,
            db=db,
            models=models,
            replica=_replica(args, db),
            **_server_limits(args),
            **common,
        )
        name = role.name
        model_line = describe_model(model)
        extra = []
        scripted = is_scripted(model)
        commands = "run_command" in role.tools
        sandbox = sandbox.allowing_network(role.sandbox_network)
    settle()
    async with context as server:
        say(f"{name}: serving A2A at {server.url}")
        say(f"  agent card: {server.url}/.well-known/agent-card.json")
        if server.grpc_address is not None:
            say(f"  gRPC: {server.grpc_address} (preferred in the card)")
        say(f"  {model_line}")
        if scripted:
            say(f"  ({MODEL_HINT})")
        for line in extra:
            say(line)
        say(f"  work directory: {workdir}; task store: {db}")
        say(f"  metrics: {_describe_metrics(server.url, access is not None, **metrics)}")
        say(f"  auth: {access.describe() if access is not None else 'off'}")
        if commands:
            say(f"  commands: {sandbox.describe()}")
        await server.stopped.wait()
    say(f"{name}: stopped")
    return 0


def metrics_of(args: argparse.Namespace) -> dict[str, bool]:
    """`serve`'s metrics: --no-metrics / --metrics-public, else A2A_METRICS /
    A2A_METRICS_PUBLIC (on or off); on and behind auth by default."""

    def switch(name: str) -> bool | None:
        raw = os.environ.get(name, "").strip().lower()
        if raw in ("", "on", "off", "1", "0", "true", "false"):
            return None if not raw else raw in ("on", "1", "true")
        raise OrchestratorError(f"{name}={raw!r}: use on or off")

    return {
        "metrics": not args.no_metrics and switch("A2A_METRICS") is not False,
        "metrics_public": args.metrics_public or bool(switch("A2A_METRICS_PUBLIC")),
    }


def _describe_metrics(url: str, auth: bool, *, metrics: bool, metrics_public: bool) -> str:
    if not metrics:
        return "off"
    guard = "public" if metrics_public or not auth else "behind the same auth"
    return f"{url}/metrics ({guard})"


# -- callers (README: Identity and access) ------------------------------------------


def access_of(args: argparse.Namespace) -> Access | None:
    """`serve`'s callers: --token-env's token, the callers file, a JWT issuer
    (each flag, else its variable); None when none is set (no auth)."""
    from .access import Access

    leeway_raw = os.environ.get("A2A_JWT_LEEWAY", "").strip()
    try:
        leeway = args.jwt_leeway if args.jwt_leeway is not None else float(leeway_raw or 60)
    except ValueError:
        raise OrchestratorError(f"$A2A_JWT_LEEWAY must be a number, got {leeway_raw!r}") from None
    return Access.configure(
        token=os.environ.get(args.token_env) or None,
        callers_file=args.callers or os.environ.get("A2A_CALLERS_FILE") or None,
        issuer=args.jwt_issuer or os.environ.get("A2A_JWT_ISSUER") or None,
        audience=args.jwt_audience or os.environ.get("A2A_JWT_AUDIENCE") or None,
        jwks_url=args.jwt_jwks_url or os.environ.get("A2A_JWT_JWKS_URL") or None,
        leeway=leeway,
    )


async def _token(args: argparse.Namespace) -> int:
    from .callers import add_caller

    path = args.file or os.environ.get("A2A_CALLERS_FILE")
    if not path:
        raise OrchestratorError("which callers file? pass --file or set A2A_CALLERS_FILE")
    token = add_caller(path, args.name, replace=args.replace)
    print(
        f"caller {args.name!r} in {path}: its token follows, shown this once "
        "(the file keeps only its hash)",
        file=sys.stderr,
    )
    say(token)
    return 0


def _grpc_port(args: argparse.Namespace) -> int | None:
    """`serve`'s gRPC port: --grpc-port, else $A2A_GRPC_PORT (empty: none)."""
    if args.grpc_port is not None:
        return int(args.grpc_port)
    raw = os.environ.get("A2A_GRPC_PORT", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise OrchestratorError(f"$A2A_GRPC_PORT must be a port in 0..65535, got {raw!r}")
    return int(raw)


def _replica(args: argparse.Namespace, db: str) -> ReplicaSettings | None:
    """A replica's id and lease (the flags, else their variables) for a shared `db`."""
    from .server import is_replica_url

    if not is_replica_url(db):
        return None
    from .replicas import ReplicaSettings

    return ReplicaSettings.from_env(replica_id=args.replica_id, lease=args.lease_seconds)


def _server_limits(args: argparse.Namespace) -> dict[str, Any]:
    """`serve`'s allow-list and limits: the flag, else its variable, else the default."""

    def number(flag: float | None, name: str, variable: str, default: float) -> float:
        raw = os.environ.get(variable, "").strip()
        try:
            value = flag if flag is not None else float(raw) if raw else default
        except ValueError:
            raise OrchestratorError(f"${variable} must be a number, got {raw!r}") from None
        if not value > 0:
            raise OrchestratorError(f"{name} (or ${variable}) must be positive, got {value:g}")
        return value

    names = args.models if args.models is not None else os.environ.get("A2A_MODELS", "")
    megabytes = number(args.max_memory_mb, "--max-memory-mb", "A2A_MAX_MEMORY_MB", 256)
    return {
        "model_names": [n.strip() for n in names.split(",") if n.strip()],
        "max_memory": int(megabytes * 1024 * 1024),
        "body_timeout": number(args.body_timeout, "--body-timeout", "A2A_BODY_TIMEOUT", 30.0),
    }


def _signal_of(metadata: dict[str, Any]) -> str:
    """What `status` says of a session's outcome: the run's TASK_* signal, else
    `error` (a pipeline that failed), `unfinished` (one that has not ended) or `-`."""
    pipeline = metadata.get(PROGRESS_KEY) or {}
    signal = metadata.get("signal") or pipeline.get("signal")
    if signal:
        return str(signal)
    if pipeline.get("state") == "failed":
        return "error"
    return "unfinished" if pipeline else "-"


async def _status(args: argparse.Namespace) -> int:
    store = _existing_store(args.store)
    sessions = await store.list_sessions()
    if not sessions:
        say("no sessions")
        store.close()
        return 0
    rows = []
    for session in sessions:
        records = await store.list_children(session_id=session["id"])
        counts: dict[str, int] = {}
        for record in records:
            counts[record.status] = counts.get(record.status, 0) + 1
        states = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no children"
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(session["created_at"]))
        runner = await store.get_runner(session["id"])
        ran = f"{_runner_name(runner)}: {liveness(runner)}" if runner else "-"
        title = " ".join(session["title"].split())
        title = title if len(title) <= 50 else title[:49] + "…"
        spent = _usage_cell(await store.session_usage(session["id"]))
        signal = _signal_of(session["metadata"])
        rows.append((session["id"], started, signal, states, spent, ran, title))
    store.close()
    header = ("SESSION", "STARTED", "SIGNAL", "CHILDREN", "USAGE", "RUNNER", "TITLE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        say("  ".join([*cells, row[-1]]).rstrip())
    return 0


def _usage_cell(spent: Spend) -> str:
    """A spend in a table cell: tokens, and the cost when there is one."""
    return f"{spent.tokens}tok" + (f"/{spent.cost:.4f}" if spent.cost else "")


async def _children(args: argparse.Namespace) -> int:
    store = _existing_store(args.store)
    try:
        session_id = await session_id_of(store, args.session, args.store)
        own = await store.child_usage(session_id)
        subtree = await store.subtree_usage(session_id)
        for record in await store.list_children(session_id=session_id):
            where = record.url or "in-process"
            detail = f" ({record.reason})" if record.reason else ""
            mine = own.get(record.child_id, Spend())
            below = subtree.get(record.child_id, mine)
            # A parent's line also says what its whole subtree spent.
            spent = _usage_cell(mine) + (
                f" (subtree {_usage_cell(below)})" if below != mine else ""
            )
            say(
                f"{record.child_id}  {record.agent or record.role:<12} {record.status}"
                f"{detail:<12} {where}  {spent}  {' '.join(record.result.split())[:60]}"
            )
    finally:
        store.close()
    return 0


async def _events(args: argparse.Namespace) -> int:
    store = _existing_store(args.store)
    try:
        session_id = await session_id_of(store, args.session, args.store)
        child = None
        if args.child is not None:
            child = await _child_id_of(store, session_id, args.child)
        if args.jsonl and child is None:
            await store.export_jsonl(session_id, sys.stdout)
            return 0
        for event in await store.events(session_id, child_id=child):
            if args.jsonl:
                say(json.dumps(event.as_json(), ensure_ascii=False))
                continue
            who = event.child_id or "parent"
            if event.kind in CHILD_EVENT_KINDS:
                line = describe_event(event_from_dict(event.payload))
            else:
                # Records beside the transcript: inputs, steering, delivered
                # results, injections, control actions.
                detail = event.payload.get("text") or event.payload.get("action") or ""
                detail = detail or event.payload.get("error", "")
                line = f"{event.kind}: {' '.join(str(detail).split())[:100]}"
            say(f"{event.seq:>5}  {who:<12} {line}")
    finally:
        store.close()
    return 0


async def _stop(args: argparse.Namespace) -> int:
    import httpx

    if isinstance(args.store, str) or args.store.exists():
        # A short id is resolved here; the server's API takes whole ids. An
        # id this store does not know may still be the server's.
        with contextlib.closing(_existing_store(args.store)) as local:
            args.session = await session_id_of(local, args.session, args.store, missing_ok=True)
    token = os.environ.get(args.token_env)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{args.server}/api/sessions/{args.session}/subagents/stop"
    try:
        async with httpx.AsyncClient(timeout=120, headers=headers) as http:
            response = await http.post(url)
    except httpx.ConnectError:
        response = None  # no server: ask the session's runner, or act when it has none
    except httpx.HTTPError as exc:
        # A server that is there but slow still owns its children.
        raise OrchestratorError(f"{args.server} did not answer: {exc}") from exc
    if response is not None:
        if response.status_code == 200:
            say(f"stopped {response.json()['stopped']} (through {args.server})")
            return 0
        if response.status_code != 404:
            # The server runs, but refused (401: check the token): acting
            # behind its back would record as stopped what it still runs.
            raise OrchestratorError(
                f"{args.server} answered {response.status_code}: {response.text[:200]}"
            )
    store = _existing_store(args.store)
    try:
        if await store.get_session(args.session) is None:
            raise OrchestratorError(f"no session {args.session!r} in {args.store}")
        runner = await store.get_runner(args.session)
        if runner is None or liveness(runner) in (Liveness.ENDED, Liveness.DEAD):
            return await _stop_without_runner(store, args.session)
        return await _stop_through_runner(store, args.session, runner, args.wait)
    finally:
        store.close()


def _runner_name(runner: RunnerRecord) -> str:
    return f"pid {runner.pid} on {runner.host}"


def _cannot_stop(text: str, outcome: str = "nothing was recorded") -> int:
    print(f"error: {text}; {outcome}", file=sys.stderr, flush=True)
    return 1


async def _stop_through_runner(
    store: Store, session_id: str, runner: RunnerRecord, wait: float
) -> int:
    """Ask the live runner to stop its children, and report what the store then says."""
    state = liveness(runner)
    age = time.time() - runner.heartbeat_at
    if state is Liveness.ELSEWHERE:
        return _cannot_stop(
            f"session {session_id} is run by {_runner_name(runner)} (heartbeat {age:.0f} s ago), "
            "another host: stop it there, or through its orchestrator server (--server)"
        )
    if state is Liveness.HUNG:
        return _cannot_stop(
            f"session {session_id} is run by {_runner_name(runner)}, which is alive but has not "
            f"beaten for {age:.0f} s (stopped or blocked?), so its children cannot be stopped "
            "and are not abandoned either"
        )
    running = {
        r.child_id for r in await store.list_children(session_id=session_id, statuses=["running"])
    }
    request = uuidlib.uuid4().hex
    if await store.update_runner(session_id, runner.token, stop_request=request) is None:
        return _cannot_stop(f"another process took session {session_id} over; try again")
    note = ""
    if runner.stop_signal:
        try:
            os.kill(runner.pid, runner.stop_signal)
        except OSError as exc:
            # It still reads the request at its next heartbeat.
            note = f" (could not signal it: {exc.strerror or exc})"
    deadline = anyio.current_time() + wait
    while True:
        now = await store.get_runner(session_id)
        if now is None or now.token != runner.token:
            return _cannot_stop(f"another process took session {session_id} over; try again")
        still = {
            r.child_id
            for r in await store.list_children(session_id=session_id, statuses=["running"])
        } & running
        confirmed = now.stop_confirmed == request
        gone = liveness(now) in (Liveness.ENDED, Liveness.DEAD)
        if gone and still:
            # The runner ended (or crashed) without stopping them: nobody runs
            # them now, so they are stopped here.
            return await _stop_without_runner(store, session_id)
        if (confirmed or gone) and not still:
            break
        if anyio.current_time() > deadline:
            if confirmed:
                return _cannot_stop(
                    f"the runner of session {session_id} ({_runner_name(runner)}) stopped its "
                    f"children, but {len(still)} it does not hold are still marked running "
                    f"(`a2a-orchestrator children {session_id}`)",
                    "those were left as they are",
                )
            await store.update_runner(session_id, runner.token, stop_request="")
            return _cannot_stop(
                f"the runner of session {session_id} ({_runner_name(runner)}) did not confirm "
                f"the stop within {wait:g} s{note}"
            )
        await anyio.sleep(0.1)
    # The runner recorded how each child ended; count those it aborted.
    records = await store.list_children(session_id=session_id, statuses=["failed"])
    stopped = sum(1 for r in records if r.child_id in running and r.reason == "aborted")
    say(f"stopped {stopped} (by its runner, {_runner_name(runner)})")
    return 0


async def _stop_without_runner(store: Store, session_id: str) -> int:
    """No process runs the session: what the store says is running is not, so
    recording it aborted is the truth (remote children get CancelTask first)."""
    from .delegation import CANCELED_TEXT, ChildConfig
    from .network import AgentSpec, Network

    records = await store.list_children(session_id=session_id, statuses=["running"])
    if not records:
        say("stopped 0 (no live runner, and no child was running)")
        return 0
    from .delegation import Resume
    from .transports import RemoteDelegate

    network = Network.load()
    remote = RemoteDelegate()
    try:
        for record in records:
            if record.transport == "remote" and record.a2a_task_id:
                spec = network.agents.get(record.agent)
                target = AgentSpec(
                    name=record.agent,
                    role=record.role,
                    url=record.url,
                    token_env=spec.token_env if spec else None,
                )
                run = await remote.open(
                    target,
                    ChildConfig.from_dict(record.config),
                    child_id=record.child_id,
                    resume=Resume(task_id=record.a2a_task_id, context_id=record.a2a_context_id),
                )
                await run.cancel()
                await run.aclose()
            failed = Failed(reason="aborted", message=CANCELED_TEXT)
            await store.append_event(
                session_id,
                failed.kind,
                event_to_dict(failed),
                child_id=record.child_id,
                uuid=failed.uuid,
                child_changes={
                    "status": "failed",
                    "reason": "aborted",
                    "completed_at": time.time(),
                },
            )
    finally:
        await remote.aclose()
    say(f"no live runner; marked {len(records)} children aborted")
    return 0


async def _resume(args: argparse.Namespace) -> int:
    from .network import Network
    from .session import Session

    store = _existing_store(args.store)
    session_id = await session_id_of(store, args.session, args.store)
    row = await store.get_session(session_id) or {}
    metadata = row.get("metadata", {})
    # The work directory `run` recorded, unless told another.
    workdir = workdir_of(args.workdir or Path(metadata.get("workdir", ".")))
    settings, models = _settings_and_models()
    if (metadata.get(PROGRESS_KEY) or {}).get("state") == "running":
        # A pipeline to continue: its passes' configuration is checked first, as for `run`.
        _check_agents(Network.load(), list(PIPELINE_PASSES), settings)
    hooks = _hooks(None, workdir / ".a2a")
    policy = _policy(None, workdir / ".a2a")
    rules = _reaction_rules(workdir / ".a2a")
    sandbox = sandbox_of(args)
    settle()
    async with Session(
        store,
        workdir=workdir,
        models=models,
        session_id=session_id,
        sandbox=sandbox,
        policy=policy,
    ) as session:
        pipeline = await Pipeline.restore(session)
        if pipeline is not None:
            if pipeline.state == "done" and pipeline.signal is not None:
                say(f"nothing to resume: the pipeline had ended with {pipeline.signal}")
                say(f"signal: {pipeline.signal}   artifacts: {workdir / pipeline.artifact_dir}")
                return EXIT_CODES[pipeline.signal]
            if pipeline.finished:
                say(f"nothing to resume: the pipeline had failed: {pipeline.error}")
                return 1
            say(f"resuming the pipeline of session {session.id}")
            return await _follow_pipeline(session, pipeline, hooks, rules, workdir, resume=True)
        tree = LiveTree(f"resume  session {session.id[:8]}")
        async with session.relay() as relay:
            handles = await session.recover()
            if not handles:
                say("nothing to resume: every child had finished")
                return 0
            outcomes = await tree.follow_while(relay, session.wait_all())
        if not tree.live:
            tree.draw()
    failed = [o for o in outcomes.values() if isinstance(o, Failed)]
    say(f"\nresumed {len(handles)}; {len(failed)} failed")
    return 1 if failed else 0


def _stoppable(command: Callable[[argparse.Namespace], Awaitable[int]]) -> Any:
    """`command` runs sessions: while it runs, STOP_SIGNAL wakes their runners
    to read a stop request (`a2a-orchestrator stop` without a server)."""

    async def run(args: argparse.Namespace) -> int:
        async with stop_signal_listener():
            return await command(args)

    return run


ASYNC_COMMANDS = {
    "demo": _demo,
    "run": _stoppable(_run),
    "serve": _stoppable(_serve),
    "status": _status,
    "children": _children,
    "events": _events,
    "stop": _stop,
    "resume": _stoppable(_resume),
    "token": _token,
}
