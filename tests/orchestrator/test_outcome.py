"""`outcome_of`: how a session ended, read from what its run stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from a2a_orchestrator.control.pipeline import PROGRESS_KEY
from a2a_orchestrator.orchestrator.outcome import NO_SIGNAL, outcome_of
from a2a_orchestrator.runtime.events import Done, Failed, event_to_dict
from a2a_orchestrator.runtime.records import RecordKind
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio


async def told(store: Store, session_id: str) -> tuple[str, str, str]:
    outcome = await outcome_of(store, await store.get_session(session_id) or {})
    return outcome.signal, outcome.answer, outcome.failure


async def test_a_parents_outcome_is_its_last_turns_end(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        store = Store(tmp_path / "s.db")
        try:
            for sid in ("none", "done", "plain", "failed", "again", "child-only"):
                await store.create_session(sid)
            await store.append_event("done", RecordKind.INPUT, {"text": "go"})
            await store.append_event("done", "done", event_to_dict(Done(text="Fixed.\nTASK_DONE")))
            await store.append_event("plain", RecordKind.INPUT, {"text": "go"})
            await store.append_event("plain", "done", event_to_dict(Done(text="Here is a view.")))
            await store.append_event("failed", RecordKind.INPUT, {"text": "go"})
            failed = Failed(reason="max_turns", message="out of steps")
            await store.append_event("failed", "failed", event_to_dict(failed))
            # A second turn asked for after the first ended: not ended yet.
            await store.append_event("again", RecordKind.INPUT, {"text": "go"})
            await store.append_event("again", "done", event_to_dict(Done(text="x\nTASK_DONE")))
            await store.append_event("again", RecordKind.INPUT, {"text": "and then?"})
            # A child's end is not the session's.
            child = event_to_dict(Done(text="TASK_FAILED"))
            await store.append_event("child-only", "done", child, child_id="c1")
            found = {sid: await told(store, sid) for sid in ("none", "done", "plain", "failed")}
            again = await told(store, "again")
            child_only = await told(store, "child-only")
        finally:
            store.close()
        assert found == {
            "none": ("-", "", ""),
            "done": ("TASK_DONE", "Fixed.\nTASK_DONE", ""),
            "plain": (NO_SIGNAL, "Here is a view.", ""),
            "failed": ("TASK_FAILED", "", "max_turns: out of steps"),
        }
        assert again[0] == "unfinished" and child_only[0] == "-"


async def test_a_pipelines_outcome_is_its_record(tmp_path: Path) -> None:
    with anyio.fail_after(20):
        store = Store(tmp_path / "s.db")
        try:
            steps = [{"pass": "reviewer", "child_id": "r", "text": "Good.\nTASK_DONE"}]
            records = {
                "done": {"state": "done", "signal": "TASK_DONE", "steps": steps, "updated_at": 5.0},
                "failed": {"state": "failed", "error": "coder pass: model down", "steps": []},
                "running": {"state": "running", "steps": []},
            }
            for sid, record in records.items():
                await store.create_session(sid)
                await store.set_session_metadata(sid, PROGRESS_KEY, record)
            found = {sid: await told(store, sid) for sid in records}
            done = await outcome_of(store, await store.get_session("done") or {})
        finally:
            store.close()
        assert found == {
            "done": ("TASK_DONE", "Good.\nTASK_DONE", ""),
            "failed": ("error", "", "coder pass: model down"),
            "running": ("unfinished", "", ""),
        }
        assert done.ended_at == 5.0 and done.run_kind == "pipeline"


async def test_a_finished_sessions_outcome_costs_its_turns_not_its_events(tmp_path: Path) -> None:
    """`status` and the web view's list read every session's outcome: a
    finished parent run's must read neither its whole event log nor the
    other sessions' turns. Measured in SQLite virtual machine steps
    (deterministic, unlike a time): a session with 10 events of its
    children, one with 20,000, and the first again once 2,000 other
    sessions have ended their parent's turns."""

    def session(sid: str, messages: int) -> list[Any]:
        entries: list[Any] = [(sid, None, RecordKind.INPUT, {"text": "go"}, None)]
        entries += [(sid, "c", "message", {"text": "x"}, None)] * messages
        entries.append((sid, "c", "done", {"text": "ok"}, None))
        entries.append((sid, None, "done", event_to_dict(Done(text="Done.\nTASK_DONE")), None))
        return entries

    async def steps(store: Store, sid: str) -> int:
        counted = [0]

        def count() -> int:
            counted[0] += 1
            return 0  # go on

        store._db.conn.set_progress_handler(count, 100)
        try:
            assert (await told(store, sid))[0] == "TASK_DONE"
        finally:
            store._db.conn.set_progress_handler(None, 0)
        return counted[0]

    with anyio.fail_after(60):
        store = Store(tmp_path / "s.db")
        try:
            for sid, messages in (("small", 10), ("big", 20_000)):
                await store.create_session(sid)
                await store.append_events(session(sid, messages))
            small = await steps(store, "small")
            big = await steps(store, "big")
            others = [f"other-{i}" for i in range(2000)]
            for sid in others:
                await store.create_session(sid)
            await store.append_events([e for sid in others for e in session(sid, 0)])
            crowded = await steps(store, "small")
        finally:
            store.close()
    assert big <= 2 * small + 10 and crowded <= 2 * small + 10, (small, big, crowded)
