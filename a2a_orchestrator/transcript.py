"""Rebuild a conversation's chat messages from its recorded entries.

A conversation's transcript is recorded twice over: as child events plus the
inputs it was given (the orchestrator's store), and as an A2A task's history
(a role server's task store). Both rebuild here, so a local child resumes
and a role server continues a task after a restart the same way.

Entries are the inputs (plain strings) and the child events in order:
an input becomes a user turn, or the answer to a pending `ask_parent` call;
`message` and `tool_called` events become assistant turns; `tool_result`
events become tool messages. Deltas and lifecycle events carry nothing new.
A last assistant turn whose tool calls never got their results (the process
died mid-step) is dropped, so the model plays that step again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from .events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    Started,
    ToolCalled,
    ToolResult,
)
from .models.base import ChatMessage
from .runtime import ASK_PARENT

__all__ = ["UNFINISHED_CALL", "rebuild_transcript"]

UNFINISHED_CALL = "(the turn ended before this call finished)"


def rebuild_transcript(
    system_prompt: str,
    entries: Iterable[str | ChildEvent],
    *,
    shared_context: Sequence[ChatMessage] = (),
) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend(dict(m) for m in shared_context)
    pending_ask: str | None = None
    # A step's text and its tool calls form one assistant message.
    step_open = False
    # Calls of the current step still without results. Input recorded while
    # they run (a child's result, a steering message) was absorbed after
    # them, at the next step boundary: it waits here until they are answered,
    # so every tool message still follows its call.
    open_calls: set[str] = set()
    deferred: list[str] = []

    def flush() -> None:
        messages.extend({"role": "user", "content": text} for text in deferred)
        deferred.clear()

    for entry in entries:
        if isinstance(entry, str):
            if pending_ask is not None and not open_calls:
                messages.append({"role": "tool", "tool_call_id": pending_ask, "content": entry})
                pending_ask = None
            elif open_calls:
                deferred.append(entry)
            else:
                messages.append({"role": "user", "content": entry})
            step_open = False
        elif isinstance(entry, AssistantMessage):
            messages.append({"role": "assistant", "content": entry.text})
            step_open = True
        elif isinstance(entry, ToolCalled):
            call = {
                "id": entry.call_id,
                "type": "function",
                "function": {"name": entry.tool, "arguments": json.dumps(entry.arguments)},
            }
            if step_open and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                step_open = True
            if entry.tool == ASK_PARENT:
                pending_ask = entry.call_id
            else:
                open_calls.add(entry.call_id)
        elif isinstance(entry, ToolResult):
            messages.append(
                {"role": "tool", "tool_call_id": entry.call_id, "content": entry.output}
            )
            open_calls.discard(entry.call_id)
            step_open = False
            if not open_calls:
                flush()
        elif isinstance(entry, Started | Done | Failed | InputRequired) and open_calls:
            # The turn ended (aborted, timed out) with calls still running:
            # they get a result saying so, so every call keeps its answer.
            for call_id in sorted(open_calls):
                messages.append(
                    {"role": "tool", "tool_call_id": call_id, "content": UNFINISHED_CALL}
                )
            open_calls.clear()
            step_open = False
            flush()
    _drop_unfinished_step(messages, pending_ask)
    flush()
    return messages


def _drop_unfinished_step(messages: list[ChatMessage], pending_ask: str | None) -> None:
    """Remove a trailing step whose tool calls (other than a pending question) lack results."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "assistant" and message.get("tool_calls"):
            answered = {m.get("tool_call_id") for m in messages[index + 1 :]}
            missing = [
                c["id"]
                for c in message["tool_calls"]
                if c["id"] not in answered and c["id"] != pending_ask
            ]
            if missing:
                del messages[index:]
            return
        if message["role"] in ("user", "system"):
            return
