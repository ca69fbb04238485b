"""How a child's outcome reaches its parent: terminal texts and FINAL_ANSWER.

Terminal normalisation: whatever way a child ended, the parent gets one of
two shapes, completed (the child's text, or a fixed text when it said
nothing) or failed (a fixed text per reason, then a sentence telling the
parent what to do). The rendered block is cut to a token budget by
bisection; the full result stays in the store, retrievable by child id.
"""

from __future__ import annotations

import math
import re

from .events import ChildEvent, Done, Failed

__all__ = [
    "ABORTED_TEXT",
    "DID_NOT_FINISH",
    "EMPTY_OUTPUT_TEXT",
    "NO_TERMINAL_TEXT",
    "PAYLOAD_TOKEN_BUDGET",
    "STEP_BUDGET_TEXT",
    "TRUNCATED",
    "count_tokens",
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

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """An estimate of a model's token count, without a tokenizer download.

    Words and punctuation marks count one each, long words one per four
    characters: close to BPE tokenizers on English and code, and never zero
    for non-empty text.
    """
    return sum(max(1, math.ceil(len(piece) / 4)) for piece in _TOKEN.findall(text))


def truncate_to_budget(text: str, budget: int = PAYLOAD_TOKEN_BUDGET) -> str:
    """`text` if it fits `budget` tokens, else its longest prefix that fits
    with `…[truncated]` appended (found by bisection over the length)."""
    if count_tokens(text) <= budget:
        return text
    room = budget - count_tokens(TRUNCATED)
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(text[:middle]) <= room:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + TRUNCATED


def normalise(event: ChildEvent) -> tuple[str, str]:
    """(`completed` or `failed`, the payload) for the event that ended a child's turn."""
    if isinstance(event, Done):
        return "completed", event.text if event.text.strip() else EMPTY_OUTPUT_TEXT
    if isinstance(event, Failed):
        if event.reason == "max_turns":
            text = STEP_BUDGET_TEXT
        elif event.reason == "aborted":
            text = ABORTED_TEXT
        elif event.message == NO_TERMINAL_TEXT:
            text = NO_TERMINAL_TEXT
        else:
            text = event.message or event.reason
        return "failed", f"{text}\n\n{DID_NOT_FINISH}"
    return "failed", f"{NO_TERMINAL_TEXT}\n\n{DID_NOT_FINISH}"


def render_final_answer(task_name: str, sender: str, payload: str) -> str:
    """The block a parent receives in its inbox when a child finishes."""
    return (
        "Message Type: FINAL_ANSWER\n"
        f"Task name: {task_name}\n"
        f"Sender: {sender}\n"
        "Payload:\n"
        f"{truncate_to_budget(payload)}"
    )
