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
died mid-step) is kept when any of them had started: side effects happen at
most once, so a started call is answered with `INTERRUPTED_CALL` (the model
decides whether to run it again) and one that never started with
`NOT_STARTED_CALL`. `interrupted` names the calls that started (from the tool
journal); without it every such call is taken as possibly started. A call of
a tool that only reads is never journaled (`Tool.read_only`): without a
result it is taken as not run, whether it ran or not, which is harmless. A
step none of whose calls started is dropped, so the model plays it again.
Calls still open when a turn's end was recorded (a role server ends a task
a crash interrupted as `lost`) are answered by that end instead:
`INTERRUPTED_CALL` if they started, else `UNFINISHED_CALL`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence

from ..models.base import ChatMessage
from .conversation import ASK_PARENT
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

__all__ = ["INTERRUPTED_CALL", "NOT_STARTED_CALL", "UNFINISHED_CALL", "rebuild_transcript"]

UNFINISHED_CALL = "(the turn ended before this call finished)"
INTERRUPTED_CALL = (
    "(interrupted: the process running this call stopped before its result was recorded; "
    "it may have run partly or completely. It was not run again: check its effects before "
    "calling it again.)"
)
NOT_STARTED_CALL = (
    "(not run, or its result was lost: the process stopped before this call started, or "
    "the call only reads and has no effect to check; call it again if it is still needed.)"
)


def rebuild_transcript(
    system_prompt: str,
    entries: Iterable[str | ChildEvent],
    *,
    shared_context: Sequence[ChatMessage] = (),
    interrupted: Collection[str] | None = None,
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
                text = INTERRUPTED_CALL if interrupted and call_id in interrupted else None
                messages.append(
                    {"role": "tool", "tool_call_id": call_id, "content": text or UNFINISHED_CALL}
                )
            open_calls.clear()
            step_open = False
            flush()
    _settle_unfinished_step(messages, pending_ask, interrupted)
    flush()
    return messages


def _settle_unfinished_step(
    messages: list[ChatMessage], pending_ask: str | None, interrupted: Collection[str] | None
) -> None:
    """Answer, or drop, a trailing step whose tool calls lack results (see the module doc)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "assistant" and message.get("tool_calls"):
            answered = {m.get("tool_call_id") for m in messages[index + 1 :]}
            missing = [
                c["id"]
                for c in message["tool_calls"]
                if c["id"] not in answered and c["id"] != pending_ask
            ]
            if not missing:
                return
            started = [c for c in missing if interrupted is None or c in interrupted]
            if not started and len(missing) == len(message["tool_calls"]):
                del messages[index:]  # nothing ran: the model plays the step again
                return
            for call_id in missing:
                text = INTERRUPTED_CALL if call_id in started else NOT_STARTED_CALL
                messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
            return
        if message["role"] in ("user", "system"):
            return
