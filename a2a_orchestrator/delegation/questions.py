"""Questions a session's run asks a person: pending until an answer arrives.

A pipeline pass, or the parent agent at the root of a session, that calls
`ask_parent` has no agent above it to answer: its run puts the question
here and waits, and the answer becomes the `ask_parent` call's result (the
child's next input). One mechanism, three front ends that only answer:

- the terminal (`run`, `resume`): the person types the answer, or, without
  a terminal or with `--no-input`, `NO_ANSWER` answers at once;
- the orchestrator's A2A endpoint: its task goes INPUT_REQUIRED with the
  question, and the caller's next message on that task answers it;
- the web view: a box under the question on the session page.

Contract: `ask` returns the first answer given to its question; a later
`answer` to it is refused (False). Cancelling `ask` withdraws the question.
`wait_pending` wakes on every question asked and answered, so a front end
never polls.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

__all__ = ["NO_ANSWER", "Question", "Questions"]

NO_ANSWER = (
    "No one can answer your question now (nobody is at a terminal to ask). "
    "Make the most reasonable assumption, state it plainly in your answer, and go on."
)
"""The answer where no person can be asked (a pipe, CI, `--no-input`)."""


@dataclass(frozen=True, kw_only=True)
class Question:
    """One question waiting for its answer."""

    id: str
    """Names it to `Questions.answer` (a form field, a task's metadata)."""
    text: str
    child_id: str
    """Who asks: a child of the session, or "" for the session's parent agent."""
    agent: str
    """The asking agent's name (a pass of the pipeline: its agent)."""
    role: str

    @property
    def who(self) -> str:
        """Who asks, as a person reads it: `AGENT (ROLE, CHILD)`, or the parent agent's name."""
        return f"{self.agent} ({self.role}, {self.child_id[:6]})" if self.child_id else self.agent

    def describe(self) -> str:
        """The question as a person reads it, with who asks."""
        return f"{self.who} asks: {self.text}"


@dataclass(eq=False)
class _Waiting:
    question: Question
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: str = ""


class Questions:
    """The questions of one session still waiting for an answer."""

    def __init__(self) -> None:
        self._waiting: dict[str, _Waiting] = {}
        self._changed = anyio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def ask(
        self, text: str, *, child_id: str = "", agent: str, role: str, question_id: str = ""
    ) -> str:
        """Ask `text` and wait for the answer (see the module docstring);
        `question_id` names it (default: a new id)."""
        question = Question(
            id=question_id or uuidlib.uuid4().hex[:12],
            text=text,
            child_id=child_id,
            agent=agent,
            role=role,
        )
        waiting = self._waiting[question.id] = _Waiting(question)
        self._notify()
        try:
            await waiting.answered.wait()
        finally:
            if self._waiting.pop(question.id, None) is not None:
                self._notify()  # withdrawn (cancelled): watchers see it go
        return waiting.answer

    def pending(self) -> list[Question]:
        """The questions waiting for an answer, oldest first."""
        return [
            waiting.question for waiting in self._waiting.values() if not waiting.answered.is_set()
        ]

    def answer(self, question_id: str, text: str) -> bool:
        """Answer a pending question; False when none waits under that id
        (answered already, withdrawn, or never asked)."""
        waiting = self._waiting.get(question_id)
        if waiting is None or waiting.answered.is_set():
            return False
        waiting.answer = text
        waiting.answered.set()
        self._notify()
        return True

    async def wait_pending(self, accept: Callable[[Question], bool] = lambda _q: True) -> Question:
        """The oldest pending question `accept` takes, once there is one."""
        while True:
            for question in self.pending():
                if accept(question):
                    return question
            changed = self._changed
            await changed.wait()
