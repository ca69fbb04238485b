"""The `a2a-orchestrator` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio

from .errors import OrchestratorError
from .models import ModelSettings, describe_model, is_scripted, resolve_model
from .roles import find_role
from .server import run_role_server

__all__ = ["DEFAULT_PORTS", "build_parser", "main"]

DEFAULT_PORTS = {"orchestrator": 9100, "architect": 9101, "coder": 9102, "reviewer": 9103}
"""Where `serve` listens by default; other roles default to 9110."""
DEFAULT_TOKEN_ENV = "A2A_AUTH_TOKEN"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="a2a-orchestrator",
        description="An A2A agent network: role agents as A2A servers, and an orchestrator "
        "that delegates to them.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = commands.add_parser(
        "serve",
        help="run one role as an A2A server",
        description="Run ROLE as an A2A v1.0 server (JSON-RPC at /, HTTP+JSON under /rest, "
        "agent card at /.well-known/agent-card.json), until Ctrl-C or SIGTERM.",
    )
    serve.add_argument("role", metavar="ROLE", help="role name, e.g. architect, coder, reviewer")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on")
    serve.add_argument(
        "--port", type=int, default=None, help="port (default: 9101-9103 for the shipped roles)"
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
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        help=f"environment variable holding the bearer token; auth is on when it is set "
        f"(default: {DEFAULT_TOKEN_ENV})",
    )
    serve.add_argument("--model", default=None, help="override the role's model name")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    role = find_role(args.role)
    if args.model:
        role = role.with_overrides(model=args.model)
    workdir = args.workdir.resolve()
    if not workdir.is_dir():
        raise OrchestratorError(f"work directory {workdir} does not exist")
    settings = ModelSettings.from_env()
    model = resolve_model(role.model, settings)
    db = args.db or str(workdir / ".a2a" / f"tasks-{role.name}.db")
    port = args.port if args.port is not None else DEFAULT_PORTS.get(role.name, 9110)
    token = os.environ.get(args.token_env) or None
    async with run_role_server(
        role,
        model,
        workdir,
        db=db,
        host=args.host,
        port=port,
        token=token,
        public_url=args.public_url,
        models=lambda name: resolve_model(name, settings),
        install_signal_handlers=True,
    ) as server:
        print(f"{role.name}: serving A2A at {server.url}", flush=True)
        print(f"  agent card: {server.url}/.well-known/agent-card.json", flush=True)
        print(f"  {describe_model(model)}", flush=True)
        if is_scripted(model):
            print(
                "  (set A2A_MODEL_BASE_URL and A2A_MODEL_API_KEY to use a real "
                "OpenAI-compatible model)",
                flush=True,
            )
        print(f"  work directory: {workdir}; task store: {db}", flush=True)
        print(f"  auth: {'bearer token from $' + args.token_env if token else 'off'}", flush=True)
        await server.stopped.wait()
    print(f"{role.name}: stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "serve":
            anyio.run(_serve, args)
    except OrchestratorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # Typically the port is taken; say which.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
