"""How a session ended, as every view says it (`status`, the web view).

A session is run by a pipeline (its record in the session's metadata,
`pipeline.PROGRESS_KEY`) or by a parent agent (its turns stored with no
child id). Its outcome is read from those, whoever ran it (`run`, `serve
orchestrator`, a replica): the signal, the final answer or the failure.

A parent's answer that names no `TASK_*` signal is `NO_SIGNAL`, never
TASK_DONE: the answer did not say how the task went.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..control.pipeline import PROGRESS_KEY, extract_signal
from ..runtime.records import RecordKind
from ..storage.store import Store

__all__ = ["NO_SIGNAL", "Outcome", "RunKind", "outcome_of"]

NO_SIGNAL = "no signal"
"""What `status`, `run --parent` and the web view say of a parent agent's
answer that ends with no `TASK_*` line: it did not say how the task went."""

RunKind = Literal["pipeline", "parent", "none"]
"""What runs a session: a pipeline, a parent agent, or nothing yet (a
session an API client opened without a turn)."""

_PAGE = 1000


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a session ended, or that it has not."""

    run_kind: RunKind
    """What runs the session."""
    signal: str
    """`TASK_DONE`, `TASK_FAILED`, `TASK_SKIPPED`, `NO_SIGNAL`, `error` (a
    pipeline), `input required`, `unfinished` (running, or cut off: its
    runner says which), or `-` (nothing has run)."""
    answer: str = ""
    """The final answer (a parent's last text; a pipeline's review)."""
    failure: str = ""
    """What ended a failed run."""
    ended_at: float | None = None
    """When the run's last turn ended (None while it runs)."""

    @property
    def finished(self) -> bool:
        return self.signal not in ("unfinished", "-")


async def _root_events(
    store: Store, session_id: str, kinds: tuple[str, ...], after: int = 0
) -> list[dict[str, Any]]:
    """The root's events of `kinds` after `after`, oldest first."""
    ends: list[dict[str, Any]] = []
    while True:
        page = await store.events(session_id, after=after, limit=_PAGE, kinds=kinds)
        ends.extend(
            {"kind": e.kind, "payload": e.payload, "at": e.created_at, "seq": e.seq}
            for e in page
            if e.child_id is None
        )
        if len(page) < _PAGE:
            return ends
        after = page[-1].seq


async def outcome_of(store: Store, session: Mapping[str, Any]) -> Outcome:
    """The outcome of `session` (a store record, with its parsed metadata)."""
    metadata = session.get("metadata") or {}
    pipeline = metadata.get(PROGRESS_KEY)
    if pipeline:
        state = pipeline.get("state")
        steps = pipeline.get("steps") or []
        reviews = [s.get("text", "") for s in steps if s.get("pass") == "reviewer"]
        review = reviews[-1] if reviews else ""
        ended_at = pipeline.get("updated_at")
        if state == "done":
            signal = str(pipeline.get("signal") or NO_SIGNAL)
            return Outcome(run_kind="pipeline", signal=signal, answer=review, ended_at=ended_at)
        if state == "failed":
            failure = str(pipeline.get("error"))
            return Outcome(run_kind="pipeline", signal="error", failure=failure, ended_at=ended_at)
        return Outcome(run_kind="pipeline", signal="unfinished")
    # The last end through its usage row, then only the events after it: a
    # finished session's outcome costs its turns, not its whole event log
    # (`status` and the web view's list read every session's).
    last = await store.last_root_turn_end(session["id"])
    inputs = await _root_events(
        store, session["id"], (RecordKind.INPUT,), after=last.seq if last is not None else 0
    )
    if inputs:
        # A turn asked for after the last one ended (or the first) has not ended.
        return Outcome(run_kind="parent", signal="unfinished")
    if last is None:
        return Outcome(run_kind="none", signal="-")
    payload = last.payload
    if last.kind == "done":
        text = str(payload.get("text", ""))
        return Outcome(
            run_kind="parent",
            signal=extract_signal(text) or NO_SIGNAL,
            answer=text,
            ended_at=last.created_at,
        )
    if last.kind == "failed":
        failure = f"{payload.get('reason', 'error')}: {payload.get('message', '')}"
        return Outcome(
            run_kind="parent", signal="TASK_FAILED", failure=failure, ended_at=last.created_at
        )
    return Outcome(
        run_kind="parent",
        signal="input required",
        answer=str(payload.get("question", "")),
        ended_at=last.created_at,
    )
