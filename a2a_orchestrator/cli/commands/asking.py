"""The terminal's answers to a session's questions (`questions.py`), for `run` and `resume`.

On a terminal (stdin and stdout both TTYs) the live view stops, the
question and who asks are printed, and the line the person types is the
answer. Anywhere else (a pipe, CI) or with `--no-input`, nobody can be
asked: the question is printed and `NO_ANSWER` answers it at once, so the
agent states its assumption and goes on. Either way the run goes on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar

import anyio

from ...delegation.questions import NO_ANSWER, Question, Questions
from .common import say

if TYPE_CHECKING:
    from ...orchestrator.view import LiveTree

__all__ = ["interactive", "read_line", "with_answers"]

T = TypeVar("T")


def interactive(no_input: bool) -> bool:
    """Whether a person can be asked here."""
    return not no_input and sys.stdin.isatty() and sys.stdout.isatty()


async def read_line() -> str:
    """One line the person typed ("" at the end of input). Waited for on the
    event loop, not in a thread: a thread blocked in a read would keep the
    process alive after Ctrl-C until the next line."""
    fd = sys.stdin.fileno()
    await anyio.wait_readable(fd)
    # A terminal in canonical mode is readable once a whole line is typed.
    return os.read(fd, 64 * 1024).decode(errors="replace")


async def _read_answer(question: Question) -> str:
    say(f"\n? {question.describe()}")
    while True:
        say("answer (one line; an empty line repeats the question, Ctrl-D: no answer)> ")
        line = await read_line()
        if not line:  # end of input: nobody will answer
            say("(no answer: the agent goes on with its own assumption)")
            return NO_ANSWER
        if line.strip():
            return line.strip()
        say(f"? {question.describe()}")


async def _answer(questions: Questions, tree: LiveTree, ask_person: bool) -> None:
    while True:
        question = await questions.wait_pending()
        if ask_person:
            with tree.paused():
                answer = await _read_answer(question)
        else:
            say(f"? {question.describe()}")
            say("  (nobody to ask here: the agent is told to state its assumption and go on)")
            answer = NO_ANSWER
        questions.answer(question.id, answer)


async def with_answers(
    questions: Questions, tree: LiveTree, work: Awaitable[T], *, ask_person: bool
) -> T:
    """Run `work`, answering the questions asked meanwhile (see the module docstring)."""
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(_answer, questions, tree, ask_person, name="answer questions")
        try:
            result = await work
        except Exception as exc:
            # Raised after the task group, so callers catch `work`'s own error
            # (a PipelineError), not an ExceptionGroup around it.
            failure = exc
        finally:
            tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return result
