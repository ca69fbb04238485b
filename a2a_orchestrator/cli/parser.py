"""The `a2a-orchestrator` command line's parser: every command's options and help.

Apart from `entry.py` (the entry point) so a command's handler can read the
parser's defaults (`serve` does) without importing the entry point."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .._version import __version__
from ..protocol.versions import GRPC_CARD_PATH, GRPC_CARDS, PROTOCOLS
from .defaults import DEFAULT_STORE, DEFAULT_TOKEN_ENV

__all__ = ["SESSION_HELP", "build_parser", "store_location"]


# -- the parser ---------------------------------------------------------------------


def _count(text: str) -> int:
    """A whole number of at least 1 (`--review-rounds`)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0..65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is not in 0..65535")
    return value


def _positive(text: str, must: str = "must be positive") -> float:
    """A positive, finite number (`--max-memory-mb`, `--body-timeout`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{must}, got {text}")
    return value


def _non_negative(text: str) -> float:
    """A finite number of seconds, 0 or more (`demo --pace`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (`--wait`)."""
    return _positive(text, "must be a positive number of seconds")


def store_location(text: str) -> Path | str:
    """A `--store` value: a PostgreSQL URL stays a string (`opening.py`), else a path."""
    scheme = text.split("://", 1)[0].split("+", 1)[0] if "://" in text else ""
    return text if scheme in ("postgresql", "postgres") else Path(text)


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        type=store_location,
        default=store_location(os.environ.get("A2A_STORE") or str(DEFAULT_STORE)),
        help=f"the orchestrator's store: a file, or postgresql://... shared by replicas "
        f"(default: $A2A_STORE or {DEFAULT_STORE})",
    )


def _sandbox_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run run_command's commands WITHOUT the bubblewrap sandbox (also "
        "A2A_SANDBOX=off); logged, and shown on the agent card",
    )
    parser.add_argument(
        "--allow-network",
        action="store_true",
        help="let sandboxed commands use the network (also A2A_SANDBOX_NETWORK=on; "
        "a role file can allow it for its role with sandbox_network: true)",
    )


SESSION_HELP = "session id, or any unique prefix of one"


def _access_options(parser: argparse.ArgumentParser) -> None:
    """Who may call a server besides the holder of --token-env's token (README:
    Identity and access)."""
    parser.add_argument(
        "--callers",
        type=Path,
        default=None,
        metavar="FILE",
        help="callers file: a token hash and limits per caller, reloaded when it changes "
        "(default: $A2A_CALLERS_FILE; make entries with `token add`)",
    )
    parser.add_argument(
        "--jwt-issuer",
        default=None,
        metavar="URL",
        help="accept OAuth2 bearer JWTs from this issuer; keys found by OpenID discovery "
        "(default: $A2A_JWT_ISSUER)",
    )
    parser.add_argument(
        "--jwt-audience",
        default=None,
        metavar="AUD",
        help="the audience (aud) a JWT must name (default: $A2A_JWT_AUDIENCE)",
    )
    parser.add_argument(
        "--jwt-jwks-url",
        default=None,
        metavar="URL",
        help="the issuer's JWKS, instead of discovery (default: $A2A_JWT_JWKS_URL)",
    )
    parser.add_argument(
        "--jwt-leeway",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds of clock skew allowed on a JWT's times (default: $A2A_JWT_LEEWAY or 60)",
    )


def _input_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-input",
        action="store_true",
        help="never ask at the terminal: an agent's question (ask_parent) is answered that "
        "nobody can answer now, and it goes on with its own assumption (the default "
        "without a terminal)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2a-orchestrator",
        description="An A2A agent network: role agents as A2A servers, and an orchestrator "
        "that delegates to them, remote or in-process, through one interface.",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log more, with tracebacks of failures"
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="run the offline demo: four role servers and the pipeline, scripted model",
        description="Start the four role servers on 127.0.0.1 with a scripted model (no API "
        "key, no network), run the architect -> coder -> reviewer pipeline on a sample "
        "project through the real network, show it live, and print where the artifacts are.",
    )
    demo.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where to put the sample project: a new or empty directory (a directory "
        "with files is refused) (default: a new temp dir)",
    )
    demo.add_argument(
        "--pace",
        type=_non_negative,
        default=None,
        metavar="SECONDS",
        help="hold each model turn this long, so the tree can be watched; 0 for none "
        "(default: 0.8 on a terminal, 0 in a pipe)",
    )
    _sandbox_options(demo)

    run = commands.add_parser(
        "run",
        help="run a task through the network in this process",
        description="Run TASK with the architect -> coder -> reviewer pipeline (default) or a "
        "parent agent, showing the network live; the exit code is the task's signal "
        "(TASK_DONE 0, TASK_FAILED 1, TASK_SKIPPED 3). Hooks, the spawn policy and "
        "reactions are read from .a2a/hooks.toml, .a2a/policy.toml and .a2a/reactions.toml "
        "in the work directory.",
    )
    run.add_argument("task", metavar="TASK", help="what to do")
    run.add_argument("--workdir", type=Path, default=Path("."), help="the project directory")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--pipeline", action="store_true", help="architect -> coder -> reviewer")
    mode.add_argument(
        "--parent", action="store_true", help="a parent agent that delegates with its tools"
    )
    run.add_argument(
        "--role",
        default="orchestrator",
        help="with --parent: the parent's role (orchestrator, observer, or your own)",
    )
    run.add_argument(
        "--session",
        default=None,
        help="a new session's id, or an existing session's id or unique prefix, which needs "
        "--append (default: a new session)",
    )
    run.add_argument(
        "--append",
        action="store_true",
        help="with --session: add this run to that existing session (its children and "
        "events stay; refused without it)",
    )
    run.add_argument(
        "--review-rounds", type=_count, default=1, help="reviews before giving up (at least 1)"
    )
    run.add_argument("--hooks", type=Path, default=None, help="hook file (default .a2a/hooks.toml)")
    run.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="spawn policy file (default .a2a/policy.toml)",
    )
    _input_option(run)
    _store_option(run)
    _sandbox_options(run)

    serve = commands.add_parser(
        "serve",
        help="run one role, or the orchestrator, as an A2A server",
        description="Run ROLE as an A2A v1.0 server (JSON-RPC at /, HTTP+JSON under /rest, "
        "agent card at /.well-known/agent-card.json), until Ctrl-C or SIGTERM. "
        "`serve orchestrator` serves the whole network as one agent, with the HTTP "
        "control API under /api.",
    )
    serve.add_argument(
        "role", metavar="ROLE", help="orchestrator, or a role: architect, coder, ..."
    )
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    serve.add_argument(
        "--port",
        type=_port,
        default=None,
        help="port, 0 for any free one (default: 9100-9104 for the shipped ones, else 9110)",
    )
    serve.add_argument(
        "--db",
        default=None,
        help="task store: a file path or SQLAlchemy async URL "
        "(default: .a2a/tasks-ROLE.db under the work directory)",
    )
    serve.add_argument(
        "--workdir", type=Path, default=Path("."), help="the work directory tools are confined to"
    )
    serve.add_argument(
        "--public-url", default=None, help="URL the card advertises, when clients use another name"
    )
    serve.add_argument(
        "--grpc-port",
        type=_port,
        default=None,
        help="also serve A2A over gRPC on this port (0: any free one), preferred in the card; "
        "same host, tasks and auth (default: $A2A_GRPC_PORT, else no gRPC)",
    )
    serve.add_argument(
        "--grpc-card",
        choices=GRPC_CARDS,
        default=None,
        help="with --grpc-port, the card that lists gRPC: main (the agent card) or separate "
        f"(only a second card, at {GRPC_CARD_PATH}: the agent card then lists HTTP "
        "endpoints only, as stock Google ADK clients require) (default: $A2A_GRPC_CARD or main)",
    )
    serve.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        help=f"environment variable holding the bearer token; auth is on when it is set "
        f"(default: {DEFAULT_TOKEN_ENV})",
    )
    serve.add_argument(
        "--model",
        default=None,
        help="role servers: override the role's model name (the orchestrator's agents "
        "each use their own role's model)",
    )
    serve.add_argument(
        "--models",
        default=None,
        help="comma-separated model names a caller (or the orchestrator's parent agent) may "
        "choose for a child, besides default, mini and the role file's `models` "
        "(default: $A2A_MODELS)",
    )
    serve.add_argument(
        "--max-memory-mb",
        type=_positive,
        default=None,
        help="role servers: size of the conversations kept in memory; the oldest idle ones "
        "are rebuilt from the task store (default: $A2A_MAX_MEMORY_MB or 256)",
    )
    serve.add_argument(
        "--body-timeout",
        type=_positive,
        default=None,
        help="seconds a client has to send a request body, else 408 "
        "(default: $A2A_BODY_TIMEOUT or 30)",
    )
    serve.add_argument(
        "--store",
        type=store_location,
        default=None,
        help="orchestrator only: its store, a file (default: .a2a/orchestrator.db under "
        "--workdir) or postgresql://... shared by orchestrator replicas ($A2A_STORE)",
    )
    serve.add_argument(
        "--lease",
        type=_seconds,
        default=None,
        help="replicas on PostgreSQL (a --store for the orchestrator, a --db for a role): "
        "seconds a lease lasts unrenewed, so how soon another replica takes over a dead "
        "one's work; same as --lease-seconds (default: $A2A_LEASE_SECONDS or 15)",
    )
    serve.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=None,
        help="A2A versions the agent card lists: both (1.0 and 0.3, so v0.3 peers can "
        "read it) or 1.0 (a card with v1.0 fields only) (default: $A2A_PROTOCOL or both)",
    )
    serve.add_argument(
        "--card-key",
        type=Path,
        default=None,
        help="PEM private key (RSA, EC, Ed25519) to sign the agent card with "
        "(default: $A2A_CARD_KEY, the key itself or its path; unset: unsigned)",
    )
    serve.add_argument(
        "--card-key-id",
        default=None,
        help="the signature's key id (default: $A2A_CARD_KEY_ID, else the key's "
        "RFC 7638 thumbprint)",
    )
    serve.add_argument(
        "--push-allow",
        default=None,
        metavar="CIDR,...",
        help="networks a caller's push notification webhook may be in besides public "
        "addresses, e.g. 10.0.0.0/8 (default: $A2A_PUSH_ALLOW; unset: public addresses only)",
    )
    serve.add_argument(
        "--push-max-per-task",
        type=_count,
        default=None,
        metavar="N",
        help="push notification configs one task may have, all callers' together "
        "(default: $A2A_PUSH_MAX_PER_TASK or 10)",
    )
    serve.add_argument(
        "--push-max-per-owner",
        type=_count,
        default=None,
        metavar="N",
        help="push notification configs one caller may have, all tasks together "
        "(default: $A2A_PUSH_MAX_PER_OWNER or 1000)",
    )
    serve.add_argument(
        "--max-streams-per-caller",
        type=_count,
        default=None,
        metavar="N",
        help="A2A event streams one caller may hold open, past it refused (HTTP 429 on "
        "HTTP+JSON); the web view's at most 16 of it "
        "(default: $A2A_MAX_STREAMS_PER_CALLER or 512)",
    )
    serve.add_argument(
        "--max-streams",
        type=_count,
        default=None,
        metavar="N",
        help="A2A event streams the server holds open, all callers together, and as "
        "many web view streams (default: $A2A_MAX_STREAMS or 2048)",
    )
    serve.add_argument(
        "--lease-seconds",
        type=_positive,
        default=None,
        help="replicas (a PostgreSQL --db, or the orchestrator's --store): how long a "
        "replica's lease outlives its last renewal, so how soon another replica adopts a "
        "dead one's work; same as --lease (default: $A2A_LEASE_SECONDS or 15)",
    )
    serve.add_argument(
        "--replica-id",
        default=None,
        help="role replicas: this replica's name in the lease table, made unique per process "
        "(default: $A2A_REPLICA_ID, else the host name; the orchestrator names its "
        "replicas by their URL)",
    )
    _sandbox_options(serve)
    _access_options(serve)
    serve.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve /metrics without auth, for a scraper on a trusted network "
        "(also A2A_METRICS_PUBLIC=on; the A2A endpoints and /api still ask)",
    )
    serve.add_argument(
        "--no-metrics",
        action="store_true",
        help="serve no Prometheus /metrics (also A2A_METRICS=off)",
    )

    token = commands.add_parser(
        "token",
        help="manage the callers file of a server",
        description="Manage the callers file a server reads with --callers: each caller's "
        "token is stored as a salted hash, never in the clear.",
    )
    token_actions = token.add_subparsers(
        dest="action", metavar="ACTION", required=True, help="add: give a caller a new token"
    )
    token_add = token_actions.add_parser(
        "add",
        help="give a caller a new token",
        description="Give caller NAME a new random token: its hash goes into the callers "
        "file (created if missing, readable by you only) and the token is printed once, "
        "on stdout. A running server picks the change up at its next request.",
    )
    token_add.add_argument("name", metavar="NAME", help="the caller's name")
    token_add.add_argument(
        "--file", type=Path, default=None, help="the callers file (default: $A2A_CALLERS_FILE)"
    )
    token_add.add_argument(
        "--replace",
        action="store_true",
        help="the caller exists: replace its token (the old one stops working)",
    )

    up = commands.add_parser(
        "up",
        help="start every agent in agents/ and the orchestrator as local processes",
        description="Start each in-process agent of the network as a role server on its port, "
        "wait for their cards, then the orchestrator pointed at them; print the URLs and "
        "stop them all on Ctrl-C.",
    )
    up.add_argument("--workdir", type=Path, default=Path("."), help="the work directory")
    up.add_argument("--port", type=_port, default=9100, help="the orchestrator's port")
    _sandbox_options(up)

    status = commands.add_parser(
        "status",
        help="list the sessions in the store",
        description="List the sessions in the store: id, start, signal (the run's TASK_* "
        "signal; `error` for a pipeline that failed, `unfinished` for one that has not "
        "ended), their children's states, the process that runs or ran each, and the title.",
    )
    _store_option(status)

    children = commands.add_parser(
        "children", help="list a session's children", description="List a session's children."
    )
    children.add_argument("session", metavar="SESSION", help=SESSION_HELP)
    _store_option(children)

    events = commands.add_parser(
        "events",
        help="show a session's event log",
        description="Show a session's event log, or write it as JSON lines.",
    )
    events.add_argument("session", metavar="SESSION", help=SESSION_HELP)
    events.add_argument("--jsonl", action="store_true", help="one JSON object per line")
    events.add_argument(
        "--child", default=None, help="only this child's events (its id or a unique prefix)"
    )
    _store_option(events)

    stop = commands.add_parser(
        "stop",
        help="stop a session's running children",
        description="Stop every running child of SESSION: through the orchestrator server's "
        "API when it runs the session; else the process that runs it (the store's runner "
        "record: `run`, `resume`, `serve orchestrator`) is signalled on this host and stops "
        "them itself; when no process runs it, they are recorded aborted here (remote "
        "children get CancelTask). Exit 0 when stopped, 1 when the runner cannot be reached "
        "(another host, hung, no confirmation within --wait: nothing is recorded).",
    )
    stop.add_argument("session", metavar="SESSION", help=SESSION_HELP)
    stop.add_argument(
        "--server", default="http://127.0.0.1:9100", help="the orchestrator server to ask first"
    )
    stop.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        help=f"environment variable with the server's bearer token (default: {DEFAULT_TOKEN_ENV})",
    )
    stop.add_argument(
        "--wait",
        type=_seconds,
        default=10.0,
        help="seconds to wait for the session's runner to confirm the stop (10)",
    )
    _store_option(stop)

    resume = commands.add_parser(
        "resume",
        help="resume a session: its pipeline, or its unfinished children",
        description="Resume SESSION after a crash. A pipeline continues from its first "
        "unfinished pass (the pass under way resumes its child; finished passes are not run "
        "again), writes its artifacts and exits with its signal like `run`. Otherwise its "
        "unfinished children resume (local ones from their transcripts, remote ones "
        "re-attached) until they finish; exit 1 if one failed.",
    )
    resume.add_argument("session", metavar="SESSION", help=SESSION_HELP)
    resume.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="the project directory (default: the one `run` recorded, else .)",
    )
    _input_option(resume)
    _store_option(resume)
    _sandbox_options(resume)

    # Beside its handler (`commands/send.py`), which imports what it uses when it runs.
    from .commands.send import add_parser as add_send_parser

    add_send_parser(commands)
    return parser
