"""How a child's outcome reaches its parent: terminal texts and FINAL_ANSWER;
and the few words any view or tool says of one event (`describe_event`).

Terminal normalisation: whatever way a child ended, the parent gets one of
two shapes, completed (the child's text, or a fixed text when it said
nothing) or failed (a fixed text per reason, then a sentence telling the
parent what to do). The payload is cut to a token budget by bisection
(`tokens.py` estimates the counts); a failure's closing sentence is kept
after the cut, so a parent always reads that the child did not finish. The
full result stays in the store, retrievable by child id.
"""

from __future__ import annotations

from .budgets import Spend
from .events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    MessageDelta,
    MessageRestarted,
    Started,
    ToolCalled,
    ToolResult,
)
from .tokens import count_tokens, prefix_within

__all__ = [
    "ABORTED_TEXT",
    "CANCELED_TEXT",
    "DID_NOT_FINISH",
    "EMPTY_OUTPUT_TEXT",
    "INTERRUPTED_TEXT",
    "NO_TERMINAL_TEXT",
    "PAYLOAD_TOKEN_BUDGET",
    "RESTART_MARK",
    "STEP_BUDGET_TEXT",
    "TRUNCATED",
    "count_tokens",
    "describe_event",
    "normalise",
    "render_final_answer",
    "truncate_to_budget",
]

EMPTY_OUTPUT_TEXT = "(subagent completed without output)"
STEP_BUDGET_TEXT = "subagent exhausted its step budget before finishing"
ABORTED_TEXT = "subagent was aborted"
NO_TERMINAL_TEXT = "subagent stream ended without a terminal frame"
DID_NOT_FINISH = "The subagent did not finish. Spawn it again if the task is still needed."
TRUNCATED = "…[truncated]"
PAYLOAD_TOKEN_BUDGET = 900
CANCELED_TEXT = "canceled by request"
INTERRUPTED_TEXT = "interrupted by the parent"
RESTART_MARK = "(stream cut; restarted)"
"""What a view says where a message's text was withdrawn and begun again."""

_CLOSING = f"\n\n{DID_NOT_FINISH}"


def truncate_to_budget(text: str, budget: int = PAYLOAD_TOKEN_BUDGET) -> str:
    """`text` if it fits `budget` tokens, else its longest prefix that fits
    with `…[truncated]` appended. A failure's closing sentence
    (`DID_NOT_FINISH`) is not part of what is cut: it follows the marker."""
    if prefix_within(text, budget) == len(text):  # reads no further than the budget
        return text
    head, tail = (text[: -len(_CLOSING)], _CLOSING) if text.endswith(_CLOSING) else (text, "")
    room = budget - count_tokens(TRUNCATED) - count_tokens(tail)
    while True:
        cut = head[: prefix_within(head, max(0, room))].rstrip() + TRUNCATED + tail
        # Pieces can join differently across the seam with the marker; in
        # the rare case that costs a token more, cut a little shorter.
        if count_tokens(cut) <= budget or room <= 0:
            return cut
        room -= 1


def normalise(event: ChildEvent) -> tuple[str, str]:
    """(`completed` or `failed`, the payload) for the event that ended a child's turn."""
    if isinstance(event, Done):
        return "completed", event.text if event.text.strip() else EMPTY_OUTPUT_TEXT
    if isinstance(event, Failed):
        if event.reason == "max_turns":
            text = STEP_BUDGET_TEXT
        elif event.reason == "aborted":
            text = ABORTED_TEXT
        elif event.reason == "budget":
            # The message says which limit and what was spent.
            text = "subagent stopped by its budget: " + event.message.removeprefix(
                "budget exhausted: "
            )
        elif event.message == NO_TERMINAL_TEXT:
            text = NO_TERMINAL_TEXT
        else:
            text = event.message or event.reason
        return "failed", f"{text}\n\n{DID_NOT_FINISH}"
    return "failed", f"{NO_TERMINAL_TEXT}\n\n{DID_NOT_FINISH}"


def render_final_answer(
    task_name: str, sender: str, payload: str, usage: Spend | None = None
) -> str:
    """The block a parent receives in its inbox when a child finishes;
    `usage` (the child's subtree total so far) adds a `Usage:` line."""
    spent = f"Usage: {usage.describe()} (this child and its children)\n" if usage else ""
    return (
        "Message Type: FINAL_ANSWER\n"
        f"Task name: {task_name}\n"
        f"Sender: {sender}\n"
        f"{spent}"
        "Payload:\n"
        f"{truncate_to_budget(payload)}"
    )


def _short(text: str, width: int = 48) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def describe_event(event: ChildEvent) -> str:
    """A few words about an event, for one line of a view."""
    match event:
        case Started(model=model):
            return f"started{f' ({model})' if model else ''}"
        case MessageDelta(text=text) | AssistantMessage(text=text):
            return f'says "{_short(text)}"'
        case MessageRestarted():
            return f"text withdrawn {RESTART_MARK}"
        case ToolCalled(tool=tool, arguments=arguments):
            detail = arguments.get("path") or arguments.get("command") or arguments.get("pattern")
            return f"calls {tool}" + (f" {_short(str(detail), 40)}" if detail else "")
        case ToolResult(tool=tool, success=success):
            return f"{tool} {'ok' if success else 'FAILED'}"
        case InputRequired(question=question):
            return f'asks "{_short(question)}"'
        case Done(text=text):
            return f'done "{_short(text)}"'
        case Failed(reason=reason, message=message):
            return f"failed ({reason}) {_short(message)}"
    return event.kind
