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
- Signal: from the output's last five lines (trimmed), the first that is
  exactly TASK_DONE, TASK_SKIPPED or TASK_FAILED; the reviewer's overrides the
  coder's; with neither, the task counts as done.
- Artifacts are written atomically to
  `.a2a/tasks/<id>-<slug>-multiagent/{architect,coder,reviewer}.txt`.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

import anyio

from .delegation import ChildConfig, ChildHandle
from .errors import OrchestratorError
from .events import Done, Failed, InputRequired
from .models.base import Usage
from .session import Session

__all__ = [
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
    """One pipeline run; `cancel()` stops it before its next pass."""

    def __init__(self, session: Session, brief: Brief, options: PassOptions | None = None) -> None:
        self.session = session
        self.brief = brief
        self.options = options or PassOptions()
        self._cancelled = False
        self._current: ChildHandle | None = None
        self.passes: dict[str, ChildHandle] = {}
        """The child of each pass, by pass name (`coder` is the coder's conversation)."""

    async def cancel(self) -> None:
        self._cancelled = True
        if self._current is not None:
            await self._current.cancel()

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

    async def _finish(self, name: str, handle: ChildHandle) -> Done:
        self._current = handle
        try:
            outcome = await handle.result()
        finally:
            self._current = None
        if self._cancelled:
            raise PipelineCancelled(f"{name} pass: cancelled")
        if isinstance(outcome, Failed):
            raise PipelineError(f"{name} pass: {outcome.reason}: {outcome.message}")
        if isinstance(outcome, InputRequired):
            raise PipelineError(f"{name} pass: asked a question nobody answers: {outcome.question}")
        if not outcome.text.strip():
            raise PipelineError(f"{name} pass: returned empty output")
        return outcome

    async def _pass(self, name: str, agent: str, prompt: str) -> Done:
        self._check(name)
        try:
            handle = await self.session.spawn(self._config(agent, prompt))
        except OrchestratorError as exc:
            raise PipelineError(f"{name} pass: {exc}") from exc
        self.passes[name] = handle
        return await self._finish(name, handle)

    async def _again(self, name: str, handle: ChildHandle, prompt: str) -> Done:
        self._check(name)
        try:
            await handle.send(prompt)
        except Exception as exc:
            raise PipelineError(f"{name} pass: {exc}") from exc
        return await self._finish(name, handle)

    async def run(self) -> PipelineResult:
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
            code = await self._again(
                "coder",
                self.passes["coder"],
                f"The reviewer sent the task back. Fix what it found, run the tests, "
                f"and end with one signal line.\n\n# Review\n\n{review.text}",
            )
            usage += code.usage
            review = await self._again(
                "reviewer",
                self.passes["reviewer"],
                "The coder answered your review. Review again."
                f"\n\n# The coder's report\n\n{code.text}",
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
        return PipelineResult(
            architect_output=design.text,
            coder_output=code.text,
            reviewer_output=review.text,
            signal=signal,
            artifact_dir=artifact_dir,
            usage=usage,
            coder_child_id=self.passes["coder"].child_id,
        )
