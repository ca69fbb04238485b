"""`a2a-orchestrator serve ...` killed between two of its SQLite commits.

Run as `python crash_serve.py STATEMENT serve ROLE --port ... --db ...`: the
role server runs as the CLI runs it, and SIGKILLs itself at the first
statement after the commit of the transaction that ran STATEMENT (the start
of an SQL statement, as SQLite's trace shows it), on any of its SQLite
connections: what it had not written by then is lost, as in a crash at
that instant, every run.
"""

from __future__ import annotations

import os
import runpy
import signal
import sqlite3
import sys
from typing import Any

STATEMENT = sys.argv.pop(1)
_state = {"seen": False, "committed": False}


def _trace(sql: str) -> None:
    if _state["committed"]:
        os.kill(os.getpid(), signal.SIGKILL)
    if sql.strip().startswith(STATEMENT):
        _state["seen"] = True
    elif _state["seen"] and sql.strip().upper() == "COMMIT":
        _state["committed"] = True


_connect = sqlite3.connect


def _traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    conn = _connect(*args, **kwargs)
    conn.set_trace_callback(_trace)
    return conn


sqlite3.connect = _traced  # type: ignore[assignment]
runpy.run_module("a2a_orchestrator.cli", run_name="__main__", alter_sys=True)
