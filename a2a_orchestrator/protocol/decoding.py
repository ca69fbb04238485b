"""Child events read back from A2A: stream frames, stored tasks, histories.

The other half of `wire.py` (which writes them and holds the keys): a status
message of ours decodes to its event, a batch (`frames.py`) to its events in
order, each by its uuid (`events_of`); `StreamDecoder` reads a whole stream,
a foreign agent's plain status updates and artifacts included, as the
closest events; `history_entries` and `transcript_from_history` rebuild a
conversation from a stored task after a restart.
"""

from __future__ import annotations

import math
from typing import Any

from a2a.helpers import get_message_text
from a2a.types import Message, Part, Role, StreamResponse, Task, TaskState
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value

from ..models.base import ChatMessage, Usage
from ..runtime.budgets import Spend
from ..runtime.events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    FailReason,
    InputRequired,
    MessageDelta,
    MessageRestarted,
    Started,
    ToolCalled,
    ToolResult,
    new_uuid,
)
from ..runtime.transcript import rebuild_transcript
from .wire import (
    BATCH_KIND,
    EVENT_ID_KEY,
    EVENT_KEY,
    EXACT_INTS,
    from_wire,
    metadata_of,
    note_once,
    plain,
    struct_string,
)

__all__ = [
    "TURN_ENDING_STATES",
    "StreamDecoder",
    "events_of",
    "history_entries",
    "reported_usage",
    "transcript_from_history",
]

_FAIL_REASONS: set[str] = {"error", "max_turns", "aborted", "timeout", "lost", "budget"}


def _meta(message: Message) -> dict[str, Any]:
    return metadata_of(message)


def _data(message: Message) -> dict[str, Any]:
    for part in message.parts:
        if part.HasField("data"):
            value = from_wire(plain(MessageToDict(part.data)))
            if isinstance(value, dict):
                return value
    return {}


def reported_usage(message: Message) -> Usage:
    """The tokens a turn's last status message reports: its done's or
    failed's usage, an input-required's spend (it carries no usage), alone
    or ending a batch (`frames.py`); 0 for what is missing. Raises
    `ValueError` for a Struct JSON cannot hold."""
    if _kind(message) == BATCH_KIND and _ends_turn(message):
        meta = _part_meta(message.parts[-1])
    else:
        meta = metadata_of(message)
    return _usage(meta["usage"] if "usage" in meta else meta.get("spent"))


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
    kind = struct_string(fields.get(EVENT_KEY))
    if not kind:
        return None
    uuid = struct_string(fields.get(EVENT_ID_KEY)) or new_uuid()
    # A WORKING event's part says all; the event that ends a batch's turn
    # (`frames.py`) reads its usage, spend and reason as a message's.
    meta = {} if kind in _WORKING_KINDS and "spent" not in fields else _part_meta(part)
    text = part.text if part.HasField("text") else ""
    data: Any = from_wire(_python(part.data)) if part.HasField("data") else {}
    return _event(kind, uuid, meta, text, data if isinstance(data, dict) else {})


def _step_spent(meta: dict[str, Any]) -> Spend | None:
    """A step's model call spend, when its first event carries one."""
    return Spend.from_dict(meta["spent"]) if isinstance(meta.get("spent"), dict) else None


def _part_meta(part: Part) -> dict[str, Any]:
    """A batch part's metadata as our own data, read as a message's."""
    meta = from_wire(plain(MessageToDict(part.metadata)))
    return meta if isinstance(meta, dict) else {}


def _kind(message: Message) -> str:
    return struct_string(message.metadata.fields.get(EVENT_KEY))


def _ends_turn(batch: Message) -> bool:
    """Whether `batch`'s last part is the event that ends its turn."""
    if not batch.parts:
        return False
    return struct_string(batch.parts[-1].metadata.fields.get(EVENT_KEY)) in _ENDING_KINDS


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
        return int(number) if number.is_integer() and abs(number) <= EXACT_INTS else number
    if kind in ("string_value", "bool_value"):
        return getattr(value, kind)
    return None


_WORKING_KINDS = frozenset(
    {"message_delta", "message_restarted", "message", "tool_called", "tool_result"}
)
_ENDING_KINDS = frozenset({"done", "failed", "input_required"})


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
        case "message_restarted":
            return MessageRestarted(uuid=uuid, reason=text)
        case "message":
            return AssistantMessage(uuid=uuid, text=text, spent=_step_spent(meta))
        case "tool_called":
            args = data.get("arguments")
            return ToolCalled(
                spent=_step_spent(meta),
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
                if _ends_turn(message):
                    # The turn's end came with the events before it (`frames.py`).
                    return [*self._start(), *self._fresh(message, meta)]
                # A batch of WORKING events only: a peer that sends one with
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
