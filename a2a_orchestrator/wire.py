"""Child events on the A2A wire, both ways, written once.

Server side, `publish` turns each `ChildEvent` into task updates:

| event            | A2A                                                          |
|------------------|--------------------------------------------------------------|
| started          | status WORKING, text "<role> started"                        |
| message_delta    | status WORKING, text part (the delta)                        |
| message          | status WORKING, text part (the whole message)                |
| tool_called      | status WORKING, data part {call_id, tool, arguments}         |
| tool_result      | status WORKING, data part {call_id, tool, output, success}   |
| input_required   | status INPUT_REQUIRED, text part (the question)              |
| done             | artifact "result" (text part), then status COMPLETED         |
| failed           | status FAILED (CANCELED when aborted), text part, reason     |

`done`, `failed` and `input_required` carry the turn's spend in metadata
(`spent`: tokens, model calls, seconds, cost); `failed` names reason
`budget` when the child's budget stopped it.

Every status message carries `metadata[EVENT_KEY] = kind` (and the usage or
reason where the event has one), so our own client reads events back exactly;
a caller that activates the batch extension (`BATCH_EXTENSION`, `frames.py`)
may get several WORKING events in one status message instead: `EVENT_KEY` is
`batch`, each part is one event (its part as in the table) with the event's
kind and uuid in the part's metadata (`EVENT_KEY`, `EVENT_ID_KEY`). Every
reader here decodes such a message to its events, in order, each by its uuid;
a foreign A2A agent's plain status updates and artifacts decode to the
closest events (`StreamDecoder`). Agent status messages end up in the task's
history, so a conversation can be rebuilt from a stored task
(`transcript_from_history`) after a restart.

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
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from a2a.helpers import get_message_text, new_text_part
from a2a.types import Message, Part, Role, StreamResponse, Task, TaskState
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value

from .budgets import Spend
from .errors import ControlError
from .events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    FailReason,
    InputRequired,
    MessageDelta,
    Started,
    ToolCalled,
    ToolResult,
    event_to_dict,
    new_uuid,
)
from .models.base import ChatMessage, Usage
from .selectors import Selector
from .transcript import rebuild_transcript

if TYPE_CHECKING:
    # Only in annotations: the client side (remote transport) reads frames with
    # these helpers and must not load the SDK's server side.
    from a2a.server.tasks import TaskUpdater

__all__ = [
    "BATCH_EXTENSION",
    "BATCH_KIND",
    "CONFIG_KEY",
    "CONTROL_EXTENSION",
    "CONTROL_KEY",
    "EVENT_ID_KEY",
    "EVENT_KEY",
    "MAX_PAUSE_RULES",
    "PAUSE_ON_KEY",
    "RESULT_ARTIFACT",
    "TURN_ENDING_STATES",
    "StreamDecoder",
    "event_to_wire",
    "events_of",
    "from_wire",
    "history_entries",
    "metadata_of",
    "note_once",
    "pause_rules_from_wire",
    "pause_rules_to_wire",
    "plain",
    "publish",
    "to_wire",
    "transcript_from_history",
    "usage_from_wire",
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
BATCH_EXTENSION = "https://a2a-orchestrator.dev/extensions/batch/v1"
"""The A2A extension a role server declares when it can send consecutive
WORKING events of a turn as one status update (`frames.py`); a caller that
asks for it (`A2A-Extensions`) reads such updates (`events_of`)."""
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


_FAIL_REASONS: set[str] = {"error", "max_turns", "aborted", "timeout", "lost", "budget"}


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
    """The one part of a WORKING event's status message (a delta, a message,
    a tool call or result); None for the events that are not such a frame
    (the Started frame, and events that change the task's state or artifacts)."""
    match event:
        case MessageDelta(text=text) | AssistantMessage(text=text):
            return new_text_part(text)
        case ToolCalled(call_id=call_id, tool=tool, arguments=arguments):
            return _data_part({"callId": call_id, "tool": tool, "arguments": arguments})
        case ToolResult(call_id=call_id, tool=tool, output=output, success=success):
            data = {"callId": call_id, "tool": tool, "output": output, "success": success}
            return _data_part(data)
    return None


def _data_part(data: dict[str, Any]) -> Part:
    """`new_data_part(data)`, the same part, built by protobuf's own `Struct.update`
    (a third of the time of a2a-sdk's `ParseDict`, on the hot path of every tool event)."""
    value = Value()
    value.struct_value.update(data)
    return Part(data=value)


async def publish(updater: TaskUpdater, event: ChildEvent) -> None:
    """Send one child event as the A2A updates the table above gives."""
    meta: dict[str, Any] = {EVENT_KEY: event.kind}
    working = TaskState.TASK_STATE_WORKING
    part = working_part(event)
    if part is not None:
        await _status(updater, working, [part], meta, event.uuid)
        return
    match event:
        case Started(role=role, model=model):
            meta.update(role=role, model=model)
            await _status(
                updater, working, [new_text_part(f"{role or 'agent'} started")], meta, event.uuid
            )
        case InputRequired(question=question, spent=spent):
            meta["spent"] = spent.as_dict()
            state = TaskState.TASK_STATE_INPUT_REQUIRED
            await _status(updater, state, [new_text_part(question)], meta, event.uuid)
        case Done(text=text, usage=usage, spent=spent):
            meta["usage"] = usage.as_dict()
            meta["spent"] = spent.as_dict()
            await updater.add_artifact(
                [new_text_part(text)],
                name=RESULT_ARTIFACT,
                metadata=to_wire({"usage": usage.as_dict()}),
            )
            state = TaskState.TASK_STATE_COMPLETED
            await _status(updater, state, [new_text_part(text)], meta, event.uuid)
        case Failed(reason=reason, message=message, usage=usage, spent=spent):
            meta.update(reason=reason, usage=usage.as_dict(), spent=spent.as_dict())
            state = (
                TaskState.TASK_STATE_CANCELED
                if reason == "aborted"
                else TaskState.TASK_STATE_FAILED
            )
            await _status(updater, state, [new_text_part(message)], meta, event.uuid)


def write_at_once(task: Task) -> bool:
    """Whether a stored task's latest frame must reach the disk at once though
    its state did not change (`SQLiteTaskStore`'s `write_now`): one carrying a
    tool's result (alone, or in a batch), since the call's journal row is
    closed once its result is out, and a crash must not leave a closed call
    whose result is unknown."""
    if not task.status.HasField("message"):
        return False
    message = task.status.message
    kind = _string(message.metadata.fields.get(EVENT_KEY))
    if kind == BATCH_KIND:
        return any(
            _string(part.metadata.fields.get(EVENT_KEY)) == "tool_result" for part in message.parts
        )
    return kind == "tool_result"


def _string(value: Value | None) -> str:
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


# Whole doubles up to here are exactly the ints they were sent as.
_EXACT = 2**53


def plain(value: Any) -> Any:
    """A decoded `Struct` value with its whole numbers as ints again.

    A `Struct` keeps every number as a double, so 565 comes back as 565.0;
    a whole number within 2**53 was an int (or is one as well as JSON can
    tell). Other values, nested in lists and dicts, are kept as they are.
    """
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT:
        return int(value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def _meta(message: Message) -> dict[str, Any]:
    return metadata_of(message)


def _data(message: Message) -> dict[str, Any]:
    for part in message.parts:
        if part.HasField("data"):
            value = from_wire(plain(MessageToDict(part.data)))
            if isinstance(value, dict):
                return value
    return {}


def usage_from_wire(raw: Any) -> Usage:
    """A `usage` object as read back by `metadata_of` (snake_case keys); 0 for what is missing."""
    return _usage(raw)


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=int(raw.get("input_tokens", 0) or 0),
        output_tokens=int(raw.get("output_tokens", 0) or 0),
    )


def _reason(raw: Any, default: FailReason) -> FailReason:
    return raw if isinstance(raw, str) and raw in _FAIL_REASONS else default  # type: ignore[return-value]


def _decode_part(part: Part) -> ChildEvent | None:
    """One event of a batch: a part with its kind and uuid in its metadata."""
    fields = part.metadata.fields
    kind = _string(fields.get(EVENT_KEY))
    if not kind:
        return None
    uuid = _string(fields.get(EVENT_ID_KEY)) or new_uuid()
    # A batch holds WORKING events, whose part says all; other kinds (which
    # a batch does not hold today) read their usage and reason as a message's.
    meta = {} if kind in _WORKING_KINDS else from_wire(plain(MessageToDict(part.metadata)))
    text = part.text if part.HasField("text") else ""
    data: Any = from_wire(_python(part.data)) if part.HasField("data") else {}
    return _event(kind, uuid, meta, text, data if isinstance(data, dict) else {})


def _python(value: Value) -> Any:
    """`plain(MessageToDict(value))` without json_format's generic walk (every
    part of a batch is read so): whole numbers as ints, `ValueError` for a
    number JSON cannot hold."""
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: _python(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_python(item) for item in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        if not math.isfinite(number):
            raise ValueError(f"a number JSON cannot hold: {number}")
        return int(number) if number.is_integer() and abs(number) <= _EXACT else number
    if kind in ("string_value", "bool_value"):
        return getattr(value, kind)
    return None


_WORKING_KINDS = frozenset({"message_delta", "message", "tool_called", "tool_result"})


def events_of(message: Message, meta: dict[str, Any] | None = None) -> list[ChildEvent]:
    """Our child events in one agent message (`meta`: its `metadata_of`, if
    read already): its event, a batch's events in order, or none (a message
    that is not ours)."""
    if meta is None:
        meta = _meta(message)
    kind = meta.get(EVENT_KEY)
    if kind == BATCH_KIND:
        events = [event for part in message.parts if (event := _decode_part(part)) is not None]
        if len(events) < len(message.parts):
            # Not ours to read (no kind, or one this version does not know):
            # skipped, said once.
            note_once("a batch", "parts that are no child event were skipped")
        return events
    if not isinstance(kind, str):
        return []
    uuid = message.message_id or new_uuid()
    event = _event(kind, uuid, meta, get_message_text(message), _data(message))
    return [event] if event is not None else []


def _event(
    kind: str, uuid: str, meta: dict[str, Any], text: str, data: dict[str, Any]
) -> ChildEvent | None:
    match kind:
        case "started":
            return Started(
                uuid=uuid, role=str(meta.get("role", "")), model=str(meta.get("model", ""))
            )
        case "message_delta":
            return MessageDelta(uuid=uuid, text=text)
        case "message":
            return AssistantMessage(uuid=uuid, text=text)
        case "tool_called":
            args = data.get("arguments")
            return ToolCalled(
                uuid=uuid,
                call_id=str(data.get("call_id", "")),
                tool=str(data.get("tool", "")),
                arguments=args if isinstance(args, dict) else {},
            )
        case "tool_result":
            return ToolResult(
                uuid=uuid,
                call_id=str(data.get("call_id", "")),
                tool=str(data.get("tool", "")),
                output=str(data.get("output", "")),
                success=bool(data.get("success", False)),
            )
        case "input_required":
            return InputRequired(uuid=uuid, question=text, spent=Spend.from_dict(meta.get("spent")))
        case "done":
            return Done(
                uuid=uuid,
                text=text,
                usage=_usage(meta.get("usage")),
                spent=Spend.from_dict(meta.get("spent")),
            )
        case "failed":
            return Failed(
                uuid=uuid,
                reason=_reason(meta.get("reason"), "error"),
                message=text,
                usage=_usage(meta.get("usage")),
                spent=Spend.from_dict(meta.get("spent")),
            )
    return None


class StreamDecoder:
    """Turns one task's stream responses back into child events.

    Every status message is decoded once, by its message id, so a task
    snapshot (the first frame of a stream, a re-subscription, GetTask) can
    be replayed in full: events a broken stream missed come back from the
    task's history, and events already seen are skipped. A foreign agent may
    put its answer in artifacts and end with a bare COMPLETED status, so
    artifact text is kept until then.
    """

    def __init__(self, *, peer: str = "") -> None:
        self.peer = peer
        """The agent's address, naming it in the tolerances noted (`note_once`)."""
        self._seen: set[str] = set()
        self._artifacts: dict[str, list[str]] = {}
        self._started = False
        self.task_id = ""
        self.context_id = ""
        self.state: TaskState = TaskState.TASK_STATE_UNSPECIFIED
        self._state_of = ""
        """The task whose state `state` is (a replay of it is skipped)."""

    def new_turn(self) -> None:
        """Forget the last turn's artifacts (a new task may follow); seen ids stay seen."""
        self._artifacts.clear()

    @property
    def finished_turn(self) -> bool:
        """The task is terminal or waiting for input: this turn is over."""
        return self.state in TURN_ENDING_STATES

    def decode(self, response: StreamResponse) -> list[ChildEvent]:
        which = response.WhichOneof("payload")
        if which == "task":
            return self.decode_task(response.task)
        if which == "artifact_update":
            update = response.artifact_update
            self._note(update.task_id, update.context_id)
            self._keep_artifact(update.artifact, append=update.append)
            return []
        if which == "status_update":
            update = response.status_update
            self._note(update.task_id, update.context_id)
            status = update.status
            message = status.message if status.HasField("message") else None
            return self._decode_status(status.state, message)
        if which == "message":
            # A peer that answers with a bare message finished in one step.
            self.state = TaskState.TASK_STATE_COMPLETED
            done = Done(uuid=response.message.message_id, text=get_message_text(response.message))
            return [*self._start(), done]
        return []

    def decode_task(self, task: Task) -> list[ChildEvent]:
        """A task snapshot: replay what its history holds that was not seen yet."""
        self._note(task.id, task.context_id)
        for artifact in task.artifacts:
            self._keep_artifact(artifact, append=False)
        events: list[ChildEvent] = []
        for message in task.history:
            if message.role == Role.ROLE_AGENT and message.message_id not in self._seen:
                self._seen.add(message.message_id)
                events.extend(self._fresh(message))
        message = task.status.message if task.status.HasField("message") else None
        events.extend(self._decode_status(task.status.state, message))
        return events

    def _fresh(self, message: Message, meta: dict[str, Any] | None = None) -> list[ChildEvent]:
        """A message's events not decoded yet (the caller marked the message
        itself decoded); a batch's events are known by their uuids too, so a
        replay never gives one twice."""
        fresh: list[ChildEvent] = []
        for event in events_of(message, meta):
            if event.uuid != message.message_id and event.uuid in self._seen:
                continue
            self._seen.add(event.uuid)
            self._started = self._started or isinstance(event, Started)
            fresh.append(event)
        return fresh

    def _note(self, task_id: str, context_id: str) -> None:
        self.task_id = task_id or self.task_id
        self.context_id = context_id or self.context_id

    def _keep_artifact(self, artifact: Any, *, append: bool) -> None:
        texts = [p.text for p in artifact.parts if p.HasField("text")]
        if not append:
            self._artifacts[artifact.artifact_id] = texts
            return
        kept = self._artifacts.get(artifact.artifact_id)
        if kept is None:
            # A chunk of an artifact whose first chunk never came (or came
            # marked `append`): it starts the artifact.
            note_once(self.peer, "an append chunk for an unknown artifact starts it")
            self._artifacts[artifact.artifact_id] = texts
        elif kept and texts:
            # A streamed chunk continues the text it follows.
            kept[-1] += texts[0]
            kept.extend(texts[1:])
        else:
            kept.extend(texts)

    def _start(self) -> list[ChildEvent]:
        if self._started:
            return []
        self._started = True
        return [Started(uuid=f"{self.task_id}:started")]

    def _decode_status(self, state: TaskState, message: Message | None) -> list[ChildEvent]:
        # A replayed terminal state of the same task is skipped; a new task in
        # the context (a later turn) that answers with its final snapshot (a
        # blocking send to a peer that cannot stream) is not a replay.
        replay = self.state == state and self._state_of == self.task_id
        if state in TURN_ENDING_STATES and replay and message is None:
            return []
        self.state, self._state_of = state, self.task_id
        batch: list[ChildEvent] = []
        if message is not None:
            if message.message_id in self._seen:
                return []
            self._seen.add(message.message_id)
            meta = _meta(message)
            kind = meta.get(EVENT_KEY)
            if isinstance(kind, str):
                if kind != BATCH_KIND or state == TaskState.TASK_STATE_WORKING:
                    return self._fresh(message, meta)
                # A batch holds WORKING events: a peer that sends one with
                # another state changes the state all the same (ends the
                # turn, with its artifacts as the result), after its events.
                batch, message = self._fresh(message, meta), None
        if state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_UNSPECIFIED):
            return batch
        text = get_message_text(message) if message is not None else ""
        # A foreign agent's message id names the event; a bare state change
        # is named by task and state, so a replay of it is recognised too.
        uuid = message.message_id if message is not None and message.message_id else ""
        uuid = uuid or f"{self.task_id}:{TaskState.Name(state)}"
        events = [*self._start(), *batch]
        match state:
            case TaskState.TASK_STATE_WORKING:
                if text:
                    events.append(AssistantMessage(uuid=uuid, text=text))
            case TaskState.TASK_STATE_INPUT_REQUIRED | TaskState.TASK_STATE_AUTH_REQUIRED:
                events.append(InputRequired(uuid=uuid, question=text or "(input required)"))
            case TaskState.TASK_STATE_COMPLETED:
                result = "\n".join(t for texts in self._artifacts.values() for t in texts)
                events.append(Done(uuid=uuid, text=result or text))
            case TaskState.TASK_STATE_CANCELED:
                events.append(Failed(uuid=uuid, reason="aborted", message=text or "canceled"))
            case TaskState.TASK_STATE_FAILED | TaskState.TASK_STATE_REJECTED:
                events.append(Failed(uuid=uuid, reason="error", message=text or "failed"))
        return events


# Task states that end a turn (the task is over, or waits for its caller).
TURN_ENDING_STATES = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
        TaskState.TASK_STATE_INPUT_REQUIRED,
        TaskState.TASK_STATE_AUTH_REQUIRED,
    }
)


def transcript_from_history(
    task: Task, system_prompt: str, *, exclude: str = ""
) -> list[ChatMessage]:
    """Rebuild a conversation's chat messages from a stored task.

    The inverse of `publish` over `task.history` (plus the current status
    message, which has not moved into the history yet); see `transcript.py`.
    `exclude` names a message to leave out (the request being handled now,
    which the conversation takes as its new input).
    """
    return rebuild_transcript(system_prompt, history_entries(task, exclude=exclude))


def history_entries(task: Task, *, exclude: str = "") -> list[str | ChildEvent]:
    """A task's history as transcript entries: user texts and our child events."""
    history = list(task.history)
    if task.status.HasField("message"):
        history.append(task.status.message)
    seen: set[str] = {exclude} if exclude else set()
    entries: list[str | ChildEvent] = []
    for message in history:
        if message.message_id in seen:
            continue
        seen.add(message.message_id)
        if message.role == Role.ROLE_USER:
            entries.append(get_message_text(message))
            continue
        for event in events_of(message):
            # A batch's events are known by their own uuids too.
            if event.uuid == message.message_id or event.uuid not in seen:
                seen.add(event.uuid)
                entries.append(event)
    return entries
