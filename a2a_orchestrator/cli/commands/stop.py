"""`stop`: through the session's runner when it has one, else in the store."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid as uuidlib

import anyio

from ...delegation.runner import Liveness, liveness
from ...errors import OrchestratorError
from ...runtime.events import Failed, event_to_dict
from ...storage.store import RunnerRecord, Store
from .common import existing_store, runner_name, say, session_id_of

__all__ = ["stop"]


async def stop(args: argparse.Namespace) -> int:
    import httpx

    if isinstance(args.store, str) or args.store.exists():
        # A short id is resolved here; the server's API takes whole ids. An
        # id this store does not know may still be the server's.
        with contextlib.closing(existing_store(args.store)) as local:
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
    store = existing_store(args.store)
    try:
        if await store.get_session(args.session) is None:
            raise OrchestratorError(f"no session {args.session!r} in {args.store}")
        runner = await store.get_runner(args.session)
        if runner is None or liveness(runner) in (Liveness.ENDED, Liveness.DEAD):
            return await _stop_without_runner(store, args.session)
        return await _stop_through_runner(store, args.session, runner, args.wait)
    finally:
        store.close()


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
            f"session {session_id} is run by {runner_name(runner)} (heartbeat {age:.0f} s ago), "
            "another host: stop it there, or through its orchestrator server (--server)"
        )
    if state is Liveness.HUNG:
        return _cannot_stop(
            f"session {session_id} is run by {runner_name(runner)}, which is alive but has not "
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
                    f"the runner of session {session_id} ({runner_name(runner)}) stopped its "
                    f"children, but {len(still)} it does not hold are still marked running "
                    f"(`a2a-orchestrator children {session_id}`)",
                    "those were left as they are",
                )
            await store.update_runner(session_id, runner.token, stop_request="")
            return _cannot_stop(
                f"the runner of session {session_id} ({runner_name(runner)}) did not confirm "
                f"the stop within {wait:g} s{note}"
            )
        await anyio.sleep(0.1)
    # The runner recorded how each child ended; count those it aborted.
    records = await store.list_children(session_id=session_id, statuses=["failed"])
    stopped = sum(1 for r in records if r.child_id in running and r.reason == "aborted")
    say(f"stopped {stopped} (by its runner, {runner_name(runner)})")
    return 0


async def _stop_without_runner(store: Store, session_id: str) -> int:
    """No process runs the session: what the store says is running is not, so
    recording it aborted is the truth (remote children get CancelTask first)."""
    from ...delegation.base import ChildConfig
    from ...delegation.network import AgentSpec, Network
    from ...runtime.render import CANCELED_TEXT

    records = await store.list_children(session_id=session_id, statuses=["running"])
    if not records:
        say("stopped 0 (no live runner, and no child was running)")
        return 0
    from ...delegation.base import Resume
    from ...delegation.transports import RemoteDelegate

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
