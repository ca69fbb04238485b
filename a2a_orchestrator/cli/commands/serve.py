"""`serve` (a role server, or the orchestrator as an A2A server) with its
options (access, metrics, gRPC, replicas, limits), and `token`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import OrchestratorError
from ..defaults import DEFAULT_PORTS
from ..heap import settle

# Annotations only: the commands import what they run (see `__init__`).
if TYPE_CHECKING:
    from ...server.auth.access import Access
    from ...server.replicas import ReplicaSettings

from .common import (
    MODEL_HINT,
    hooks_of,
    policy_of,
    reaction_rules,
    sandbox_of,
    say,
    settings_and_models,
    workdir_of,
)

__all__ = [
    "ORCHESTRATOR_ONLY",
    "ROLE_ONLY",
    "access_of",
    "check_secret_files",
    "metrics_of",
    "secret_files",
    "serve",
    "token",
]

ROLE_ONLY = {
    "model": "the orchestrator's agents each use their own role's model "
    "(a role file's `model`; `default` is $A2A_MODEL_DEFAULT)",
    "max_memory_mb": "the orchestrator keeps no pool of idle conversations to bound; "
    "give it to the role servers of the agents it calls",
    "replica_id": "orchestrator replicas are named by their URL (--public-url)",
}
"""`serve` options a role server reads and the orchestrator does not, with
why: given to `serve orchestrator`, they are refused rather than ignored
(tests/cli/test_serve_flags.py walks every option against both kinds)."""
ORCHESTRATOR_ONLY = {
    "store": "a role server keeps its tasks in --db; the orchestrator's sessions are "
    "what --store holds",
}
"""`serve` options only the orchestrator reads, refused for a role server."""


async def serve(args: argparse.Namespace) -> int:
    from ...delegation.network import Network
    from ...delegation.session import keep_out_of_git
    from ...models import describe_model, is_scripted, resolve_model
    from ...protocol.cards import CardOptions
    from ...runtime.roles import find_role
    from ...server.app import run_role_server
    from ...server.push import PushPolicy
    from ...server.streams import StreamLimits

    _refuse_foreign_options(args)
    workdir = workdir_of(args.workdir)
    sandbox = sandbox_of(args)
    check_secret_files(secret_files(args), workdir, sandboxed=sandbox.enabled)
    # A role server keeps its journal (and by default its task store) there.
    keep_out_of_git(workdir / ".a2a")
    settings, models = settings_and_models()
    port = args.port if args.port is not None else DEFAULT_PORTS.get(args.role, 9110)
    if not 0 <= port <= 65535:
        raise OrchestratorError(f"port {port} is not in 0..65535")
    access = access_of(args)
    metrics = metrics_of(args)
    card_options = CardOptions.from_settings(
        protocol=args.protocol,
        key_path=args.card_key,
        key_id=args.card_key_id,
        grpc_card=args.grpc_card,
    )
    common = dict(
        host=args.host,
        port=port,
        access=access,
        public_url=args.public_url,
        sandbox=sandbox,
        card_options=card_options,
        install_signal_handlers=True,
        grpc_port=_grpc_port(args),
        **metrics,
        push_policy=PushPolicy.from_settings(
            args.push_allow,
            max_per_task=args.push_max_per_task,
            max_per_owner=args.push_max_per_owner,
        ),
        stream_limits=StreamLimits.from_settings(args.max_streams_per_caller, args.max_streams),
    )
    if args.role == "orchestrator":
        from ...orchestrator.app import run_orchestrator_server
        from ..parser import store_location

        db = args.db or str(workdir / ".a2a" / "tasks-orchestrator.db")
        from_env = os.environ.get("A2A_STORE")
        store_path = args.store or (
            store_location(from_env) if from_env else workdir / ".a2a" / "orchestrator.db"
        )
        limits = _server_limits(args)
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
            hooks=hooks_of(None, config_dir, workdir=workdir, sandboxed=sandbox.enabled),
            reactions=reaction_rules(config_dir),
            policy=policy_of(None, config_dir),
            lease_seconds=_lease(args) or float(os.environ.get("A2A_LEASE_SECONDS") or 15),
            body_timeout=limits["body_timeout"],
            model_names=limits["model_names"],
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
            listing = _grpc_listing(card_options.grpc_card, server.url)
            say(f"  gRPC: {server.grpc_address} ({listing})")
        say(f"  {model_line}")
        if scripted:
            say(f"  ({MODEL_HINT})")
        for line in extra:
            say(line)
        if name == "orchestrator":
            login = "  (log in with a caller token)" if access is not None else ""
            say(f"  web view: {server.url}/ui{login}")
        say(f"  work directory: {workdir}; task store: {db}")
        say(f"  metrics: {_describe_metrics(server.url, access is not None, **metrics)}")
        say(f"  auth: {access.describe() if access is not None else 'off'}")
        if commands:
            say(f"  commands: {sandbox.describe()}")
        await server.stopped.wait()
    say(f"{name}: stopped")
    return 0


def secret_files(args: argparse.Namespace) -> dict[str, Path]:
    """The files `serve` reads secrets from, by what they are: the callers
    file (its token hashes say who a caller is) and the card's signing key
    (each flag, else its variable; a key given as PEM text is no file)."""
    from ...protocol.cards import CARD_KEY_ENV

    files: dict[str, Path] = {}
    callers = args.callers or os.environ.get("A2A_CALLERS_FILE") or None
    if callers:
        files["the callers file"] = Path(callers)
    key = args.card_key or os.environ.get(CARD_KEY_ENV, "").strip() or None
    if key and not str(key).startswith("-----BEGIN"):
        files["the card key"] = Path(key).expanduser()
    return files


def check_secret_files(files: dict[str, Path], workdir: Path, *, sandboxed: bool) -> None:
    """Refuse a secret file the server's tools or commands could write: one
    inside the work directory, except in its `.a2a/` while commands run
    sandboxed (the file tools refuse `.a2a/` and the sandbox hides it). A
    model that rewrote the callers file would choose who a caller is."""
    from ...tools.reserved import STATE_DIR

    root = Path(os.path.realpath(workdir))
    state = root / STATE_DIR
    for what, path in files.items():
        # Where the file really is: a link from elsewhere into the work
        # directory is the work directory's file.
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(root) or (sandboxed and real.is_relative_to(state)):
            continue
        move = (
            "keep it outside the work directory (e.g. in /etc/a2a/ or ~/.config/a2a-orchestrator/)"
        )
        if sandboxed:
            move += f" or in {state}/, which tools and commands cannot reach"
        raise OrchestratorError(
            f"{what} {path} is inside the work directory {root}, where the server's tools "
            f"and commands can write it: {move}"
        )


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


def access_of(args: argparse.Namespace) -> Access | None:
    """`serve`'s callers: --token-env's token, the callers file, a JWT issuer
    (each flag, else its variable); None when none is set (no auth)."""
    from ...server.auth.access import Access

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


async def token(args: argparse.Namespace) -> int:
    from ...server.auth.callers import add_caller

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


def _grpc_listing(grpc_card: str, url: str) -> str:
    """Which card lists the gRPC binding, for the banner."""
    from ...protocol.versions import GRPC_CARD_PATH

    if grpc_card == "separate":
        return f"listed only in the card at {url}{GRPC_CARD_PATH}"
    return "preferred in the card"


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
    from ...server.app import is_replica_url

    if not is_replica_url(db):
        return None
    from ...server.replicas import ReplicaSettings

    return ReplicaSettings.from_env(replica_id=args.replica_id, lease=_lease(args))


def _lease(args: argparse.Namespace) -> float | None:
    """--lease and --lease-seconds: one setting under two names (the
    orchestrator's and a role's, both read by both); None when neither is given."""
    if args.lease is not None and args.lease_seconds is not None:
        if args.lease != args.lease_seconds:
            raise OrchestratorError(
                f"--lease {args.lease:g} and --lease-seconds {args.lease_seconds:g} name "
                "the same setting: give one"
            )
    return args.lease if args.lease is not None else args.lease_seconds


def _refuse_foreign_options(args: argparse.Namespace) -> None:
    """An option the other kind of server reads is an error here, not ignored;
    so are two values for the one lease setting."""
    from ..parser import build_parser

    _lease(args)
    orchestrator = args.role == "orchestrator"
    foreign = ROLE_ONLY if orchestrator else ORCHESTRATOR_ONLY
    kind = "serve orchestrator" if orchestrator else f"serve {args.role} (a role server)"
    # The options' defaults, as the parser gives them to a bare `serve ROLE`.
    defaults = vars(build_parser().parse_args(["serve", args.role]))
    for dest, why in foreign.items():
        if getattr(args, dest) != defaults[dest]:
            flag = "--" + dest.replace("_", "-")
            raise OrchestratorError(f"{kind} does not take {flag}: {why}")


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
