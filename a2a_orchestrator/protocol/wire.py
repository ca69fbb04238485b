"""Child events on the A2A wire: the keys, and how they are written.

Server side, `publish` turns each `ChildEvent` into task updates:

| event             | A2A                                                          |
|-------------------|--------------------------------------------------------------|
| started           | status WORKING, text "<role> started"                        |
| message_delta     | status WORKING, text part (the delta)                        |
| message_restarted | status WORKING, text part (why; the deltas are withdrawn)    |
| message           | status WORKING, text part (the whole message)                |
| tool_called       | status WORKING, data part {call_id, tool, arguments}         |
| tool_result       | status WORKING, data part {call_id, tool, output, success}   |
| input_required    | status INPUT_REQUIRED, text part (the question)              |
| done              | artifact "result" (text part), then status COMPLETED         |
| failed            | status FAILED (CANCELED when aborted), text part, reason     |

`done`, `failed` and `input_required` carry the turn's spend in metadata
(`spent`: tokens, model calls, seconds, cost); `failed` names reason
`budget` when the child's budget stopped it. The first `message` or
`tool_called` of each step carries that step's model call's `spent` too, so
a caller sees a running turn's tokens move (they are counted in totals only
by the turn's end).

Every status message carries `metadata[EVENT_KEY] = kind` (and the usage or
reason where the event has one), so our own client reads events back exactly;
a caller that activates the batch extension (`BATCH_EXTENSION`, `frames.py`)
may get several WORKING events in one status message instead: `EVENT_KEY` is
`batch`, each part is one event (its part as in the table) with the event's
kind and uuid in the part's metadata (`EVENT_KEY`, `EVENT_ID_KEY`); under
the extension's v2 the batch's last part may be the event that ends the turn
(done, failed, input_required: its text part, the rest of its metadata in
the part's), and the status is then that event's (`end_turn`). Reading
them back is `decoding.py`'s: every reader decodes such a message to its
events, in order, each by its uuid; a foreign A2A agent's plain status
updates and artifacts decode to the closest events (`StreamDecoder`). Agent
status messages end up in the task's history, so a conversation can be
rebuilt from a stored task (`transcript_from_history`) after a restart.

Keys: every key we write in metadata and data parts is camelCase
(`inputTokens`, `callId`; `to_wire`), our own namespaced keys included
(`a2aOrchestrator.event`). The reader takes the snake_case names too
(`from_wire`, `metadata_of`): tasks stored before the change, and peers
running an older version, still read back. Keys inside a tool call's
`arguments` are the tool's own and are never renamed.

Numbers: metadata and data parts are protobuf `Struct`s, where every number
is a double, so a usage of `{"inputTokens": 565}` reads `565.0` in the
wire's JSON (the SDK writes each response with protobuf's `json_format`,
which prints a double as one). Our reader turns whole numbers back into
ints (`plain`) before anything stores or shows them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from a2a.helpers import new_text_part
from a2a.types import Message, Part, Task, TaskState
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value

from ..errors import ControlError
from ..runtime.events import (
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
    event_to_dict,
)
from ..runtime.selectors import Selector

if TYPE_CHECKING:
    # Only in annotations: the client side (remote transport) reads frames with
    # these helpers and must not load the SDK's server side.
    from a2a.server.tasks import TaskUpdater

__all__ = [
    "BATCH_EXTENSION",
    "BATCH_EXTENSION_V1",
    "BATCH_KIND",
    "BATCH_VERSIONS",
    "CONFIG_KEY",
    "CONTROL_EXTENSION",
    "CONTROL_KEY",
    "EVENT_ID_KEY",
    "EVENT_KEY",
    "EXACT_INTS",
    "MAX_PAUSE_RULES",
    "PAUSE_ON_KEY",
    "RESULT_ARTIFACT",
    "end_turn",
    "event_to_wire",
    "from_wire",
    "metadata_of",
    "note_once",
    "pause_rules_from_wire",
    "pause_rules_to_wire",
    "plain",
    "publish",
    "send_ending",
    "started_message",
    "struct_string",
    "to_wire",
    "working_meta",
    "working_part",
    "write_at_once",
]

EVENT_KEY = "a2aOrchestrator.event"
CONFIG_KEY = "a2aOrchestrator.config"
"""Message metadata of a child's first message: its `ChildConfig.overrides()`
(keys camelCase on the wire, `to_wire`)."""
CONTROL_KEY = "a2aOrchestrator.control"
"""Message metadata of a control message: pause, resume, interrupt, steer or pause_on."""
PAUSE_ON_KEY = "a2aOrchestrator.pauseOn"
"""Message metadata of a `pause_on` control message, and of a turn's message:
the caller's pause rules for the task, `{rule id: {kind?, tool?, success?,
contains?}}` (the whole set; empty clears it)."""
MAX_PAUSE_RULES = 32
"""Pause rules one task may carry (each is matched against each of its events)."""
CONTROL_EXTENSION = "https://a2a-orchestrator.dev/extensions/control/v1"
"""The A2A extension a role server declares when it takes control messages."""
BATCH_EXTENSION = "https://a2a-orchestrator.dev/extensions/batch/v2"
"""The A2A extension a role server declares when it can send consecutive
WORKING events of a turn as one status update (`frames.py`), the event that
ends the turn included when it follows them at once (the update then has
that event's state); a caller that asks for it (`A2A-Extensions`) reads such
updates (`decoding.events_of`)."""
BATCH_EXTENSION_V1 = "https://a2a-orchestrator.dev/extensions/batch/v1"
"""The batch extension as callers before v2 read it: WORKING events only,
each turn-ending event in a status update of its own. Still declared and
served, so such a caller keeps reading a server of this version."""
BATCH_VERSIONS = (BATCH_EXTENSION, BATCH_EXTENSION_V1)
"""The batch extension's versions, newest first (a caller asking for both gets the newest)."""
BATCH_KIND = "batch"
"""`EVENT_KEY` of a batch's message (older readers skip a kind they do not know)."""
EVENT_ID_KEY = "a2aOrchestrator.eventId"
"""Part metadata in a batch: the uuid of the event the part holds (a single
event's uuid is its message's id)."""
RESULT_ARTIFACT = "result"

LEGACY_KEYS: dict[str, str] = {
    "a2a_orchestrator.event": EVENT_KEY,
    "a2a_orchestrator.config": CONFIG_KEY,
    "a2a_orchestrator.control": CONTROL_KEY,
    "a2a_orchestrator.pause_on": PAUSE_ON_KEY,
    "a2a_orchestrator.mode": "a2aOrchestrator.mode",
}
"""The snake_case names our keys had before 0.2, read still (stored tasks, older peers)."""

# Values under these keys are someone else's data (a tool's arguments),
# whose keys are kept exactly as they are.
_OPAQUE = frozenset({"arguments"})


def _camel(key: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), key)


def _snake(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _rekey(value: Any, name: Any) -> Any:
    if isinstance(value, dict):
        return {
            name(key): item if key in _OPAQUE else _rekey(item, name) for key, item in value.items()
        }
    if isinstance(value, list):
        return [_rekey(item, name) for item in value]
    return value


def to_wire(value: Any) -> Any:
    """Our snake_case data with its keys camelCase, nested (`input_tokens`
    -> `inputTokens`), as the A2A wire writes keys; `arguments` kept as is."""
    return _rekey(value, _camel)


def from_wire(value: Any) -> Any:
    """Wire data with its keys snake_case again, whichever way the sender
    wrote them (camelCase now, snake_case before); the inverse of `to_wire`."""
    return _rekey(value, _snake)


def metadata_of(message: Message | None) -> dict[str, Any]:
    """A message's metadata as our own data: our namespaced keys by their
    current names (an older sender's snake_case ones renamed), the child
    config's keys and the plain keys (`usage`, `spent`) snake_case, whole
    numbers ints. Raises `ValueError` for a Struct JSON cannot hold (NaN)."""
    if message is None or not message.HasField("metadata"):
        return {}
    raw = plain(MessageToDict(message.metadata))
    meta: dict[str, Any] = {}
    for key, value in raw.items():
        if key in LEGACY_KEYS:
            meta.setdefault(LEGACY_KEYS[key], value)
        elif "." in key:
            meta[key] = value  # a namespaced key: its value is its owner's
        else:
            meta[_snake(key)] = from_wire(value)
    if CONFIG_KEY in meta:
        meta[CONFIG_KEY] = from_wire(meta[CONFIG_KEY])
    return meta


def event_to_wire(event: ChildEvent) -> dict[str, Any]:
    """A child event as a relayed data part holds it: `event_to_dict`, camelCase."""
    return to_wire(event_to_dict(event))


logger = logging.getLogger(__name__)
_noted: set[tuple[str, str]] = set()


def note_once(peer: str, what: str) -> None:
    """Log (debug) that `peer` needed a tolerance of the reader, the first time it does."""
    if (peer, what) not in _noted:
        _noted.add((peer, what))
        logger.debug("peer %s: %s", peer, what)


def pause_rules_to_wire(rules: Mapping[str, Selector]) -> dict[str, dict[str, Any]]:
    """Pause rules as `PAUSE_ON_KEY` metadata: each selector's given fields."""
    return {
        rule_id: {k: v for k, v in dataclasses.asdict(selector).items() if v is not None}
        for rule_id, selector in rules.items()
    }


def pause_rules_from_wire(data: object) -> dict[str, Selector]:
    """`PAUSE_ON_KEY` metadata read back; `ControlError` says what is wrong."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ControlError(f"{PAUSE_ON_KEY} must be an object: {{rule id: event selector}}")
    if len(data) > MAX_PAUSE_RULES:
        raise ControlError(f"{PAUSE_ON_KEY}: at most {MAX_PAUSE_RULES} rules, got {len(data)}")
    rules: dict[str, Selector] = {}
    for rule_id, selector in data.items():
        if not isinstance(selector, dict):
            raise ControlError(f"{PAUSE_ON_KEY}: rule {rule_id!r} must be an event selector object")
        rules[str(rule_id)] = Selector.from_dict(selector)
    return rules


def working_part(event: ChildEvent) -> Part | None:
    """The one part of a WORKING event's status message (a delta, a restart,
    a message, a tool call or result); None for the events that are not such a frame
    (the Started frame, and events that change the task's state or artifacts)."""
    match event:
        case MessageDelta(text=text) | AssistantMessage(text=text):
            return new_text_part(text)
        case MessageRestarted(reason=reason):
            # A text part: a reader that does not know the kind (an older
            # peer skips it; a stock client shows the text) is not misled.
            return new_text_part(reason or "stream cut; the message restarts")
        case ToolCalled(call_id=call_id, tool=tool, arguments=arguments):
            return _data_part({"callId": call_id, "tool": tool, "arguments": arguments})
        case ToolResult(call_id=call_id, tool=tool, output=output, success=success):
            data = {"callId": call_id, "tool": tool, "output": output, "success": success}
            return _data_part(data)
    return None


def working_meta(event: ChildEvent) -> dict[str, Any]:
    """A WORKING event's metadata besides its part: its kind, and the model
    call's spend on a step's first event (see the module docstring)."""
    spent = getattr(event, "spent", None)
    if spent is None:
        return {EVENT_KEY: event.kind}
    return {EVENT_KEY: event.kind, "spent": spent.as_dict()}


def _data_part(data: dict[str, Any]) -> Part:
    """`new_data_part(data)`, the same part, built by protobuf's own `Struct.update`
    (a third of the time of a2a-sdk's `ParseDict`, on the hot path of every tool event)."""
    value = Value()
    value.struct_value.update(data)
    return Part(data=value)


async def publish(updater: TaskUpdater, event: ChildEvent) -> None:
    """Send one child event as the A2A updates the table above gives."""
    part = working_part(event)
    if part is not None:
        working = TaskState.TASK_STATE_WORKING
        await _status(updater, working, [part], working_meta(event), event.uuid)
        return
    if isinstance(event, Started):
        message = started_message(event, updater.new_agent_message([]))
        await updater.update_status(TaskState.TASK_STATE_WORKING, message)
        return
    ending = await end_turn(updater, event)
    if ending is not None:
        await send_ending(updater, event, ending)


async def send_ending(
    updater: TaskUpdater, event: ChildEvent, ending: tuple[TaskState, Part, dict[str, Any]]
) -> None:
    """A turn-ending event's status update of its own (`ending`: `end_turn`'s answer)."""
    state, part, meta = ending
    await _status(updater, state, [part], {EVENT_KEY: event.kind, **meta}, event.uuid)


async def end_turn(
    updater: TaskUpdater, event: ChildEvent
) -> tuple[TaskState, Part, dict[str, Any]] | None:
    """For an event that ends a turn (Done, Failed, InputRequired): its task
    state, the text part of its status message and that message's other
    metadata, once the artifacts that go before it are sent (Done's result);
    None for any other event."""
    match event:
        case InputRequired(question=question, spent=spent):
            state = TaskState.TASK_STATE_INPUT_REQUIRED
            return state, new_text_part(question), {"spent": spent.as_dict()}
        case Done(text=text, usage=usage, spent=spent):
            await updater.add_artifact(
                [new_text_part(text)],
                name=RESULT_ARTIFACT,
                metadata=to_wire({"usage": usage.as_dict()}),
            )
            spend = {"usage": usage.as_dict(), "spent": spent.as_dict()}
            return TaskState.TASK_STATE_COMPLETED, new_text_part(text), spend
        case Failed(reason=reason, message=message, usage=usage, spent=spent):
            state = (
                TaskState.TASK_STATE_CANCELED
                if reason == "aborted"
                else TaskState.TASK_STATE_FAILED
            )
            spend = {"usage": usage.as_dict(), "spent": spent.as_dict()}
            return state, new_text_part(message), {"reason": reason, **spend}
    return None


def started_message(event: Started, message: Message) -> Message:
    """`message` (an agent message of the task) made the status message a
    turn's start goes out with: "ROLE started", the role and model in its
    metadata, the event's uuid as its id. The status update it travels in
    (`publish`) may be the task's own first frame instead (`executor.py`,
    for a caller that reads batches)."""
    meta = {EVENT_KEY: event.kind, "role": event.role, "model": event.model}
    del message.parts[:]
    message.parts.append(new_text_part(f"{event.role or 'agent'} started"))
    message.metadata.update(to_wire(meta))
    message.message_id = event.uuid
    return message


def write_at_once(task: Task) -> bool:
    """Whether a stored task's latest frame must reach the disk at once though
    its state did not change (`SQLiteTaskStore`'s `write_now`): one carrying a
    tool's result (alone, or in a batch), since the call's journal row is
    closed once its result is out, and a crash must not leave a closed call
    whose result is unknown."""
    if not task.status.HasField("message"):
        return False
    message = task.status.message
    kind = struct_string(message.metadata.fields.get(EVENT_KEY))
    if kind == BATCH_KIND:
        return any(
            struct_string(part.metadata.fields.get(EVENT_KEY)) == "tool_result"
            for part in message.parts
        )
    return kind == "tool_result"


def struct_string(value: Value | None) -> str:
    """A Struct value's string ("" when absent or not a string)."""
    if value is None or value.WhichOneof("kind") != "string_value":
        return ""
    return value.string_value


async def _status(
    updater: TaskUpdater,
    state: TaskState,
    parts: list[Part],
    meta: dict[str, Any],
    uuid: str,
) -> None:
    message = updater.new_agent_message(parts, metadata=to_wire(meta))
    # The event's uuid is the message id: both ends know the event by it.
    message.message_id = uuid
    await updater.update_status(state, message)


EXACT_INTS = 2**53
"""Whole doubles up to here are exactly the ints they were sent as."""


def plain(value: Any) -> Any:
    """A decoded `Struct` value with its whole numbers as ints again.

    A `Struct` keeps every number as a double, so 565 comes back as 565.0;
    a whole number within 2**53 was an int (or is one as well as JSON can
    tell). Other values, nested in lists and dicts, are kept as they are.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_INTS:
        return int(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
