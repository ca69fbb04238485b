"""The `a2a-orchestrator` command line: its entry point."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from ..errors import OrchestratorError
from .parser import build_parser

__all__ = ["TRACED_COMMANDS", "main", "service_name"]


class _BriefFormatter(logging.Formatter):
    """Log records without tracebacks: a failure a log line reports (a child
    whose agent answered badly) is one line naming the error; `-v` shows the
    traceback."""

    def formatException(self, ei: Any) -> str:
        exc = ei[1]
        return f"  ({type(exc).__name__}: {exc}; -v shows the traceback)" if exc else ""


def _expected(exc: BaseException) -> list[BaseException] | None:
    """The expected failures `exc` is made of (an ExceptionGroup from a task
    group may wrap them), or None when any part of it is not one."""
    if isinstance(exc, BaseExceptionGroup):
        found: list[BaseException] = []
        for inner in exc.exceptions:
            parts = _expected(inner)
            if parts is None:
                return None
            found.extend(parts)
        return found
    return [exc] if isinstance(exc, OrchestratorError | OSError) else None


TRACED_COMMANDS = frozenset({"demo", "run", "serve", "resume"})


def service_name(args: argparse.Namespace) -> str:
    """The service.name of a command's spans: `a2a-ROLE` for `serve ROLE`,
    `a2a-orchestrator` for the commands that run sessions here."""
    role = getattr(args, "role", None) if args.command == "serve" else None
    return f"a2a-{role}" if role else "a2a-orchestrator"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (see `EXIT_CODES`; 2: bad usage or
    configuration, 130: interrupted). Expected failures are one line on
    stderr, never a traceback."""
    args = build_parser().parse_args(argv)
    handler = logging.StreamHandler()
    log_format = "%(levelname)s %(name)s: %(message)s"
    handler.setFormatter(
        logging.Formatter(log_format) if args.verbose else _BriefFormatter(log_format)
    )
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    try:
        from ..observe.tracing import quiet_sdk_spans

        # Before a2a-sdk is imported: it reads the switch then.
        quiet_sdk_spans()
        # Imported once the command is known: `--help` and a usage error need
        # neither, and the commands import much more than the parser does.
        if args.command == "up":
            from .up import up

            return up(args)
        from ..observe.tracing import exporting
        from .commands import ASYNC_COMMANDS

        # The commands that do the work trace it: their spans go out (and
        # are flushed at the end) when OTEL_* ask for it.
        traced = args.command in TRACED_COMMANDS
        with exporting(service_name(args)) if traced else contextlib.nullcontext():
            return int(anyio.run(ASYNC_COMMANDS[args.command], args))
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        # Children still running stay `running` in the store: `resume` continues them.
        print("interrupted", file=sys.stderr)
        return 130
    except BaseException as exc:
        failures = _expected(exc)
        if failures is None:
            raise  # a bug: its traceback is what a report needs
        for failure in failures:
            # An OSError is typically a port that is taken; it says which.
            print(f"error: {failure}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
