"""The architect -> coder -> reviewer pipeline (cloop), over the delegation interface.

Each pass is a child through the one interface, remote or in-process as the
network says, run with the caller's options and only its own role's prompt.
The coder gets the architect's design; the reviewer gets both. With review
rounds left, a reviewer's TASK_FAILED sends its findings back into the
coder's own conversation (the coder's child id is kept for that) and the
reviewer looks again.

Contract:
- Cancellation is checked before each pass: a cancelled run makes no further
  model call (a pass in flight is cancelled with it).
- A pass that fails, raises, or returns empty output ends the run with
  `PipelineError("<pass> pass: ...")`; there is no partial success.
- A pass that asks (`ask_parent`) is not a failure: its question goes to
  the session's `questions` and the answer that arrives goes back to it as
  the call's result; the pass goes on.
- Signal: from the output's last five lines (trimmed), the first that is
  exactly TASK_DONE, TASK_SKIPPED or TASK_FAILED; the reviewer's overrides the
  coder's; with neither, the task counts as done.
- Artifacts are written atomically to
  `.a2a/tasks/<id>-<slug>-multiagent/{architect,coder,reviewer}.txt`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import anyio

from ..delegation.base import ChildConfig, ChildHandle
from ..errors import OrchestratorError
from ..models.base import Usage
from ..runtime.budgets import Spend
from ..runtime.events import Done, Failed, InputRequired
from ..runtime.records import RecordKind

if TYPE_CHECKING:
    # Only in annotations: importing the session here would load the transports
    # and the SDK server side for every reader of a pipeline record (`status`).
    from ..delegation.session import Session

__all__ = [
    "PASSES",
    "PROGRESS_KEY",
    "SIGNALS",
    "Brief",
    "PassOptions",
    "Pipeline",
    "PipelineCancelled",
    "PipelineError",
    "PipelineResult",
    "Signal",
    "TaskSpec",
    "extract_signal",
    "slugify",
    "write_artifacts",
]

Signal: TypeAlias = Literal["TASK_DONE", "TASK_FAILED", "TASK_SKIPPED"]
SIGNALS: tuple[Signal, ...] = ("TASK_DONE", "TASK_FAILED", "TASK_SKIPPED")
PROGRESS_KEY = "pipeline"
"""The session metadata key under which a run records itself (see `Pipeline`)."""
PASSES = ("architect", "coder", "reviewer")
"""A run's passes, in order (a review round repeats the last two)."""


class PipelineError(OrchestratorError):
    """A pass failed; the message starts with the pass name."""


class PipelineCancelled(PipelineError):
    """The run was cancelled; no pass after the cancellation called a model."""


@dataclass(frozen=True, kw_only=True)
class TaskSpec:
    """The task the pipeline works on."""

    id: str
    title: str
    description: str = ""


@dataclass(frozen=True, kw_only=True)
class Brief:
    """What every pass is told about the task."""

    task: TaskSpec
    goal: str = ""
    instructions: str = ""
    project_context: str = ""
    notice: str = ""
    """A section every pass carries (e.g. a gate the passes must respect)."""

    def render(self) -> str:
        sections = [f"# Task {self.task.id}: {self.task.title}"]
        if self.task.description:
            sections.append(self.task.description)
        for title, body in (
            ("Goal", self.goal),
            ("Instructions", self.instructions),
            ("Project context", self.project_context),
            ("Notice", self.notice),
        ):
            if body.strip():
                sections.append(f"## {title}\n{body.strip()}")
        return "\n\n".join(sections)


@dataclass(frozen=True, kw_only=True)
class PassOptions:
    """The caller's options, given to every pass."""

    model: str | None = None
    max_turns: int | None = None
    timeout: float | None = None
    """Seconds per pass; None keeps each role's limit, and 0 means none, as in
    cloop (in-process passes run unlimited; a remote one keeps its server's)."""
    architect: str = "architect"
    """Agent name or role for each pass."""
    coder: str = "coder"
    reviewer: str = "reviewer"
    review_rounds: int = 1
    """How many reviews; each extra one follows a TASK_FAILED sent back to the coder."""


@dataclass(frozen=True, kw_only=True)
class PipelineResult:
    architect_output: str
    coder_output: str
    reviewer_output: str
    signal: Signal
    artifact_dir: str
    """Relative to the work directory."""
    usage: Usage = field(default_factory=Usage)
    """Summed over every pass."""
    total: Spend = field(default_factory=Spend)
    """What the passes and their own children spent, from the store's
    per-turn rows: exact after a crash and a resume (a turn counted once)."""
    coder_child_id: str = ""
    """The coder's conversation: a later review round continues it."""


def extract_signal(output: str) -> Signal | None:
    """The signal in the last five lines of `output`, first match top to bottom."""
    for line in output.strip().splitlines()[-5:]:
        if line.strip() in SIGNALS:
            return line.strip()  # type: ignore[return-value]
    return None


def slugify(title: str) -> str:
    """Lowercase, spaces to `-`, keep [a-z0-9-], collapse `--`, trim `-`, at most 40."""
    slug = title.lower().replace(" ", "-")
    slug = re.sub(r"[^a-z0-9-]", "", slug)
    slug = re.sub(r"-{2,}", "-", slug).strip("-")
    return slug[:40].strip("-")


def write_artifacts(workdir: Path, task: TaskSpec, outputs: dict[str, str]) -> str:
    """Write each pass's output atomically; return the directory, relative to `workdir`."""
    relative = Path(".a2a") / "tasks" / f"{task.id}-{slugify(task.title)}-multiagent"
    directory = workdir / relative
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in outputs.items():
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, directory / f"{name}.txt")
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    return str(relative)


ARCHITECT_ASK = (
    "Design the technical approach for this task. Answer in exactly four sections "
    "(Approach, Components, Design decisions, Risks) and write no implementation code."
)
CODER_ASK = (
    "Implement the architect's design below in the work directory, run the tests, and end "
    "with exactly one signal line: TASK_DONE, TASK_FAILED or TASK_SKIPPED."
)
REVIEWER_ASK = (
    "Review the implementation against the design for correctness, quality and "
    "completeness; run the tests; end with exactly one signal line: TASK_DONE, TASK_FAILED "
    "or TASK_SKIPPED. Your signal overrides the coder's."
)


class Pipeline:
    """One pipeline run; `cancel()` stops it before its next pass.

    The run records itself in its session's metadata (`PROGRESS_KEY`): the
    brief, the options, each pass's child id once chosen and its output once
    it has one, and how the run ended. `Pipeline.restore(session)` rebuilds
    an interrupted run from that record, and `run()` then continues from its
    first unfinished pass: a finished pass's output is reused, a pass whose
    child was still running is recovered and its result used.
    """

    def __init__(self, session: Session, brief: Brief, options: PassOptions | None = None) -> None:
        self.session = session
        self.brief = brief
        self.options = options or PassOptions()
        self._cancelled = False
        self._current: ChildHandle | None = None
        self._asking: anyio.CancelScope | None = None
        """Around the wait for an answer to a pass's question (cancel ends it)."""
        self.passes: dict[str, ChildHandle] = {}
        """The child of each pass, by pass name (`coder` is the coder's conversation)."""
        self._steps: list[dict[str, Any]] = []
        """The passes so far, in order (a review round adds a coder and a reviewer step)."""
        self._next = 0
        self._child_ids: dict[str, str] = {}
        self.state = "new"
        """`new` (not run yet), `running`, `done` or `failed`: as recorded."""
        self.signal: Signal | None = None
        """The signal of a run that ended `done`."""
        self.error = ""
        """What ended a `failed` run."""
        self.artifact_dir = ""
        """Where a `done` run wrote its artifacts, relative to the work directory."""
        self.stopped = False
        """A `failed` run ended by a stop (`cancel()`), which `reopen()` continues."""

    @classmethod
    async def restore(cls, session: Session) -> Pipeline | None:
        """The pipeline run recorded in `session`, ready to continue with
        `run()`; None when the session has none. A record that cannot be read
        is a `PipelineError`."""
        row = await session.store.get_session(session.id)
        record = (row or {}).get("metadata", {}).get(PROGRESS_KEY)
        if not record:
            return None
        try:
            brief = dict(record["brief"])
            task = TaskSpec(**brief.pop("task"))
            pipeline = cls(session, Brief(task=task, **brief), PassOptions(**record["options"]))
            steps = [dict(step) for step in record["steps"]]
            for step in steps:
                if not isinstance(step["pass"], str) or not isinstance(step["child_id"], str):
                    raise TypeError("a step needs a pass name and a child id")
        except (KeyError, TypeError, ValueError) as exc:
            raise PipelineError(
                f"session {session.id}: its pipeline record cannot be read ({exc})"
            ) from exc
        pipeline._steps = steps
        pipeline.state = record.get("state", "running")
        pipeline.signal = record.get("signal")
        pipeline.error = record.get("error", "")
        pipeline.artifact_dir = record.get("artifact_dir", "")
        pipeline.stopped = bool(record.get("stopped", False))
        return pipeline

    async def reopen(self) -> str | None:
        """Make a run a stop ended continuable: the pass the stop cut (its
        child ended aborted) is forgotten, so `run()` starts it anew, and the
        run is `running` again. Whether the stop came to a live run (which
        recorded itself stopped) or to a dead one's children (`stop` marked
        them aborted), the pass it names; None when the run was not stopped
        (done, failed otherwise, or under way)."""
        if self.state == "done":
            return None
        last = self._steps[-1] if self._steps and "text" not in self._steps[-1] else None
        record = await self.session.store.get_child(last["child_id"]) if last else None
        aborted = record is not None and record.status == "failed" and record.reason == "aborted"
        if not (aborted or (self.state == "failed" and self.stopped)):
            return None
        if aborted and last is not None:
            self._steps.pop()
        self.state, self.stopped, self.error = "running", False, ""
        await self._save()
        return last["pass"] if last is not None else "next"

    @property
    def recorded(self) -> list[tuple[str, str, Done | None]]:
        """Each step so far: its pass, its child id, and its output once it has one."""
        return [
            (
                step["pass"],
                step["child_id"],
                Done(text=step["text"], usage=Usage(**step.get("usage", {})))
                if "text" in step
                else None,
            )
            for step in self._steps
        ]

    @property
    def finished(self) -> bool:
        """The run ended (`done` or `failed`): there is nothing to continue."""
        return self.state in ("done", "failed")

    async def cancel(self) -> None:
        """Cancel the run: the running pass's child is cancelled, no later pass starts."""
        self._cancelled = True
        if self._asking is not None:
            self._asking.cancel()
        if self._current is not None:
            await self._current.cancel()

    async def _ask(self, name: str, handle: ChildHandle, asked: InputRequired) -> str | None:
        """The answer to the pass's question; None when the child's turn
        ended otherwise while it waited (stopped from the control API or
        the web view): the question is withdrawn, as no answer can go on."""
        # The waiting child is the one `cancel` stops, as while it runs.
        self._current = handle
        answer: str | None = None
        try:
            with anyio.CancelScope() as self._asking:
                async with anyio.create_task_group() as tg:

                    async def ask() -> None:
                        nonlocal answer
                        answer = await self.session.questions.ask(
                            asked.question,
                            child_id=handle.child_id,
                            agent=handle.agent,
                            role=handle.role,
                        )
                        tg.cancel_scope.cancel()

                    tg.start_soon(ask, name=f"{name} pass: its question")
                    await handle.moved_on(asked)
                    tg.cancel_scope.cancel()
        finally:
            self._asking = None
            self._current = None
        if self._cancelled:
            raise PipelineCancelled(f"{name} pass: cancelled while it waited for an answer")
        return answer

    @property
    def child_ids(self) -> frozenset[str]:
        """The children of its passes so far (whose questions are this run's)."""
        return frozenset(self._child_ids.values())

    def _check(self, name: str) -> None:
        if self._cancelled:
            raise PipelineCancelled(f"{name} pass: cancelled before it started")

    def _config(self, agent: str, prompt: str) -> ChildConfig:
        return ChildConfig(
            role=agent,
            prompt=prompt,
            model=self.options.model,
            max_turns=self.options.max_turns,
            timeout=self.options.timeout,
        )

    async def _save(self, **outcome: Any) -> None:
        """Write the run's record; a crash after this loses nothing recorded."""
        record = {
            "brief": dataclasses.asdict(self.brief),
            "options": dataclasses.asdict(self.options),
            "steps": self._steps,
            "state": self.state,
            # When the record last changed: when the run ended, once it has.
            "updated_at": time.time(),
            **outcome,
        }
        await self.session.store.set_session_metadata(self.session.id, PROGRESS_KEY, record)

    async def _finish(self, name: str, handle: ChildHandle) -> Done:
        while True:
            self._current = handle
            try:
                outcome = await handle.result()
            finally:
                self._current = None
            if self._cancelled:
                raise PipelineCancelled(f"{name} pass: cancelled")
            if not isinstance(outcome, InputRequired):
                break
            # Nobody above the pass but the person who gave the task: the
            # session's questions reach them (or say no one can answer), and
            # the answer is the `ask_parent` call's result.
            answer = await self._ask(name, handle, outcome)
            if answer is not None:
                await handle.send(answer)
            elif handle.last_terminal is outcome:
                # Closed with its session, not ended: nothing more will come.
                raise PipelineError(f"{name} pass: closed while it waited for an answer")
        if isinstance(outcome, Failed):
            raise PipelineError(f"{name} pass: {outcome.reason}: {outcome.message}")
        if not outcome.text.strip():
            raise PipelineError(f"{name} pass: returned empty output")
        return outcome

    async def _pass(self, name: str, agent: str, prompt: str, *, again: bool = False) -> Done:
        """One step: a new child for pass `name`, or (`again`) a follow-up in
        the conversation that pass already has. A step the record shows
        finished is not run again."""
        index = self._next
        self._next += 1
        if index < len(self._steps):
            step = self._steps[index]
            if step["pass"] != name:
                raise PipelineError(
                    f"{name} pass: the recorded run had {step['pass']} here; it cannot continue"
                )
            self._child_ids[name] = step["child_id"]
            output = self.recorded[index][2]
            if output is not None:
                return output
            self._check(name)
            handle = await self._reattach(index, name, agent, prompt, again=again)
        else:
            self._check(name)
            # The child id is chosen and recorded before the child exists, so
            # a crash at any point after leaves a step `restore` can find.
            child_id = self._child_ids[name] if again else uuidlib.uuid4().hex[:12]
            self._steps.append({"pass": name, "child_id": child_id})
            self._child_ids[name] = child_id
            await self._save()
            handle = await self._start(name, agent, child_id, prompt, again=again)
        done = await self._finish(name, handle)
        self._steps[index].update(text=done.text, usage=done.usage.as_dict())
        await self._save()
        return done

    async def _start(
        self, name: str, agent: str, child_id: str, prompt: str, *, again: bool
    ) -> ChildHandle:
        try:
            if again:
                handle = await self._handle(name, child_id)
                await handle.send(prompt)
            else:
                handle = await self.session.spawn(self._config(agent, prompt), child_id=child_id)
        except PipelineError:
            raise
        except Exception as exc:
            raise PipelineError(f"{name} pass: {exc}") from exc
        self.passes[name] = handle
        return handle

    async def _handle(self, name: str, child_id: str) -> ChildHandle:
        handle = self.passes.get(name)
        if handle is not None and handle.child_id == child_id:
            return handle
        try:
            handle = await self.session.child(child_id)
        except KeyError:
            raise PipelineError(f"{name} pass: its child {child_id} is not in the store") from None
        self.passes[name] = handle
        return handle

    async def _reattach(
        self, index: int, name: str, agent: str, prompt: str, *, again: bool
    ) -> ChildHandle:
        """The child of step `index`, under way when the run was interrupted:
        recovered (the session resumes it if the store says it was running),
        and given the step's prompt if it never got it."""
        child_id = self._steps[index]["child_id"]
        record = await self.session.store.get_child(child_id)
        if record is None:
            if again:
                raise PipelineError(f"{name} pass: its child {child_id} is not in the store")
            # Interrupted between recording the step and spawning its child.
            return await self._start(name, agent, child_id, prompt, again=False)
        try:
            handle = await self._handle(name, child_id)
        except OrchestratorError as exc:
            raise PipelineError(f"{name} pass: {exc}") from exc
        if again:
            # Each step of this child gave it one input (its prompt, then a
            # follow-up per round): fewer stored means this one never got there.
            given = sum(1 for step in self._steps[: index + 1] if step["child_id"] == child_id)
            stored = await self.session.store.events(self.session.id, child_id=child_id)
            if sum(1 for event in stored if event.kind == RecordKind.INPUT) < given:
                await handle.send(prompt)
        return handle

    async def run(self) -> PipelineResult:
        """Run (or continue) the pipeline; see the module docstring."""
        if self.finished:
            raise PipelineError(f"the pipeline already ended ({self.state})")
        self.state = "running"
        try:
            result = await self._run()
        except PipelineError as exc:
            self.state = "failed"
            self.error = str(exc)
            self.stopped = isinstance(exc, PipelineCancelled)
            await self._save(error=self.error, stopped=self.stopped)
            raise
        self.state = "done"
        self.signal = result.signal
        self.artifact_dir = result.artifact_dir
        await self._save(signal=result.signal, artifact_dir=result.artifact_dir)
        return result

    async def _run(self) -> PipelineResult:
        brief = self.brief.render()
        usage = Usage()
        design = await self._pass(
            "architect", self.options.architect, f"{brief}\n\n{ARCHITECT_ASK}"
        )
        usage += design.usage
        code = await self._pass(
            "coder",
            self.options.coder,
            f"{brief}\n\n{CODER_ASK}\n\n# The architect's design\n\n{design.text}",
        )
        usage += code.usage
        review_prompt = (
            f"{brief}\n\n{REVIEWER_ASK}\n\n# The architect's design\n\n{design.text}"
            f"\n\n# The coder's report\n\n{code.text}"
        )
        review = await self._pass("reviewer", self.options.reviewer, review_prompt)
        usage += review.usage
        for _round in range(1, self.options.review_rounds):
            if extract_signal(review.text) != "TASK_FAILED":
                break
            code = await self._pass(
                "coder",
                self.options.coder,
                f"The reviewer sent the task back. Fix what it found, run the tests, "
                f"and end with one signal line.\n\n# Review\n\n{review.text}",
                again=True,
            )
            usage += code.usage
            review = await self._pass(
                "reviewer",
                self.options.reviewer,
                "The coder answered your review. Review again."
                f"\n\n# The coder's report\n\n{code.text}",
                again=True,
            )
            usage += review.usage
        signal = extract_signal(review.text) or extract_signal(code.text) or "TASK_DONE"
        artifact_dir = await anyio.to_thread.run_sync(
            lambda: write_artifacts(
                self.session.workspace.root,
                self.brief.task,
                {"architect": design.text, "coder": code.text, "reviewer": review.text},
            )
        )
        subtrees = await self.session.store.subtree_usage(self.session.id)
        total = sum((subtrees.get(c, Spend()) for c in set(self._child_ids.values())), Spend())
        return PipelineResult(
            total=total,
            architect_output=design.text,
            coder_output=code.text,
            reviewer_output=review.text,
            signal=signal,
            artifact_dir=artifact_dir,
            usage=usage,
            coder_child_id=self._child_ids["coder"],
        )
