"""The commands that run a session here: `run`, `resume` and `demo`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ...control.pipeline import (
    PROGRESS_KEY,
    Brief,
    PassOptions,
    Pipeline,
    PipelineError,
    Signal,
    TaskSpec,
    extract_signal,
)
from ...errors import OrchestratorError
from ...orchestrator.outcome import NO_SIGNAL
from ...orchestrator.view import LiveTree
from ...runtime.events import ChildEvent, Done, Failed, InputRequired
from ...runtime.render import describe_event
from ..defaults import EXIT_CODES, NO_SIGNAL_EXIT
from ..heap import settle

# Annotations only: the commands import what they run (see `__init__`).
if TYPE_CHECKING:
    from ...control.plane import ControlPlane
    from ...control.reactions import Reaction, Reactions
    from ...delegation.hooks import Hooks
    from ...delegation.session import Session

from .asking import interactive, with_answers
from .common import (
    PIPELINE_PASSES,
    SESSION_ID,
    STOPPED_LINE,
    check_agents,
    existing_store,
    hooks_of,
    model_notice,
    new_store,
    policy_of,
    reaction_rules,
    sandbox_of,
    say,
    session_id_of,
    settings_and_models,
    workdir_of,
)

__all__ = ["demo", "resume", "run"]


async def demo(args: argparse.Namespace) -> int:
    from ...orchestrator.demo import TERMINAL_PACE, run_demo

    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        raise OrchestratorError(f"--workdir {args.workdir} is not a directory")
    pace = args.pace if args.pace is not None else TERMINAL_PACE if sys.stdout.isatty() else 0.0
    result = await run_demo(args.workdir, out=sys.stdout, sandbox=sandbox_of(args), pace=pace)
    return EXIT_CODES[result.signal]


def _reactions(plane: ControlPlane, rules: list[Reaction]) -> Reactions | None:
    from ...control.reactions import Reactions

    return Reactions(plane, rules) if rules else None


async def run(args: argparse.Namespace) -> int:
    from ...delegation.network import Network
    from ...delegation.session import Session
    from ...runtime.roles import find_role

    workdir = workdir_of(args.workdir)
    if not args.task.strip():
        raise OrchestratorError("TASK is empty: say what to do")
    if args.append and args.session is None:
        raise OrchestratorError("--append adds a run to the session --session names: give both")
    if args.session is not None and not SESSION_ID.fullmatch(args.session):
        raise OrchestratorError(
            f"session id {args.session!r}: use 1-128 letters, digits, '.', '_' or '-'"
        )
    settings, models = settings_and_models()
    # Configuration is read before anything starts, so a bad file is a clear error.
    if args.parent:
        find_role(args.role)  # an unknown role is a clear error before anything starts
    else:
        check_agents(Network.load(), list(PIPELINE_PASSES), settings)
    sandbox = sandbox_of(args)
    hooks = hooks_of(args.hooks, workdir / ".a2a", workdir=workdir, sandboxed=sandbox.enabled)
    policy = policy_of(args.policy, workdir / ".a2a")
    rules = reaction_rules(workdir / ".a2a")
    model_notice(settings)
    store = new_store(args.store)
    session_id = await _session_to_run(store, args) if args.session is not None else None
    settle()
    async with Session(
        store,
        workdir=workdir,
        models=models,
        session_id=session_id,
        title=args.task,
        sandbox=sandbox,
        policy=policy,
    ) as session:
        # `resume` finds the work directory here when it is not given one.
        await store.set_session_metadata(session.id, "workdir", str(workdir))
        say(f"session {session.id}  (a2a-orchestrator events {session.id})")
        if args.parent:
            return await _run_parent(args, session, models, hooks, rules)
        brief = Brief(task=TaskSpec(id=session.id[:8], title=args.task[:80], description=args.task))
        pipeline = Pipeline(session, brief, PassOptions(review_rounds=args.review_rounds))
        return await _follow_pipeline(
            session, pipeline, hooks, rules, workdir, ask_person=interactive(args.no_input)
        )


def _run_again(row: dict[str, Any]) -> str:
    """The command that runs a session's task again, as a new session."""
    title = " ".join(str(row.get("title") or "TASK").split()).replace('"', '\\"')
    return f'a2a-orchestrator run "{title}"'


async def _session_to_run(store: Any, args: argparse.Namespace) -> str:
    """`run --session`'s session: an existing one by its id or a unique prefix
    (as every command takes it), else a new one of that id. Adding a run to
    an existing session is refused unless `--append` asks for it."""
    from ...orchestrator.outcome import outcome_of

    session_id = await session_id_of(store, args.session, args.store, missing_ok=True)
    row = await store.get_session(session_id)
    if row is None or args.append:
        return session_id
    signal = (await outcome_of(store, row)).signal
    if signal in ("unfinished", "-"):
        raise OrchestratorError(
            f"session {session_id} exists and has not ended: `a2a-orchestrator resume "
            f"{session_id}` continues it; --append adds this run to it anyway"
        )
    raise OrchestratorError(
        f"session {session_id} has ended ({signal}): run without --session for a new "
        "session, or pass --append to add this run to it"
    )


async def _follow_pipeline(
    session: Session,
    pipeline: Pipeline,
    hooks: Hooks,
    rules: list[Reaction],
    workdir: Path,
    *,
    resume: bool = False,
    ask_person: bool,
) -> int:
    """Run (or, `resume`, continue) `pipeline` with its live tree; the exit
    code is its signal. A pass's question is put to the person when
    `ask_person`, else answered that nobody can (`commands/asking.py`)."""
    from ...control.plane import ControlPlane
    from ...delegation.session import RelayedEvent

    plane = ControlPlane(session, hooks=hooks)
    reactions = _reactions(plane, rules)
    tree = LiveTree(f"pipeline  session {session.id[:8]}", expected=list(PIPELINE_PASSES))
    # A stop request cancels the pipeline first, so no pass starts after it.
    session.add_stop_listener(pipeline.cancel)
    try:
        async with session.relay() as relay:
            if resume:
                # The passes that had finished show as they ended; then the
                # unfinished children (the pass under way among them) resume
                # inside the relay, so the tree sees their events.
                for _name, child_id, output in pipeline.recorded:
                    record = await session.store.get_child(child_id)
                    if output is not None and record is not None:
                        tree.show_earlier(
                            RelayedEvent(
                                child_id=child_id,
                                parent_id="",
                                agent=record.agent or record.role,
                                role=record.role,
                                transport=record.transport,
                                event=output,
                            )
                        )
                await session.recover()
            result = await tree.follow_while(
                relay, with_answers(session.questions, tree, pipeline.run(), ask_person=ask_person)
            )
    except PipelineError as exc:
        say(f"\npipeline failed: {exc}")
        if session.stop_requested:
            say(STOPPED_LINE)
            say(f"`a2a-orchestrator resume {session.id}` continues it from the stopped pass")
        return 1
    finally:
        if reactions is not None:
            reactions.close()
        plane.close()
    if not tree.live:
        tree.draw()
    say(f"\nsignal: {result.signal}   artifacts: {workdir / result.artifact_dir}")
    # The session's one sum (`Store.session_usage`), as `status` shows it.
    say(f"usage: {(await session.store.session_usage(session.id)).describe()}")
    return EXIT_CODES[result.signal]


async def _run_parent(
    args: argparse.Namespace,
    session: Session,
    models: Any,
    hooks: Hooks,
    rules: list[Reaction],
) -> int:
    """A parent agent's turn, then whatever it set going: its children, and the
    turns their events start in it (an observer's injections), until all rest."""
    from ...control.parent import ParentAgent

    parent = await ParentAgent.restore(session, models("default"), role=args.role, hooks=hooks)
    reactions = _reactions(parent.plane, rules)
    tree = LiveTree(f"{args.role}  session {session.id[:8]}")

    async def show(event: ChildEvent) -> None:
        if event.kind != "message_delta":
            say(f"[{args.role}] {describe_event(event)}")

    parent.emit = show

    async def stop_turn() -> None:
        parent.conversation.abort("aborted", "stopped by `a2a-orchestrator stop`")

    session.add_stop_listener(stop_turn)

    async def everything() -> ChildEvent | None:
        await parent.run(args.task)
        while True:
            last = parent.last
            if isinstance(last, InputRequired) and not parent.conversation.running:
                # The parent is the root: its question is for the person at
                # the terminal (or told nobody can answer), never a failure.
                answer = await session.questions.ask(last.question, agent=args.role, role=args.role)
                await parent.run(answer)
                continue
            if not parent.conversation.running and not any(
                h.running for h in session.children.values()
            ):
                return last
            await session.wait_all()
            await anyio.sleep(0.05)

    try:
        async with session.relay() as relay:
            answered = with_answers(
                session.questions, tree, everything(), ask_person=interactive(args.no_input)
            )
            outcome = await tree.follow_while(relay, answered)
    finally:
        if reactions is not None:
            reactions.close()
        parent.close()
    if not tree.live:
        tree.draw()
    text = outcome.text if isinstance(outcome, Done) else getattr(outcome, "message", "")
    say("\n" + text)
    if session.stop_requested:
        say(STOPPED_LINE)
    signal: Signal | None = "TASK_FAILED"
    if isinstance(outcome, Done):
        # An answer that names no signal says nothing of how the task went:
        # recorded as such, never as TASK_DONE.
        signal = extract_signal(text)
    # `status` and the web view show it, as they show a pipeline's.
    await session.store.set_session_metadata(session.id, "signal", signal or NO_SIGNAL)
    say(f"\nsignal: {signal or NO_SIGNAL}")
    say(f"usage: {(await session.store.session_usage(session.id)).describe()}")
    return EXIT_CODES[signal] if signal is not None else NO_SIGNAL_EXIT


async def resume(args: argparse.Namespace) -> int:
    from ...delegation.network import Network
    from ...delegation.session import Session

    store = existing_store(args.store)
    session_id = await session_id_of(store, args.session, args.store)
    row = await store.get_session(session_id) or {}
    metadata = row.get("metadata", {})
    # The work directory `run` recorded, unless told another.
    workdir = workdir_of(args.workdir or Path(metadata.get("workdir", ".")))
    settings, models = settings_and_models()
    if (metadata.get(PROGRESS_KEY) or {}).get("state") in ("running", "failed"):
        # A pipeline to continue (a stopped one too): its passes' configuration
        # is checked first, as for `run`.
        check_agents(Network.load(), list(PIPELINE_PASSES), settings)
    sandbox = sandbox_of(args)
    hooks = hooks_of(None, workdir / ".a2a", workdir=workdir, sandboxed=sandbox.enabled)
    policy = policy_of(None, workdir / ".a2a")
    rules = reaction_rules(workdir / ".a2a")
    settle()
    async with Session(
        store,
        workdir=workdir,
        models=models,
        session_id=session_id,
        sandbox=sandbox,
        policy=policy,
    ) as session:
        pipeline = await Pipeline.restore(session)
        if pipeline is not None:
            if pipeline.state == "done" and pipeline.signal is not None:
                say(f"nothing to resume: the pipeline had ended with {pipeline.signal}")
                say(f"signal: {pipeline.signal}   artifacts: {workdir / pipeline.artifact_dir}")
                return EXIT_CODES[pipeline.signal]
            stopped = await pipeline.reopen()
            if stopped is not None:
                say(f"the pipeline was stopped; its {stopped} pass starts again")
            elif pipeline.finished:
                say(f"nothing to resume: the pipeline had failed: {pipeline.error}")
                say(f"its task can run again as a new session: {_run_again(row)}")
                return 1
            say(f"resuming the pipeline of session {session.id}")
            return await _follow_pipeline(
                session,
                pipeline,
                hooks,
                rules,
                workdir,
                resume=True,
                ask_person=interactive(args.no_input),
            )
        tree = LiveTree(f"resume  session {session.id[:8]}")
        async with session.relay() as relay:
            handles = await session.recover()
            if not handles:
                say("nothing to resume: every child had finished")
                records = await store.list_children(session_id=session.id)
                aborted = sum(1 for r in records if r.reason == "aborted")
                if aborted:
                    # Its parent agent keeps its conversation in the store:
                    # a new turn of it (`--append`) carries on from there.
                    say(
                        f"{aborted} of them stopped (aborted); to carry on, give its parent "
                        f"a new turn: a2a-orchestrator run --parent --session {session.id} "
                        '--append "what to do now"'
                    )
                return 0
            outcomes = await tree.follow_while(relay, session.wait_all())
        if not tree.live:
            tree.draw()
    failed = [o for o in outcomes.values() if isinstance(o, Failed)]
    say(f"\nresumed {len(handles)}; {len(failed)} failed")
    return 1 if failed else 0
