"""Batched frames (the batch extension, `frames.py`): a busy child's events in
few status updates for a caller that asks, one per event for any other, and
what one frame per event guaranteed kept: the same events in the same order,
a pause rule holding the child at its event, recovery after a role server's
crash, and task histories written either way read back alike.

Role servers are real (on 127.0.0.1, and in a process of its own for the
crash), the clients are stock a2a-sdk clients or the orchestrator's remote
transport; only the model is scripted.
"""

from __future__ import annotations

import functools
import json
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from a2a.client import Client, ClientCallContext
from a2a.helpers import new_text_message
from a2a.server.events import EventQueueLegacy
from a2a.server.tasks import TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentExtension,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from support.servers import a2a_client, role_server, start_role_server
from support.sessions import session_for
from support.waiting import wait_for_text

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.delegation.transports.extensions import wanted_extensions
from a2a_orchestrator.delegation.transports.remote import RemoteDelegate
from a2a_orchestrator.models import ScriptedModel, Usage
from a2a_orchestrator.protocol import decoding
from a2a_orchestrator.protocol.decoding import (
    StreamDecoder,
    events_of,
    history_entries,
    reported_usage,
)
from a2a_orchestrator.protocol.frames import FrameBatcher
from a2a_orchestrator.protocol.wire import (
    BATCH_EXTENSION,
    BATCH_EXTENSION_V1,
    BATCH_KIND,
    CONTROL_KEY,
    EVENT_ID_KEY,
    EVENT_KEY,
    PAUSE_ON_KEY,
    write_at_once,
)
from a2a_orchestrator.runtime.budgets import Spend
from a2a_orchestrator.runtime.events import (
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    MessageDelta,
    MessageRestarted,
    ToolCalled,
    ToolResult,
)
from a2a_orchestrator.runtime.roles import find_role
from a2a_orchestrator.runtime.transcript import INTERRUPTED_CALL
from a2a_orchestrator.server import app as server_module
from a2a_orchestrator.server.app import build_card, run_role_server
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio

BATCHED = ClientCallContext(service_parameters={"A2A-Extensions": BATCH_EXTENSION})
"""A call that activates the batch extension (as the remote transport's calls do)."""
BATCHED_V1 = ClientCallContext(service_parameters={"A2A-Extensions": BATCH_EXTENSION_V1})
"""A call that activates the batch extension's v1 (as older orchestrators' calls do)."""

HELD_FOR = 0.2
"""How long a held child is watched for a step: a step here takes microseconds."""


def busy(calls: int, tool: str = "no_such_tool") -> list[dict[str, Any]]:
    """`calls` calls in one step of a tool the role lacks (each answered at
    once, so the turn emits its events without yielding), then an answer."""
    step = [{"name": tool, "arguments": {"n": n}} for n in range(calls)]
    return [{"tool_calls": step}, {"text": "done"}]


def go(text: str = "go", **metadata: Any) -> SendMessageRequest:
    message = new_text_message(text, role=Role.ROLE_USER)
    if metadata:
        message.metadata.update(metadata)
    return SendMessageRequest(message=message)


async def frames_of(
    client: Client, request: SendMessageRequest, context: ClientCallContext | None
) -> tuple[list[StreamResponse], list[ChildEvent]]:
    """A turn's frames and the events they decode to."""
    decoder = StreamDecoder()
    responses: list[StreamResponse] = []
    events: list[ChildEvent] = []
    async for response in client.send_message(request, context=context):
        responses.append(response)
        events.extend(decoder.decode(response))
    return responses, events


def status_messages(responses: list[StreamResponse]) -> list[Message]:
    return [
        r.status_update.status.message
        for r in responses
        if r.WhichOneof("payload") == "status_update"
    ]


def kind_of(message: Message) -> str:
    """A message's `EVENT_KEY` ("" for one that has none, a caller's)."""
    value = message.metadata.fields.get(EVENT_KEY)
    return value.string_value if value is not None else ""


def kinds(events: list[ChildEvent]) -> list[str]:
    return [e.kind for e in events]


async def relayed_both_ways(
    tmp_path: Path, script: Any, *, then: Callable[[Session], Awaitable[None]] | None = None
) -> dict[str, list[ChildEvent]]:
    """The events a child running `script` relays to its parent, in-process
    ("local") and on a role server ("remote"); `then(session)` runs in the
    remote session once its child is done."""
    relayed: dict[str, list[ChildEvent]] = {}
    for transport in ("local", "remote"):
        work = tmp_path / transport
        work.mkdir()
        async with session_for(transport, work, script) as session:
            handle = await session.spawn(ChildConfig(role="coder", prompt="go"))
            relayed[transport] = [event async for event in handle.events()]
            if transport == "remote" and then is not None:
                await then(session)
    return relayed


async def batcher_frames(events: list[ChildEvent], **options: Any) -> list[Any]:
    """The frames a `FrameBatcher` (made with `options`) puts on a2a-sdk's
    event queue for `events`, published one after another without yielding."""
    queue = EventQueueLegacy()
    batcher = FrameBatcher(TaskUpdater(queue, "t1", "c1"), **options)
    frames: list[Any] = []
    with anyio.fail_after(10):
        async with batcher.flushing():
            for event in events:
                await batcher.publish(event)
            with anyio.move_on_after(0.05):
                while True:
                    frames.append(await queue.dequeue_event())
    return frames


# -- few frames, the same events ------------------------------------------------------


async def test_a_busy_child_reaches_the_orchestrator_as_the_local_events_in_few_frames(
    tmp_path: Path,
) -> None:
    script = busy(100)
    with anyio.fail_after(60):
        relayed = await relayed_both_ways(tmp_path, script)
        async with role_server(tmp_path, script) as server, a2a_client(server.url) as client:
            plain, plain_events = await frames_of(client, go(), None)
            batched, batched_events = await frames_of(client, go(), BATCHED)
            v1, v1_events = await frames_of(client, go(), BATCHED_V1)
    # The orchestrator's remote child: the in-process child's events, in order.
    assert relayed["remote"] == relayed["local"]
    expected = ["started", *["tool_called"] * 100, *["tool_result"] * 100, "message_delta"]
    assert kinds(relayed["local"]) == [*expected, "message", "done"]
    assert [e.arguments for e in relayed["remote"] if isinstance(e, ToolCalled)] == [
        {"n": n} for n in range(100)
    ]
    # A stock client that does not ask: one status update per event, as ever.
    assert plain_events == batched_events == relayed["local"]
    messages = status_messages(plain)
    assert len(messages) == len(plain_events)
    for message, event in zip(messages, plain_events, strict=True):
        assert message.message_id == event.uuid
        assert message.metadata[EVENT_KEY] == event.kind
        assert len(message.parts) == 1 and not message.parts[0].HasField("metadata")
        assert not message.extensions
    # One that asks: the turn's start in the task's own frame, the 200 tool
    # events in one frame (a turn that did not yield), then the result
    # artifact, and the answer with the turn's end in the last frame.
    opening = batched[0].task
    assert batched[0].WhichOneof("payload") == "task"
    assert opening.status.state == TaskState.TASK_STATE_WORKING
    assert opening.status.message.metadata[EVENT_KEY] == "started"
    assert opening.status.message.message_id == batched_events[0].uuid
    assert [r.WhichOneof("payload") for r in batched] == [
        "task",
        "status_update",
        "artifact_update",
        "status_update",
    ]
    assert batched[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    messages = status_messages(batched)
    assert all(m.metadata[EVENT_KEY] == BATCH_KIND for m in messages)
    assert [len(m.parts) for m in messages] == [200, 3]
    for message in messages:
        assert list(message.extensions) == [BATCH_EXTENSION]
        for part in message.parts:
            assert {EVENT_KEY, EVENT_ID_KEY} <= set(part.metadata.keys())
    *answer, ending = messages[-1].parts
    # A step's first event also carries its model call's spend.
    working = [*messages[0].parts, *answer]
    for part in working:
        assert set(part.metadata.keys()) - {"spent"} == {EVENT_KEY, EVENT_ID_KEY}
    assert any("spent" in part.metadata.keys() for part in working)
    assert ending.metadata[EVENT_KEY] == "done" and ending.text == "done"
    assert set(ending.metadata.keys()) == {EVENT_KEY, EVENT_ID_KEY, "usage", "spent"}
    # A caller of the extension's v1: the same events, the end alone.
    assert v1_events == relayed["local"]
    messages = status_messages(v1)
    batches = [m for m in messages if m.metadata[EVENT_KEY] == BATCH_KIND]
    assert [len(m.parts) for m in batches] == [200, 2]
    for message in batches:
        assert list(message.extensions) == [BATCH_EXTENSION_V1]
        for part in message.parts:
            assert set(part.metadata.keys()) - {"spent"} == {EVENT_KEY, EVENT_ID_KEY}
    assert [m.metadata[EVENT_KEY] for m in messages if m not in batches] == ["done"]
    # Each event keeps its own uuid.
    assert len({e.uuid for e in batched_events}) == len(batched_events)


async def test_batches_are_bounded_and_never_wait_for_more_events() -> None:
    """Straight on a2a-sdk's event queue: a batch ends at the event bound or the
    byte budget, a lone event is an ordinary frame, and what is queued goes
    out as soon as the producer yields, with no further event to push it."""
    queue = EventQueueLegacy()
    updater = TaskUpdater(queue, "t1", "c1")
    batcher = FrameBatcher(updater, max_events=4, max_bytes=2_000)

    async def sent() -> list[Any]:
        frames: list[Any] = []
        with anyio.move_on_after(0.05):
            while True:
                frames.append(await queue.dequeue_event())
        return frames

    def event_counts(frames: list[Any]) -> list[int]:
        counts = []
        for frame in frames:
            message = frame.status.message
            counts.append(len(message.parts) if message.metadata[EVENT_KEY] == BATCH_KIND else 1)
        return counts

    with anyio.fail_after(10):
        async with batcher.flushing():
            for n in range(10):  # no await that yields in between
                await batcher.publish(MessageDelta(text=f"{n}"))
            await batcher.publish(
                ToolResult(call_id="big", tool="t", output="x" * 3_000, success=True)
            )
            await batcher.publish(AssistantMessage(text="after"))
            # The producer yields (reading the queue): what it queued goes out.
            frames = deltas = await sent()
            assert event_counts(frames) == [4, 4, 2, 1, 1]
            big = frames[3].status.message
            assert big.metadata[EVENT_KEY] == "tool_result"
            assert not big.parts[0].HasField("metadata")
            # The budget flushed the deltas before the big result, not with it.
            assert frames[2].status.message.metadata[EVENT_KEY] == BATCH_KIND
            await batcher.publish(ToolCalled(call_id="c", tool="t"))
            await batcher.publish(ToolResult(call_id="c", tool="t", output="ok", success=True))
            await batcher.publish(Done(text="done", usage=Usage(input_tokens=7, output_tokens=2)))
            frames = await sent()
    # The Done ended the batch it followed (v2): the result artifact, then one
    # COMPLETED update holding the call, its result and the Done.
    assert [type(f).__name__ for f in frames] == [
        "TaskArtifactUpdateEvent",
        "TaskStatusUpdateEvent",
    ]
    assert frames[0].artifact.parts[0].text == "done"
    ended = frames[1].status
    assert ended.state == TaskState.TASK_STATE_COMPLETED
    assert ended.message.metadata[EVENT_KEY] == BATCH_KIND
    assert [p.metadata[EVENT_KEY] for p in ended.message.parts] == [
        "tool_called",
        "tool_result",
        "done",
    ]
    decoded = events_of(ended.message)
    assert kinds(decoded) == ["tool_called", "tool_result", "done"]
    assert isinstance(decoded[-1], Done) and decoded[-1].usage == Usage(
        input_tokens=7, output_tokens=2
    )
    assert reported_usage(ended.message) == Usage(input_tokens=7, output_tokens=2)

    # A v1 caller's batcher: the Done flushes the batch, then goes alone.
    call = ToolCalled(call_id="c", tool="t")
    result = ToolResult(call_id="c", tool="t", output="ok", success=True)
    frames = await batcher_frames([call, result, Done(text="done")], extension=BATCH_EXTENSION_V1)
    assert [type(f).__name__ for f in frames] == [
        "TaskStatusUpdateEvent",
        "TaskArtifactUpdateEvent",
        "TaskStatusUpdateEvent",
    ]
    batch = frames[0].status
    assert batch.message.metadata[EVENT_KEY] == BATCH_KIND
    # The task store writes a frame holding a tool result at once, batched too.
    assert write_at_once(Task(id="t1", status=batch))
    assert not write_at_once(Task(id="t1", status=deltas[0].status))  # deltas only
    assert frames[2].status.state == TaskState.TASK_STATE_COMPLETED
    assert frames[2].status.message.metadata[EVENT_KEY] == "done"


async def test_a_turns_end_that_would_overflow_its_batch_goes_alone_after_it() -> None:
    """The byte bound holds for the turn's end too: with no room left in the
    batch, the batch goes first and the end alone, as without the fold; the
    same events either way. (By count there is always room: a batch goes
    out on reaching its bound.)"""
    for text in ("x" * 1_500, "y" * 1_000):
        events: list[ChildEvent] = [
            MessageDelta(text="a" * 400),
            MessageDelta(text="b" * 400),
            Done(text=text),
        ]
        frames = await batcher_frames(events, max_bytes=2_000)
        assert [type(f).__name__ for f in frames] == [
            "TaskArtifactUpdateEvent",
            "TaskStatusUpdateEvent",
            "TaskStatusUpdateEvent",
        ], len(text)
        first, last = frames[1].status, frames[2].status
        assert first.message.metadata[EVENT_KEY] == BATCH_KIND
        assert first.state == TaskState.TASK_STATE_WORKING
        assert last.state == TaskState.TASK_STATE_COMPLETED
        assert last.message.metadata[EVENT_KEY] == "done"
        assert not last.message.parts[0].HasField("metadata")
        decoder = StreamDecoder()
        read = [e for f in frames[1:] for e in decoder.decode(StreamResponse(status_update=f))]
        assert read == events


SPENT = Spend(input_tokens=30, output_tokens=4, model_calls=2, seconds=1.5, cost=0.25)


@pytest.mark.parametrize(
    ("ending", "state"),
    [
        (
            Failed(
                reason="budget",
                message="out of tokens",
                usage=Usage(input_tokens=30, output_tokens=4),
                spent=SPENT,
            ),
            TaskState.TASK_STATE_FAILED,
        ),
        (Failed(reason="aborted", message="stopped"), TaskState.TASK_STATE_CANCELED),
        (InputRequired(question="which file?", spent=SPENT), TaskState.TASK_STATE_INPUT_REQUIRED),
    ],
)
async def test_every_turn_ending_event_ends_its_batch_and_reads_back_whole(
    ending: ChildEvent, state: TaskState
) -> None:
    """Failed (canceled when aborted) and InputRequired end the batch they
    follow as Done does: one update in the event's state, read back (from the
    stream, from the stored task, by the quotas) as the same events, the
    reason, usage and spend included."""
    events: list[ChildEvent] = [
        ToolCalled(call_id="c", tool="t", arguments={"n": 1}),
        ToolResult(call_id="c", tool="t", output="ok", success=True),
        ending,
    ]
    (update,) = await batcher_frames(events)  # no artifact: only a done has a result
    assert update.status.state == state
    message = update.status.message
    assert message.metadata[EVENT_KEY] == BATCH_KIND
    decoder = StreamDecoder()
    streamed = decoder.decode(StreamResponse(status_update=update))
    stored = history_entries(Task(id="t1", context_id="c1", status=update.status))
    for read in (streamed[1:], stored):  # the stream's first event: the start it never saw
        assert read == events
        assert read[-1].spent == getattr(ending, "spent", None)
    assert decoder.finished_turn
    # The tokens the turn used: a done's or failed's usage, an input
    # required's spend (it carries no usage).
    spent = ending.spent if isinstance(ending, InputRequired) else None
    usage = (
        Usage(input_tokens=spent.input_tokens, output_tokens=spent.output_tokens)
        if spent is not None
        else getattr(ending, "usage", Usage())
    )
    assert reported_usage(message) == usage


# -- pause rules ---------------------------------------------------------------------


async def test_a_pause_rule_holds_the_child_at_an_event_inside_a_would_be_batch(
    tmp_path: Path,
) -> None:
    """The fifth of ten instant calls matches: the turn would send all twenty
    events in one frame, but the held event goes out at once and the child
    takes no step past it until the rule is dropped."""
    calls = [{"name": "no_such_tool", "arguments": {"n": n}} for n in range(10)]
    calls[4] = {"name": "other_tool", "arguments": {"n": 4}}
    script = [{"tool_calls": calls}, {"text": "done"}]
    rule = {"r1": {"kind": "tool_result", "tool": "other_tool"}}
    events: list[ChildEvent] = []
    per_frame: list[int] = []
    matched = anyio.Event()
    task_ids: list[str] = []
    with anyio.fail_after(30):
        async with (
            role_server(tmp_path, script) as server,
            a2a_client(server.url) as client,
            a2a_client(server.url, streaming=False) as control,
        ):

            async def read() -> None:
                decoder = StreamDecoder()
                async for response in client.send_message(
                    go(**{PAUSE_ON_KEY: rule}), context=BATCHED
                ):
                    if response.WhichOneof("payload") == "task":
                        task_ids.append(response.task.id)
                    decoded = decoder.decode(response)
                    per_frame.append(len(decoded))
                    events.extend(decoded)
                    if any(isinstance(e, ToolResult) and e.tool == "other_tool" for e in decoded):
                        matched.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await matched.wait()
                await anyio.sleep(HELD_FOR)
                at_match = list(events)
                (task_id,) = task_ids
                held = server.executor.conversation(task_id)
                assert held is not None and held.held == "r1"
                release = new_text_message("drop the rule", role=Role.ROLE_USER)
                release.task_id = task_id
                release.metadata.update({CONTROL_KEY: "pause_on", PAUSE_ON_KEY: {}})
                async for _ in control.send_message(SendMessageRequest(message=release)):
                    break
    # Nothing past the match while held: ten calls announced, five answered.
    assert kinds(at_match) == ["started", *["tool_called"] * 10, *["tool_result"] * 5]
    last = at_match[-1]
    assert isinstance(last, ToolResult) and last.tool == "other_tool"
    assert max(per_frame) > 1  # the events before the match came batched with it
    assert kinds(events)[len(at_match) :] == [
        *["tool_result"] * 5,
        "message_delta",
        "message",
        "done",
    ]
    assert held.held is None and not held.paused


# -- recovery ------------------------------------------------------------------------


async def test_a_role_server_killed_mid_turn_still_tells_what_was_interrupted(
    tmp_path: Path,
) -> None:
    """Twenty instant calls (batched into the stored history) and a command
    running when the role server is killed -9: the restarted server ends the
    task lost, the child's events are each relayed once, and the next turn's
    model sees the twenty results and the command answered as interrupted."""
    command = "echo start >> runs.txt; sleep 30"
    calls = [{"name": "no_such_tool", "arguments": {"n": n}} for n in range(20)]
    calls.append({"name": "run_command", "arguments": {"command": command}})
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"tool_calls": calls}]))
    db = tmp_path / "role.db"
    process, url = start_role_server(tmp_path, 0, db, script)
    port = int(url.rsplit(":", 1)[1])
    seen: list[list[dict[str, Any]]] = []

    def after_restart(messages: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append(list(messages))
        return {"text": "done"}

    store = Store(tmp_path / "o.db")
    network = Network.of(AgentSpec(name="remote", role="coder", url=url))
    try:
        with anyio.fail_after(60):
            async with Session(
                store,
                workdir=tmp_path,
                network=network,
                remote=functools.partial(RemoteDelegate, lost_after=20),
            ) as session:
                handle = await session.spawn(ChildConfig(role="remote", prompt="run them"))
                await wait_for_text(tmp_path / "runs.txt", "start")
                while sum(isinstance(e, ToolResult) for e in handle.log) < 20:
                    await anyio.sleep(0.02)
                process.send_signal(signal.SIGKILL)
                process.wait()
                async with run_role_server(
                    find_role("coder"),
                    ScriptedModel(after_restart),
                    tmp_path,
                    db=str(db),
                    port=port,
                ):
                    first = await handle.result()
                    stored = await handle.run.client.get_task(GetTaskRequest(id=handle.run.task_id))
                    await handle.send("go on")
                    second = await handle.result()
                events = list(handle.log)
    finally:
        store.close()
        process.kill()
        process.wait()
    # The calls' events were stored as one batch (the command's start made
    # the turn yield), and read back from it.
    batches = [m for m in stored.history if kind_of(m) == BATCH_KIND]
    assert [len(m.parts) for m in batches] == [41]
    assert isinstance(first, Failed) and first.reason == "lost"
    assert "role server stopped while this task ran" in first.message
    assert isinstance(second, Done) and second.text == "done"
    first_turn = events[: events.index(first) + 1]
    assert kinds(first_turn) == ["started", *["tool_called"] * 21, *["tool_result"] * 20, "failed"]
    assert len({e.uuid for e in events}) == len(events)
    (messages,) = seen
    tool_answers = [m["content"] for m in messages if m["role"] == "tool"]
    assert len(tool_answers) == 21 and tool_answers[-1] == INTERRUPTED_CALL
    assert all("Unknown tool" in answer for answer in tool_answers[:20])
    assert messages[-1] == {"role": "user", "content": "go on"}


# -- histories -----------------------------------------------------------------------


async def test_histories_written_either_way_read_back_alike(tmp_path: Path) -> None:
    """A task a caller without the extension ran (one history message per
    event, as every task stored before it) and one batched decode to the
    same events; a replay of either gives nothing twice."""
    with anyio.fail_after(30):
        async with role_server(tmp_path, busy(20)) as server, a2a_client(server.url) as client:
            plain, plain_events = await frames_of(client, go(), None)
            batched, batched_events = await frames_of(client, go(), BATCHED)
            tasks = []
            for responses in (plain, batched):
                task_id = next(r.task.id for r in responses if r.WhichOneof("payload") == "task")
                tasks.append(await client.get_task(GetTaskRequest(id=task_id)))
    old, new = tasks
    assert len(old.history) > 40 and len(new.history) < 10
    entries = [history_entries(task) for task in tasks]
    assert entries[0] == entries[1] == ["go", *plain_events]
    assert [e.uuid for e in entries[1][1:]] == [e.uuid for e in batched_events]
    for task in tasks:
        decoder = StreamDecoder()
        replayed = decoder.decode_task(task)
        assert replayed == plain_events
        assert decoder.decode_task(task) == []  # a re-subscription's snapshot
    # A stream that breaks after a batch and is re-attached: the snapshot
    # holds the batch again, and none of its events comes twice.
    decoder = StreamDecoder()
    first_frames = batched[:2]  # the task (with the turn's start), then a batch
    early = [e for r in first_frames for e in decoder.decode(r)]
    assert len(early) > 1
    assert early + decoder.decode_task(new) == batched_events


async def test_an_orchestrator_reads_a_role_server_that_offers_batch_v1_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role server of an earlier version declares the batch extension's v1
    only: the orchestrator asks for v1 and gets the local child's events,
    its turn's end alone. (The card's v2 entry is swapped for an extension
    no reader knows, so this server stands for such an older one.)"""
    older = AgentExtension(uri="https://example.com/extensions/not-batch-v2")
    monkeypatch.setattr(server_module, "BATCH_CARD_EXTENSION", older)
    listings = []

    async def list_tasks(session: Session) -> None:
        async with a2a_client(session.network.agents["coder"].url or "") as client:
            listings.append(await client.list_tasks(ListTasksRequest()))

    with anyio.fail_after(60):
        relayed = await relayed_both_ways(tmp_path, busy(5), then=list_tasks)
    (listing,) = listings
    assert relayed["remote"] == relayed["local"]
    (task,) = listing.tasks
    batches = [m for m in task.history if kind_of(m) == BATCH_KIND]
    assert batches and all(list(m.extensions) == [BATCH_EXTENSION_V1] for m in batches)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert kind_of(task.status.message) == "done"


def test_the_orchestrator_asks_for_the_newest_batch_version_a_card_declares() -> None:
    """A card of this version declares v2 and v1 (v2 is asked for); an older
    role server's declares v1 only (v1 is asked for, and its frames read as
    ever); a foreign agent's declares neither (no header)."""

    def card(*uris: str) -> AgentCard:
        extensions = [AgentExtension(uri=uri) for uri in uris]
        return AgentCard(name="a", capabilities=AgentCapabilities(extensions=extensions))

    served = build_card(find_role("coder"), "http://127.0.0.1:1")
    assert wanted_extensions(served) == [BATCH_EXTENSION]
    assert wanted_extensions(card(BATCH_EXTENSION_V1, BATCH_EXTENSION)) == [BATCH_EXTENSION]
    assert wanted_extensions(card(BATCH_EXTENSION_V1)) == [BATCH_EXTENSION_V1]
    assert wanted_extensions(card("https://example.com/ext")) == []


@pytest.mark.parametrize("batched", [True, False])
async def test_a_withdrawal_reads_back_in_place_and_an_older_reader_skips_it(
    batched: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`message_restarted` between deltas, in one batch or frame by frame:
    our reader gives it back in its place; a reader of an earlier version
    (its `_event` knows no such kind) skips it, and still reads the whole
    message and the turn's end."""
    events: list[ChildEvent] = [
        MessageDelta(text="Draft one"),
        MessageRestarted(reason="model endpoint unreachable mid-stream"),
        MessageDelta(text="Second"),
        AssistantMessage(text="Second, whole."),
        Done(text="Second, whole."),
    ]
    if batched:
        frames = await batcher_frames(events)
    else:
        frames = []
        for event in events:
            frames.extend(await batcher_frames([event]))
    updates = [f for f in frames if type(f).__name__ == "TaskStatusUpdateEvent"]
    assert len(updates) == (1 if batched else len(events))

    def read() -> list[ChildEvent]:
        decoder = StreamDecoder()
        decoded = [e for f in updates for e in decoder.decode(StreamResponse(status_update=f))]
        # The turn's start was not published here; the decoder supplies one.
        return [e for e in decoded if e.kind != "started"]

    read_back = read()
    assert read_back == events and [e.uuid for e in read_back] == [e.uuid for e in events]
    known = decoding._event
    monkeypatch.setattr(
        decoding,
        "_event",
        lambda kind, *rest: None if kind == "message_restarted" else known(kind, *rest),
    )
    assert [e for e in read() if not isinstance(e, MessageDelta)] == events[3:]
