"""The commands that read a store: `status`, `children` and `events`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from ...delegation.runner import liveness
from ...orchestrator.outcome import outcome_of
from ...runtime.budgets import Spend
from ...runtime.events import CHILD_EVENT_KINDS, event_from_dict
from ...runtime.render import describe_event
from ...storage.store import ROOT_ID
from .common import child_id_of, existing_store, runner_name, say, session_id_of

__all__ = ["children", "events", "status"]


async def status(args: argparse.Namespace) -> int:
    store = existing_store(args.store)
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
        ran = f"{runner_name(runner)}: {liveness(runner)}" if runner else "-"
        title = " ".join(session["title"].split())
        title = title if len(title) <= 50 else title[:49] + "…"
        spent = _usage_cell(await store.session_usage(session["id"]))
        signal = (await outcome_of(store, session)).signal
        rows.append((session["id"], started, signal, states, spent, ran, title))
    store.close()
    _table(("SESSION", "STARTED", "SIGNAL", "CHILDREN", "USAGE", "RUNNER", "TITLE"), rows)
    return 0


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    """Rows under a header, in columns; the last column is not padded."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        say("  ".join([*cells, row[-1]]).rstrip())


def _usage_cell(spent: Spend) -> str:
    """A spend in a table cell: tokens, and the cost when there is one."""
    return f"{spent.tokens}tok" + (f"/{spent.cost:.4f}" if spent.cost else "")


async def children(args: argparse.Namespace) -> int:
    store = existing_store(args.store)
    try:
        session_id = await session_id_of(store, args.session, args.store)
        own = await store.child_usage(session_id)
        subtree = await store.subtree_usage(session_id)
        rows = []
        for record in await store.list_children(session_id=session_id):
            where = record.url or "in-process"
            detail = f" ({record.reason})" if record.reason else ""
            mine = own.get(record.child_id, Spend())
            below = subtree.get(record.child_id, mine)
            # A parent's line also says what its whole subtree spent.
            spent = _usage_cell(mine) + (
                f" (subtree {_usage_cell(below)})" if below != mine else ""
            )
            result = " ".join(record.result.split())[:60]
            agent = record.agent or record.role
            rows.append((record.child_id, agent, record.status + detail, where, spent, result))
        if rows:
            _table(("CHILD", "AGENT", "STATUS", "WHERE", "USAGE", "RESULT"), rows)
        else:
            say("no children")
        # The root parent agent's own calls, and the one sum `status` shows.
        if ROOT_ID in own:
            say(f"parent agent (the session's root): {_usage_cell(own[ROOT_ID])}")
        say(f"session total: {_usage_cell(await store.session_usage(session_id))}")
    finally:
        store.close()
    return 0


async def events(args: argparse.Namespace) -> int:
    store = existing_store(args.store)
    try:
        session_id = await session_id_of(store, args.session, args.store)
        child = None
        if args.child is not None:
            child = await child_id_of(store, session_id, args.child)
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
