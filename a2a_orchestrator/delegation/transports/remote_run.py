"""`RemoteRun`: one child that is an A2A task on a remote agent, turn by turn.

Contract of a turn (`RemoteRun.turn`), so no child is left `running`:
- Identity before I/O: a message that opens a task goes out with a context
  id and message id the caller stored first (chosen by `open`, read from the
  run; a later task's is told to `on_identity` before it is sent). When the
  stream gives out before naming the task (or after a restart), the task is
  found again by them (ListTasks of the context, the message id in a task's
  history); an agent that answers without it never got the message, which
  is then sent again with the same ids (a role server that did get it
  answers with that task, never a second one).
- A broken stream, or one that ends without a terminal frame, is re-attached
  (GetTask, then SubscribeToTask while the task still works); the task's
  history fills in what the break missed. A task that finishes between the
  two is refused a subscription ("is in terminal state"): it is read again
  and the turn ends from it, as after any refused follow (`_reattach`).
- A stream silent for `idle_probe` seconds is probed with GetTask: a task
  that is done ends the turn from the answer, a working one (a long command
  sends no frames) is waited for.
- Slow is not dead: a question (a probe, a read, a lookup) waits for its
  answer until `lost_after` seconds of silence, and an answer or a frame
  that comes late is contact like a prompt one; a frame that comes while a
  probe waits answers the probe. A silent stream is no evidence (a working
  task may say nothing): silence counts from a question asked.
- An agent that still refuses or resets connections `lost_after` seconds
  after it was last heard, or leaves a question unanswered that long, ends
  the child `Failed(reason="lost")`.
- A turn not over by its deadline (the child's timeout plus
  `deadline_grace`) has its task cancelled on the agent (best effort) and
  ends `Failed(reason="timeout")`. Only the deadline ends a working task.

Pause rules (`pause_on`, for a role server whose card lists the action): the
rules go with every turn's message, and as a `pause_on` control message when
they change while a turn runs (once a frame of the turn came: the server
took the turn's own rules before its first frame, so they cannot overwrite
the newer ones). The server then holds the task at the matching event
itself, so a parent's pause decided on that event lands there, however late
the event reaches the parent. Rules that change while a turn's message is
on its way reach the server one round trip after the turn's first frame.

Steering (`steer`, over the control extension) goes to the turn's task once
the agent is known to be running it (a first event of the turn); until then
it is held and sent then. The agent decides whether its turn still reads it;
one that has passed its last step boundary refuses ("not running"), and the
text goes back to the handle as a turn of its own, as does held steering
the turn ended without sending.

Batched frames: with an agent whose card declares `wire.BATCH_EXTENSION`,
every call activates it (`extensions.py`), so a busy child's events come
several to a status update; the decoder gives them one by one, each by its
uuid, from a stream, a re-subscription or a task's history alike.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import anyio
from a2a.client import Client, ClientCallContext
from a2a.helpers import new_text_message
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError, InvalidParamsError
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from google.protobuf.json_format import MessageToDict

from ...errors import AgentUnavailableError, DelegationError, DelegationTimeoutError, ProtocolError
from ...models.base import ChatMessage
from ...protocol.decoding import StreamDecoder, transcript_from_history
from ...protocol.wire import (
    CONFIG_KEY,
    CONTROL_EXTENSION,
    CONTROL_KEY,
    PAUSE_ON_KEY,
    note_once,
    pause_rules_to_wire,
)
from ...runtime.budgets import Budget
from ...runtime.events import TERMINAL_KINDS, ChildEvent, Failed
from ...runtime.render import CANCELED_TEXT
from ...runtime.selectors import Selector
from ..base import Emit, IdentityListener
from ..network import AgentSpec
from .client_errors import says_finished, translated

__all__ = ["AgentClients", "RemoteRun"]

logger = logging.getLogger(__name__)

# How a role server (handler.py) refuses a control message for a task whose
# turn is over, or, for steering, past its last step boundary.
_NOT_RUNNING = "is not running on this server"


class AgentClients(Protocol):
    """What a run needs of the delegate that opened it (`RemoteDelegate`):
    the agent's card and clients, and the delegate's timing settings."""

    lost_after: float
    deadline_grace: float
    retry_interval: float
    idle_probe: float

    async def card(self, spec: AgentSpec) -> AgentCard: ...

    def streaming_client(self, spec: AgentSpec, card: AgentCard) -> Client: ...

    def plain_client(self, run: RemoteRun) -> Client: ...


class RemoteRun:
    """A child that is an A2A task on a remote agent (see the module docstring)."""

    transport = "remote"

    def __init__(
        self,
        delegate: AgentClients,
        spec: AgentSpec,
        client: Client | None,
        card: AgentCard | None,
        *,
        overrides: dict[str, Any],
        turn_timeout: float,
        task_id: str = "",
        context_id: str = "",
        message_id: str = "",
        pending_text: str = "",
        turn_started: float | None = None,
        fresh: bool = False,
        finished: bool = False,
    ) -> None:
        """`fresh`: a new child, whose first turn sends its opening message
        under the stored `message_id`; a reopened child finds that message's
        task (or sends it again) only to continue an interrupted turn.
        `client` and `card` None: read on first use (`connect`). `finished`:
        the stored child's task is over (done or failed), so its next turn
        opens a new task in the context rather than writing to a closed one."""
        self.delegate = delegate
        self.spec = spec
        self.url = spec.url or ""
        self._client = client
        self._card = card
        self.overrides = overrides
        self.turn_timeout = turn_timeout
        """Seconds a turn may take (the child's timeout); the deadline adds the grace."""
        self.task_id = task_id
        self.context_id = context_id
        self.message_id = message_id
        """The id of the message that opens (or opened) the child's newest task."""
        self.on_identity: IdentityListener | None = None
        self.decoder = StreamDecoder(peer=self.url)
        if finished:
            self.decoder.state = TaskState.TASK_STATE_COMPLETED
        # The context's first message carries the child's configuration; a
        # stored task means it was sent (recovery learns it from ListTasks).
        self._sent_config = bool(task_id)
        # A new child's stored opening message id is not sent yet: its first
        # turn sends it. A later new task gets an id of its own.
        self._unsent = fresh and bool(message_id)
        self._pending_text = pending_text
        self._turn_started = turn_started
        self._cancel_requested = False
        self._ended = False
        self._contact = 0.0
        self._probing: anyio.CancelScope | None = None
        """The GetTask of a probe in flight, ended by a frame (`_frame_came`)."""
        self._pause_rules: dict[str, Any] = {}
        """The pause rules (wire form) the task's turns should carry."""
        self._rules_unsent = False
        """The rules changed since the server last got them."""
        self._turn_live = False
        """A frame of the running turn came (the server is executing it)."""
        self._rules_lock = anyio.Lock()
        # Steering held until the agent runs this turn (`_live`), in order;
        # sent by one task at a time, so none is sent twice.
        self._held: list[str] = []
        self._live = False
        self._sending = anyio.Lock()
        # The agent said this turn reads no more steering: it is not asked again.
        self._past_steering = False

    @property
    def model(self) -> str:
        return str(self.overrides.get("model", ""))

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError(f"the run of {self.url} is not connected yet")
        return self._client

    @property
    def card(self) -> AgentCard:
        if self._card is None:
            raise RuntimeError(f"the run of {self.url} is not connected yet")
        return self._card

    async def connect(self) -> None:
        """Read the agent's card and open a client, once."""
        if self._client is None:
            card = await self.delegate.card(self.spec)
            self._card = card
            self._client = self.delegate.streaming_client(self.spec, card)

    async def _note_ids(self) -> None:
        task_id, context_id = self.decoder.task_id, self.decoder.context_id
        if (task_id, context_id) != (self.task_id, self.context_id) and task_id:
            self.task_id, self.context_id = task_id, context_id
            if self.on_identity is not None:
                await self.on_identity()
            if self._cancel_requested:
                # Cancel asked for before the agent told us the task's id.
                await self._send_cancel()

    def _heard(self) -> None:
        """The agent answered: the `lost_after` clock starts again."""
        self._contact = anyio.current_time()

    def _frame_came(self) -> None:
        """A frame came on the stream (read ahead by `_read`, even while a
        probe waits): contact, and the probe in flight is answered by it."""
        self._heard()
        if self._probing is not None:
            self._probing.cancel()

    async def _unreachable(self, exc: DelegationError, emit: Emit) -> bool:
        """Count a refused or reset call toward `lost_after`; True once the
        child is lost (emitted). A question that timed out waited
        `lost_after` for its answer (`_call`): lost, unless a frame came meanwhile."""
        if anyio.current_time() - self._contact < self.delegate.lost_after:
            return False
        await emit(Failed(reason="lost", message=f"lost contact with {self.url}: {exc}"))
        return True

    # -- a turn -------------------------------------------------------------------

    async def turn(self, text: str | None, emit: Emit) -> list[str]:
        """Play one turn within its deadline (see the module docstring);
        returns the held steering it never sent (the handle's next turn)."""
        await self.connect()
        # A cancel asked for before an earlier turn's task had an id does not
        # carry over to this turn (the handle stops a turn not yet started).
        self._cancel_requested = False
        self._ended = False
        self._live = False
        self._past_steering = False
        self._heard()

        async def watched(event: ChildEvent) -> None:
            await emit(event)
            self._ended = self._ended or event.kind in TERMINAL_KINDS
            if event.kind in TERMINAL_KINDS:
                self._turn_live = False
            if self._ended:
                self._live = False
            elif self.task_id and not self._past_steering:
                # The agent runs this turn now: steering can reach it.
                self._live = True
                if self._held:
                    await self._send_held()

        # A turn resumed after a restart keeps the deadline it started with.
        left = self.turn_timeout + self.delegate.deadline_grace
        if text is None and self._turn_started is not None:
            left -= max(0.0, time.time() - self._turn_started)
        self._turn_started = None
        try:
            with anyio.move_on_after(max(0.0, left)) as scope:
                await self._play(text, watched)
            if scope.cancelled_caught and not self._ended:
                await self._time_out(watched)
        finally:
            self._turn_live = False
            self._live = False
        # After a send in flight has its answer: what the agent took is not
        # handed back as well.
        async with self._sending:
            unsent, self._held = self._held, []
        return unsent

    async def _play(self, text: str | None, emit: Emit) -> None:
        if text is not None:
            self._pending_text = text
            message = await self._message(text)
            if await self._send(message, emit) or self._ended:
                return
            if self.decoder.state == TaskState.TASK_STATE_SUBMITTED:
                # Peers such as fasta2a answer every send so, `blocking` or not.
                note_once(self.url, "answered the send with SUBMITTED; the task is followed")
        while not self.task_id:
            found = await self._locate(emit)
            if found is None:
                return  # lost (emitted)
            if found:
                break
            # The agent answered and has no task for the opening message: it
            # never got it. Send it again, same ids (a role server that did
            # get it answers with the existing task instead of a second one),
            # unless the child was cancelled meanwhile.
            if self._cancel_requested:
                await emit(Failed(reason="aborted", message=CANCELED_TEXT))
                return
            if await self._send(self._opening(), emit) or self._ended:
                return
        await self._reattach(emit)

    async def _message(self, text: str) -> Message:
        """The turn's message: on the live task, or opening a new task."""
        self.decoder.new_turn()
        if self.task_id and not self._task_over():
            message = new_text_message(text, role=Role.ROLE_USER)
            message.task_id = self.task_id
            message.context_id = self.context_id
            return message
        # A new task: its id comes with the first frame. After a task ended,
        # a new task in the same context continues the same conversation on
        # the role server. Its opening message id is stored before it is sent.
        self.task_id = self.decoder.task_id = ""
        if not self._unsent:
            self.message_id = uuidlib.uuid4().hex
            if self.on_identity is not None:
                await self.on_identity()
        self._unsent = False
        return self._opening()

    def _opening(self) -> Message:
        message = new_text_message(
            self._pending_text,
            role=Role.ROLE_USER,
            context_id=self.context_id or None,
        )
        if self.message_id:
            message.message_id = self.message_id
        if not self._sent_config and self.overrides:
            message.metadata.update({CONFIG_KEY: self.overrides})
        self._sent_config = True
        return message

    async def _send(self, message: Message, emit: Emit) -> bool:
        """Stream one message's answer; True once the turn is over. A broken
        stream returns False (the caller finds or re-attaches the task); a
        refusal before any task exists (a bad token, invalid params) raises."""
        if self._pause_rules:
            # Rules in force from the turn's first step: the server reads them
            # before it starts the turn.
            message.metadata.update({PAUSE_ON_KEY: self._pause_rules})
        self._rules_unsent = False
        try:
            with translated(self.url):
                request = SendMessageRequest(message=message)
                return await self._relay(self._stream(request), emit)
        except (AgentUnavailableError, DelegationTimeoutError) as exc:
            logger.info("stream from %s broke (%s); re-attaching", self.url, exc)
            if await self._unreachable(exc, emit):
                return True
            await anyio.sleep(self.delegate.retry_interval)
            return False
        except ProtocolError as exc:
            if not self.task_id:
                raise
            logger.info("stream from %s broke (%s); re-attaching", self.url, exc)
            return False

    def _stream(self, request: SendMessageRequest) -> AsyncIterator[StreamResponse]:
        """The frames answering a turn's message (push mode: `push_receiver.py`)."""
        return self.client.send_message(request)

    def _can_follow(self) -> bool:
        """The running task's frames can be followed (`_follow`); else it is
        polled with GetTask."""
        return bool(self.card.capabilities.streaming)

    def _follow(self) -> AsyncIterator[StreamResponse]:
        """The frames of the running task after it was read (re-attaching)."""
        return self.client.subscribe(SubscribeToTaskRequest(id=self.task_id))

    async def _turn_running(self) -> None:
        """A frame of the running turn came: the server has taken the turn's
        pause rules, so rules that changed since go now."""
        if self._turn_live or not self.task_id or self.decoder.finished_turn:
            return
        self._turn_live = True
        await self._send_rules()

    def _task_over(self) -> bool:
        return self.decoder.finished_turn and self.decoder.state not in _WAITING

    async def _relay(self, responses: AsyncIterator[StreamResponse], emit: Emit) -> bool:
        """Emit a stream's events; True once the turn is over.

        The stream is read by a task of its own, so a silence of `idle_probe`
        seconds can be probed (GetTask) without giving the stream up: a task
        that is done ends the turn from the probe's answer, a working one
        (a long command sends no frames) is waited for. The stream is closed
        here, also when the turn ends before it does.
        """
        send, receive = anyio.create_memory_object_stream[StreamResponse | Exception](0)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read, responses, send, self._frame_came)
            try:
                while True:
                    with anyio.move_on_after(self.delegate.idle_probe) as silent:
                        item = await receive.receive()
                    if silent.cancelled_caught:
                        if await self._probe(emit):
                            return True
                        continue
                    if isinstance(item, Exception):
                        raise item
                    self._heard()
                    events = self.decoder.decode(item)
                    await self._note_ids()
                    await self._turn_running()
                    for event in events:
                        await emit(event)
                    if self.decoder.finished_turn:
                        await _drained(receive)
                        return True
            except anyio.EndOfStream:
                return self.decoder.finished_turn
            except Exception as exc:
                # Raised outside the task group, so callers see the error
                # itself rather than an exception group around it.
                failure = exc
            finally:
                tg.cancel_scope.cancel()
                receive.close()
        assert failure is not None
        raise failure

    async def _probe(self, emit: Emit) -> bool:
        """Ask a silent agent about the task; True once the turn is over.
        The answer is waited for until `lost_after` (`_call`), unless a frame
        comes first: then the frame is the answer, read next by `_relay`."""
        task: Task | None = None
        scope = self._probing = anyio.CancelScope()
        try:
            with scope, translated(self.url):
                if self.task_id:
                    request = GetTaskRequest(id=self.task_id)
                    task = await self.client.get_task(request, context=self._call())
                else:
                    task, _ = await self._find()
        except (AgentUnavailableError, DelegationTimeoutError) as exc:
            logger.info("probe of %s failed: %s", self.url, exc)
            return await self._unreachable(exc, emit)
        except ProtocolError as exc:
            # The agent answers but cannot say (no ListTasks, say): the stream
            # stays, and the turn's deadline bounds the wait.
            self._heard()
            logger.info("probe of %s: %s", self.url, exc)
            return False
        finally:
            self._probing = None
        if scope.cancelled_caught:
            return False
        self._heard()
        if task is None:
            return False  # not created yet: its stream still may bring it
        events = self.decoder.decode_task(task)
        await self._note_ids()
        for event in events:
            await emit(event)
        return self.decoder.finished_turn

    def _call(self) -> ClientCallContext:
        """A question (a probe, a read, a lookup) that waits for its answer
        until `lost_after` seconds of silence: a slow agent's late answer is
        contact, and only an agent silent that long is given up (`_unreachable`)."""
        return ClientCallContext(timeout=self.delegate.lost_after)

    async def _find(self) -> tuple[Task | None, bool]:
        """The task the opening message started, if the agent has it, and
        whether the context has any task (then it has the child's config)."""
        token = ""
        tasks: list[Task] = []
        while True:
            request = ListTasksRequest(context_id=self.context_id, page_token=token, page_size=100)
            listing = await self.client.list_tasks(request, context=self._call())
            tasks.extend(listing.tasks)
            for task in listing.tasks:
                if any(m.message_id == self.message_id for m in task.history):
                    return task, True
            token = listing.next_page_token
            if not token:
                break
        if len(tasks) == 1 and not tasks[0].history:
            # A peer that keeps no history: the context is this child's own
            # (its id was made for it), so its one task is the opening's.
            return tasks[0], True
        return None, bool(tasks)

    async def _locate(self, emit: Emit) -> bool | None:
        """Find the task of the opening message after the stream gave out
        before naming it. True: found and noted; False: the agent has no
        such task; None: lost (emitted)."""
        if not self.message_id:
            # A child stored before opening ids were (an older store).
            await emit(
                Failed(reason="lost", message=f"{self.url} never acknowledged the child's task")
            )
            return None
        while True:
            try:
                with translated(self.url):
                    task, context_used = await self._find()
            except (AgentUnavailableError, DelegationTimeoutError) as exc:
                if await self._unreachable(exc, emit):
                    return None
                await anyio.sleep(self.delegate.retry_interval)
                continue
            except ProtocolError as exc:
                # Without ListTasks the agent cannot tell whether it got the
                # message; sending it again could run the work twice.
                await emit(
                    Failed(
                        reason="lost",
                        message=f"cannot find the child's task on {self.url}: {exc}",
                    )
                )
                return None
            self._heard()
            if task is None:
                self._sent_config = context_used
                return False
            self.decoder.task_id, self.decoder.context_id = task.id, task.context_id
            await self._note_ids()
            return True

    async def _reattach(self, emit: Emit) -> None:
        """Follow the task until its turn ends, or give it up as lost.

        The task is read (GetTask), then followed while its turn runs. A
        follow refused (a task that finished since the read is refused with
        "is in terminal state", `says_finished`), or whose stream ends in an
        error, is a cue to read the task again: a turn that is over ends from
        that read (its result, artifacts and usage, each event once: the
        decoder skips what it gave); one still running is lost. A task the
        agent no longer has (GetTask refused) is lost: gone, not finished.
        """
        refused: ProtocolError | None = None
        while True:
            try:
                with translated(self.url):
                    task = await self.client.get_task(
                        GetTaskRequest(id=self.task_id), context=self._call()
                    )
            except (AgentUnavailableError, DelegationTimeoutError) as exc:
                if await self._unreachable(exc, emit):
                    return
                await anyio.sleep(self.delegate.retry_interval)
                continue
            except ProtocolError as exc:
                await emit(Failed(reason="lost", message=f"lost the task on {self.url}: {exc}"))
                return
            self._heard()
            for event in self.decoder.decode_task(task):
                await emit(event)
            if self.decoder.finished_turn or self._ended:
                return
            if refused is not None:
                await emit(Failed(reason="lost", message=self._refusal(refused, task)))
                return
            if not self._can_follow():
                # An agent that cannot stream is asked again after the retry
                # interval, until the turn is over.
                note_once(self.url, "no streaming: the task is polled with GetTask")
                await anyio.sleep(self.delegate.retry_interval)
                continue
            try:
                with translated(self.url):
                    if await self._relay(self._follow(), emit) or self._ended:
                        return
            except (AgentUnavailableError, DelegationTimeoutError) as exc:
                if await self._unreachable(exc, emit):
                    return
            except ProtocolError as exc:
                logger.info("following the task on %s: %s; reading it again", self.url, exc)
                refused = exc
                continue  # read at once: a finished task's answer is there
            # The subscription ended without a terminal frame: look again.
            await anyio.sleep(self.delegate.retry_interval)

    def _refusal(self, refused: ProtocolError, task: Task) -> str:
        """Why a task whose follow was refused, and which still runs, is lost."""
        state = TaskState.Name(task.status.state)
        if says_finished(refused):
            return (
                f"lost the task on {self.url}: it refused to follow the task as finished "
                f"({refused}), yet GetTask reads it {state}"
            )
        return f"lost the task on {self.url}: {refused} (GetTask reads it {state})"

    async def _time_out(self, emit: Emit) -> None:
        """The turn passed its deadline: cancel the task (best effort), fail `timeout`."""
        with anyio.move_on_after(self.delegate.idle_probe):
            try:
                if not self.task_id and self.message_id:
                    with translated(self.url):
                        task, _ = await self._find()
                    if task is not None:
                        self.decoder.task_id, self.decoder.context_id = task.id, task.context_id
                        await self._note_ids()
                if self.task_id:
                    await self._send_cancel()
            except DelegationError as exc:
                logger.info("cancel of a timed-out task on %s: %s", self.url, exc)
        limit = self.turn_timeout + self.delegate.deadline_grace
        await emit(
            Failed(
                reason="timeout",
                message=f"{self.url} did not finish the turn within {limit:g} s "
                f"(timeout {self.turn_timeout:g} s + {self.delegate.deadline_grace:g} s grace); "
                "its task was cancelled",
            )
        )

    # -- control ------------------------------------------------------------------

    async def cancel(self) -> None:
        self._cancel_requested = True
        if self.task_id:
            await self._send_cancel()

    async def _send_cancel(self) -> None:
        self._cancel_requested = False
        await self.connect()
        with translated(self.url):
            try:
                await self.client.cancel_task(
                    CancelTaskRequest(id=self.task_id), context=self._call()
                )
            except A2AError as exc:
                # Already terminal (TaskNotCancelable): the stream tells the rest.
                logger.info("cancel of %s on %s: %s", self.task_id, self.url, exc)

    async def _controllable(self, action: str) -> None:
        await self.connect()
        extensions = [e.uri for e in self.card.capabilities.extensions]
        if CONTROL_EXTENSION not in extensions:
            raise DelegationError(
                f"agent at {self.url} does not support {action}: its card does not declare "
                f"the control extension {CONTROL_EXTENSION}"
            )

    async def _control(
        self, action: str, text: str = "", metadata: Mapping[str, Any] | None = None
    ) -> None:
        await self._controllable(action)
        if not self.task_id:
            raise DelegationError(f"cannot {action} a child before its task exists")
        message = new_text_message(text or action, role=Role.ROLE_USER)
        message.task_id = self.task_id
        message.context_id = self.context_id
        message.metadata.update({CONTROL_KEY: action, **(metadata or {})})
        context = ClientCallContext(service_parameters={"A2A-Extensions": CONTROL_EXTENSION})
        with translated(self.url):
            async for _ in self.delegate.plain_client(self).send_message(
                SendMessageRequest(message=message), context=context
            ):
                break

    async def pause(self) -> None:
        await self._control("pause")

    async def resume(self) -> None:
        await self._control("resume")

    async def interrupt(self) -> None:
        await self._control("interrupt")

    def _takes_pause_rules(self) -> bool:
        """The agent's card lists `pause_on` among its control actions."""
        for extension in self.card.capabilities.extensions:
            if extension.uri == CONTROL_EXTENSION and extension.HasField("params"):
                actions = MessageToDict(extension.params).get("actions")
                return isinstance(actions, list) and "pause_on" in actions
        return False

    async def pause_on(self, rules: Mapping[str, Selector]) -> bool:
        """Give the task these pause rules (see the module docstring). False
        for a peer without the action: a parent's pause then comes as a
        plain `pause`, a step or two after the event on a fast child."""
        try:
            await self.connect()  # a child reopened from the store may not be yet
        except DelegationError as exc:
            logger.info("pause rules for %s: %s", self.url, exc)
            return False
        if not self._takes_pause_rules():
            return False
        self._pause_rules = pause_rules_to_wire(rules)
        self._rules_unsent = True
        await self._send_rules()
        return True

    async def _send_rules(self) -> None:
        """Send changed rules to the running turn; before a frame of it came
        they wait for one (or go with the next turn's message)."""
        async with self._rules_lock:
            if not (self._rules_unsent and self._turn_live and self.task_id):
                return
            self._rules_unsent = False
            try:
                await self._control("pause_on", metadata={PAUSE_ON_KEY: self._pause_rules})
            except DelegationError as exc:
                # The turn may have ended meanwhile (the next turn's message
                # carries the rules); a pause still comes as a plain pause.
                logger.info("pause rules for %s on %s: %s", self.task_id, self.url, exc)

    async def steer(self, text: str) -> bool:
        await self._controllable("steer")
        if not self._live or self._held:
            # Not running on the agent yet (no task, or not started), or
            # behind steering still held: held in order, and sent once it
            # runs; what the turn ends without sending, `turn` hands back.
            self._held.append(text)
            if self._live:
                await self._send_held()
            return True
        return await self._steer_now(text)

    async def _steer_now(self, text: str) -> bool:
        """Steer the running task; False when the agent says its turn is
        over or past its last step boundary (then so is this run's steering)."""
        try:
            await self._control("steer", text)
        except ProtocolError as exc:
            cause = exc.__cause__
            if isinstance(cause, InvalidParamsError) and _NOT_RUNNING in cause.message:
                self._past_steering = True
                self._live = False
                return False
            raise
        return True

    async def _send_held(self) -> None:
        """Send held steering now that the agent runs the turn; what it
        refuses, or what cannot be sent, stays held (tried again at the
        turn's next event, else handed back as the next turn's input)."""
        async with self._sending:
            while self._held and self._live:
                try:
                    taken = await self._steer_now(self._held[0])
                except DelegationError as exc:
                    logger.info("held steering for %s not sent: %s", self.url, exc)
                    return
                if not taken:
                    return
                self._held.pop(0)

    async def history(self) -> list[ChatMessage]:
        """The task's conversation, read back from its history with GetTask."""
        if not self.task_id:
            return []
        await self.connect()
        with translated(self.url):
            task = await self.client.get_task(GetTaskRequest(id=self.task_id))
        return transcript_from_history(task, "")

    async def budget_left(self) -> Budget | None:
        """None: the child's budget is kept by its role server."""
        return None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


async def _drained(receive: MemoryObjectReceiveStream[StreamResponse | Exception]) -> None:
    """Read a finished turn's stream to its end (the server ends it right
    after the turn's last frame), for `_DRAIN_LIMIT` seconds at most: a
    response read to its end gives its connection back to the pool, one
    closed before drops it, and the next turn would connect again."""
    with anyio.move_on_after(_DRAIN_LIMIT):
        with contextlib.suppress(anyio.EndOfStream):
            while not isinstance(await receive.receive(), Exception):
                pass  # nothing after the turn's last frame is the turn's


async def _read(
    responses: AsyncIterator[StreamResponse],
    send: MemoryObjectSendStream[StreamResponse | Exception],
    came: Callable[[], None],
) -> None:
    """Hand a stream's responses (and then its error, if any) to `_relay`;
    `came` is told of each one as it arrives, before `_relay` takes it."""
    try:
        async with send:
            try:
                async for response in responses:
                    came()
                    await send.send(response)
            except anyio.BrokenResourceError:
                return  # the turn ended before the stream did
            except Exception as exc:
                with contextlib.suppress(anyio.BrokenResourceError):
                    await send.send(exc)
    finally:
        # Closing drops the connection (no I/O): let it finish when the
        # reader is cancelled, or the connection could linger half-closed.
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await responses.aclose()  # type: ignore[attr-defined]


_DRAIN_LIMIT = 0.25
"""Seconds a finished turn's stream may take to end before it is closed."""

_WAITING = frozenset({TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED})
