"""What the web view tells of a session beyond its children's rows: what was
asked (the title), how it ended (`outcome.py`), who runs it (the root of the
tree: the parent agent, or the pipeline with its passes, pending ones too),
the spawns refused and why, what a running turn has spent so far, and how
long each part took.

`Story` follows a session's stored events one at a time (the page's tree
reads them in order, `ui._Tree`), so a long session costs nothing more per
update; `frame` puts its rows around the children's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..control.pipeline import PASSES, PROGRESS_KEY
from ..runtime.budgets import Spend
from ..runtime.records import RecordKind
from ..storage.store import ROOT_ID, TURN_END_KINDS, ChildRecord, Store, StoredEvent
from .outcome import Outcome, outcome_of

__all__ = ["ROOT_PATH", "Story", "elapsed", "frame", "header", "one_line", "root_record"]

ROOT_PATH = "root"
"""The root's page is the child page of this id (a child id is hex: never `root`)."""


def one_line(text: str, width: int = 120) -> str:
    """`text` on one line, cut to `width` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def root_record(session: Mapping[str, Any]) -> ChildRecord:
    """The session's root parent agent as its page shows it (it has no row
    of its own: its events are those stored with no child id)."""
    return ChildRecord(
        child_id=ROOT_PATH,
        session_id=session["id"],
        role="orchestrator",
        agent="parent agent",
        status="",
        transport="local",
        trace_id="",
        created_at=session.get("created_at") or 0.0,
    )


def elapsed(start: float | None, end: float | None) -> str:
    """`1m 05s`, `3.2 s`: from `start` to `end` (now, while it runs)."""
    if not start:
        return ""
    seconds = max((end or time.time()) - start, 0.0)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {rest:02d}s"


class Story:
    """What a session's events say beyond its children's rows, kept as they are read."""

    def __init__(self) -> None:
        self.in_flight: dict[str, Spend] = {}
        """The spend of each running turn so far (`ROOT_ID`: the root's), from
        the model calls its steps carry; a turn's end moves it to the totals."""
        self.refused: list[dict[str, Any]] = []
        """The spawns refused, in order: the asking parent, the role, the reason."""
        self.root_last = ""
        self.root_first: float | None = None
        self.root_latest: float | None = None

    def see(self, event: StoredEvent, summary: str) -> None:
        """Take one stored event (its line's `summary`), in order."""
        key = event.child_id or ROOT_ID
        if event.kind in TURN_END_KINDS:
            self.in_flight.pop(key, None)
        elif event.kind in ("message", "tool_called") and event.payload.get("spent"):
            self.in_flight[key] = self.in_flight.get(key, Spend()) + Spend.from_dict(
                event.payload["spent"]
            )
        if event.kind == RecordKind.SPAWN_REFUSED:
            self.refused.append(
                {
                    "parent": key,
                    "role": str(event.payload.get("role", "")),
                    "reason": str(event.payload.get("reason", "")),
                }
            )
        if event.child_id is None and event.kind != "message_delta":
            self.root_last = summary
            self.root_first = self.root_first or event.created_at
            self.root_latest = event.created_at


def _elapsed(record: Mapping[str, Any], outcome: Outcome, story: Story | None) -> str:
    """How long the session ran: until now while it runs; until its end once
    finished (its outcome's time, else its root's last event), "" when a
    finished session does not say when it ended (a record from before)."""
    if not outcome.finished:
        return elapsed(record.get("created_at"), None)
    end = outcome.ended_at or (story.root_latest if story is not None else None)
    return elapsed(record.get("created_at"), end) if end else ""


def _tokens(spend: Spend) -> dict[str, int]:
    return {"input_tokens": spend.input_tokens, "output_tokens": spend.output_tokens}


async def header(store: Store, record: Mapping[str, Any]) -> dict[str, Any]:
    """The session's title, outcome, total tokens and elapsed time."""
    outcome: Outcome = await outcome_of(store, record)
    total = await store.session_usage(record["id"])
    return {
        "title": record.get("title") or "",
        "signal": outcome.signal,
        "answer": outcome.answer,
        "failure": outcome.failure,
        "run_kind": outcome.run_kind,
        "tokens": total.tokens,
        **_tokens(total),
        "elapsed": _elapsed(record, outcome, None),
    }


def _root(
    record: Mapping[str, Any], story: Story, own: Spend, total: Spend, outcome: Outcome
) -> dict[str, Any]:
    pipeline = bool((record.get("metadata") or {}).get(PROGRESS_KEY))
    running = not outcome.finished
    # A pipeline calls no model itself: its tokens are its passes'.
    spent = total if pipeline else own + story.in_flight.get(ROOT_ID, Spend())
    return {
        "key": ROOT_PATH,
        "child_id": "",
        "link": "" if pipeline else ROOT_PATH,
        "depth": 0,
        "agent": "pipeline" if pipeline else "parent agent",
        "role": "architect → coder → reviewer" if pipeline else "orchestrator",
        "transport": "in-process",
        "status": outcome.signal,
        "state": "running" if running else "completed",
        "last": story.root_last,
        # The root runs the whole session: its time is the session's.
        "elapsed": _elapsed(record, outcome, story),
        **_tokens(spent),
    }


def frame(
    record: Mapping[str, Any],
    story: Story,
    children: list[dict[str, Any]],
    own: Mapping[str, Spend],
    outcome: Outcome,
) -> list[dict[str, Any]]:
    """The rows of the page's tree: the root (when something runs the
    session), its children below it, each refused spawn under the parent that
    asked, and a pipeline's passes still to come. `own`: each child's spend
    (`Store.child_usage`), the root's under `ROOT_ID`."""
    metadata = record.get("metadata") or {}
    pipeline = metadata.get(PROGRESS_KEY)
    has_root = bool(pipeline) or story.root_first is not None
    shift = 1 if has_root else 0
    rows: list[dict[str, Any]] = []
    if has_root:
        total = sum(own.values(), Spend())
        rows.append(_root(record, story, own.get(ROOT_ID, Spend()), total, outcome))
    depth_of = {ROOT_ID: 0}
    for row in children:
        rows.append({**row, "depth": row["depth"] + shift})
        depth_of[row["child_id"]] = row["depth"] + shift
    for refused in story.refused:
        # After the asking parent's subtree: where a child it got would be.
        parent = refused["parent"]
        depth = depth_of.get(parent, 0) + (1 if parent or has_root else 0)
        at = len(rows)
        start = next((i for i, r in enumerate(rows) if parent and r["child_id"] == parent), None)
        if start is not None:
            at = next((i for i in range(start + 1, len(rows)) if rows[i]["depth"] < depth), at)
        rows.insert(
            at,
            {
                "key": "",
                "child_id": "",
                "link": "",
                "depth": depth,
                "agent": refused["role"],
                "role": refused["role"],
                "transport": "",
                "status": "refused",
                "state": "refused",
                "last": refused["reason"],
                "elapsed": "",
                "input_tokens": 0,
                "output_tokens": 0,
            },
        )
    if pipeline and pipeline.get("state") not in ("done", "failed"):
        started = {step.get("pass") for step in pipeline.get("steps") or []}
        for name in PASSES:
            if name not in started:
                rows.append(
                    {
                        "key": "",
                        "child_id": "",
                        "link": "",
                        "depth": 1,
                        "agent": name,
                        "role": name,
                        "transport": "",
                        "status": "pending",
                        "state": "pending",
                        "last": "",
                        "elapsed": "",
                        "input_tokens": 0,
                        "output_tokens": 0,
                    }
                )
    return rows
