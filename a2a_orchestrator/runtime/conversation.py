"""The agent runtime: one isolated conversation over a `Model` and its tools.

Contract kept here:

- A `Conversation` holds its own transcript and sees no other history unless
  it was constructed with one (an explicit shared context).
- `run(text, emit)` plays one turn: it takes the input, then loops
  model -> tool calls -> tool results until a final answer, an `ask_parent`
  question, the step budget (`max_turns` model calls), the time limit, or an
  abort. It emits `Started` first and exactly one terminal event last
  (`Done`, `InputRequired` or `Failed`), which it also returns. One turn at a
  time; a second concurrent `run` is a `RuntimeError`.
- A model call whose stream was cut and retried from the start (the
  model's `Restart`) withdraws the deltas it emitted with one
  `MessageRestarted`; the step's `AssistantMessage` and the transcript hold
  the retry's answer alone.
- Side effects at most once: with a journal, each tool call's start is on
  disk before the call runs and is closed once its result is emitted (so
  recovery can tell a call that never started from one a crash interrupted).
  A call whose start cannot be recorded is not run. A tool that only reads
  (`Tool.read_only`) has no side effect: its calls are not journaled, and
  recovery takes one without a result as not run.
- Errors are contained: a failing tool becomes an unsuccessful `ToolResult`
  the model reads; a failing model or a bug in the loop ends the turn as
  `Failed(reason="error")`. Only outside cancellation propagates (the caller
  owns it; a running command's process group is killed by the tool itself).
- `abort()` ends the running turn as `Failed(reason="aborted")`.
  `pause()`/`resume()` hold the loop at the next step boundary: before each
  model call and before each tool call (so a pause that arrives while call 1
  of a batch runs holds call 2). Paused time does not count against the
  timeout. `hold(reason, limit)` is a provisional pause, taken by a role
  server the moment an event matches a caller's pause rule: `pause()`
  confirms it, `resume()` ends it, and nobody deciding within `limit`
  seconds ends it too (the caller may be gone).
- `steer(text)` and `deliver(uuid, text)` queue input that the loop absorbs at
  step boundaries, never at step 0: steering first, then child results.
  Input queued between turns is taken when the next turn starts, so its
  first model call sees it. Child results are de-duplicated by their uuid.
- Budgets (`budgets.py`): given a `Meter` with a budget, the conversation
  is stopped at the step where it would pass it, as
  `Failed(reason="budget")`: before a model call once a kind is used up,
  right after a model call whose tokens or cost passed it (its tool calls
  are not run), and at a deadline for wall time. The meter's `spent` is the
  child's spend over its whole life (seeded when it is rebuilt after a
  crash), its `below` what its own children spent; a turn's `cap` (a role
  server's per-caller limit) counts this turn only.
  Every `Done` and `Failed` carries the turn's spend; the first event of
  each step carries that model call's.
- `offer(text)` is steering for the running turn only, decided at once: True
  while the turn can still read it, False (nothing queued) once the turn has
  passed its last step boundary or none runs. A turn that ends with offered
  steering unread (its last step asked a question, or it was stopped) leaves
  it for `take_steering()`, so nothing offered is lost.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from ..errors import ModelError, ToolError
from ..models.base import ChatMessage, Model, Restart, TextDelta, ToolCall, ToolSpec, Usage
from ..tools.base import CallScope, Tool, current_call
from .budgets import Budget, Meter, Spend
from .events import (
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
)
from .instruments import observed_emit, observed_stream
from .journal import Journal
from .pausing import HOLD_LIMIT, Rule, selecting_rule
from .spans import NO_SPANS, Spans

__all__ = ["ASK_PARENT", "ASK_PARENT_SPEC", "Conversation", "Emit"]

logger = logging.getLogger(__name__)

Emit = Callable[[ChildEvent], Awaitable[None]]

ASK_PARENT = "ask_parent"
ASK_PARENT_SPEC = ToolSpec(
    name=ASK_PARENT,
    description=(
        "Ask the agent that gave you this task a question and stop until it answers. "
        "Use it only when you cannot go on without the answer."
    ),
    parameters={
        "type": "object",
        "properties": {"question": {"type": "string", "description": "The question to ask."}},
        "required": ["question"],
    },
)

DEFAULT_MAX_TURNS = 10
DELTA_INTERVAL = 0.05
DEFAULT_TIMEOUT = 60.0


class Conversation:
    """One isolated agent conversation (see the module docstring)."""

    def __init__(
        self,
        *,
        model: Model,
        system_prompt: str = "",
        tools: Sequence[Tool] = (),
        ask_parent: bool = False,
        max_turns: int = DEFAULT_MAX_TURNS,
        timeout: float = DEFAULT_TIMEOUT,
        role: str = "",
        messages: Sequence[ChatMessage] | None = None,
        journal: Journal | None = None,
        meter: Meter | None = None,
        spans: Spans = NO_SPANS,
    ) -> None:
        """`meter` keeps its spend against its budget (`budgets.Meter`: the
        budget that caps the child's life and subtree, the price its model
        calls cost, what it spent before a rebuild, what its own children
        spent; None: no budget). `spans` opens the spans of its model and
        tool calls (`spans.py`; whoever builds it gives the tracer's)."""
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        self.model = model
        self.role = role
        self.journal = journal
        self.spans = spans
        self.max_turns = max_turns
        self.timeout = timeout
        self._tools = {tool.name: tool for tool in tools}
        self._specs = [tool.spec for tool in tools] + ([ASK_PARENT_SPEC] if ask_parent else [])
        self._ask_parent = ask_parent
        self._tool_names = frozenset(self._tools) | ({ASK_PARENT} if ask_parent else set())
        if messages is not None:
            self.messages: list[ChatMessage] = [dict(m) for m in messages]
        else:
            self.messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.usage = Usage()
        self._turn_usage = Usage()
        self.meter = meter if meter is not None else Meter(model=model.name)
        """The child's spend against its budget."""
        self._budget_deadline = False
        self._paused_time = 0.0
        self._turn_started = 0.0
        self._running = False
        self._aborted: tuple[FailReason, str] | None = None
        self._scope: anyio.CancelScope | None = None
        self._resumed = anyio.Event()
        self._resumed.set()
        self._hold: tuple[str, float] | None = None
        self._pause_rules: dict[str, Rule] = {}
        self._held_at: ChildEvent | None = None
        """The event a pause rule held the conversation at (`holds_at`)."""
        self._steering: list[str] = []
        # Whether the running turn still reads steering (`offer`): set when a
        # turn starts, cleared the moment its loop decides to end.
        self._accepting = False
        self._results: list[tuple[str, str]] = []
        self._seen: set[str] = set()

    # -- state ------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    @property
    def held(self) -> str | None:
        """The reason of a provisional pause (`hold`) nobody has decided on yet."""
        return self._hold[0] if self._hold is not None and self.paused else None

    @property
    def pending_question(self) -> str | None:
        """The id of an `ask_parent` call still waiting for its answer.

        Derived from the transcript, so a conversation rebuilt from stored
        messages knows that the next input is the answer.
        """
        answered = {m.get("tool_call_id") for m in self.messages if m.get("role") == "tool"}
        for message in reversed(self.messages):
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or ():
                if call["function"]["name"] == ASK_PARENT and call["id"] not in answered:
                    return str(call["id"])
            return None
        return None

    def withdraw_question(self, answer: str) -> None:
        """Close a pending `ask_parent` call with `answer`, so the next input
        is a new user turn rather than its answer."""
        pending = self.pending_question
        if pending is not None:
            self.messages.append({"role": "tool", "tool_call_id": pending, "content": answer})

    @property
    def budget(self) -> Budget | None:
        return self.meter.budget

    @property
    def spent(self) -> Spend:
        """Spent over the child's whole life, the running turn's model calls included."""
        return self.meter.spent

    def spent_now(self) -> Spend:
        """`spent` with the running turn's time so far (paused time not counted)."""
        if not self._running:
            return self.spent
        elapsed = anyio.current_time() - self._turn_started - self._paused_time
        return self.spent + Spend(seconds=max(elapsed, 0.0))

    # -- control ------------------------------------------------------------

    def abort(self, reason: FailReason = "aborted", message: str = "aborted") -> None:
        """End the running turn as `Failed(reason, message)`; no-op when idle."""
        if not self._running:
            return
        self._aborted = (reason, message)
        # Before the turn's cancel scope exists, `run` sees the flag on entry.
        if self._scope is not None:
            self._scope.cancel()

    def pause(self) -> None:
        """Hold the loop at its next step boundary until `resume()` (confirms a `hold`)."""
        self._hold = None
        if self._resumed.is_set():
            self._resumed = anyio.Event()

    def hold(self, reason: str, limit: float) -> None:
        """Pause provisionally: like `pause()`, but released on its own when
        neither `pause()` nor `resume()` comes within `limit` seconds. No-op
        when already paused (a pause is not weakened into a hold)."""
        if self._resumed.is_set():
            self._resumed = anyio.Event()
            self._hold = (reason, anyio.current_time() + limit)

    def resume(self) -> None:
        self._hold = None
        self._resumed.set()

    def pause_on(self, rules: Mapping[str, Rule]) -> None:
        """Replace the pause rules: the moment a turn emits an event a rule
        selects, before the event is handed on, the conversation is held
        (`hold`, for `HOLD_LIMIT` seconds), so it takes no step after the
        match however long the event takes to reach whoever decides. A rule
        dropped while it holds the conversation releases it."""
        self._pause_rules = dict(rules)
        held = self.held
        if held is not None and held not in self._pause_rules:
            self.resume()

    def holds_at(self, event: ChildEvent) -> bool:
        """Whether a pause rule holds the conversation at `event` now."""
        return self._held_at is event and self.held is not None

    def _holding(self, emit: Emit) -> Emit:
        async def held(event: ChildEvent) -> None:
            # A pause already taken is not weakened into a hold.
            if self._pause_rules and not self.paused:
                rule_id = selecting_rule(self._pause_rules, event)
                if rule_id is not None:
                    self.hold(rule_id, HOLD_LIMIT)
                    self._held_at = event
            await emit(event)

        return held

    def steer(self, text: str) -> None:
        """Queue steering input (absorbed before child results); with no turn
        running it waits for the next turn's first step boundary."""
        self._steering.append(text)

    def offer(self, text: str) -> bool:
        """Steering for the running turn only: True when the turn will read
        it (or, should it end first, `take_steering` hands it back); False,
        with nothing queued, when no turn runs or the running one has passed
        its last step boundary, so the caller gives it a turn of its own."""
        if not self._accepting:
            return False
        self._steering.append(text)
        return True

    def take_steering(self) -> list[str]:
        """Steering queued but not read yet, handed back and forgotten here
        (after a turn ended: the caller makes it the next turn's input)."""
        taken, self._steering = self._steering, []
        return taken

    def deliver(self, uuid: str, text: str) -> bool:
        """Queue a child's result; False when that uuid was seen already."""
        if uuid in self._seen:
            return False
        self._seen.add(uuid)
        self._results.append((uuid, text))
        return True

    # -- the loop -----------------------------------------------------------

    async def run(self, text: str | None, emit: Emit, *, cap: Budget | None = None) -> ChildEvent:
        """Play one turn; `text=None` continues from the transcript as it is.
        `cap` limits this turn's spend alone (a role server's per-caller limit)."""
        if self._running:
            raise RuntimeError("this conversation is already running a turn")
        self._running = True
        self._aborted = None
        self._accepting = True
        # A turn continued after a crash (`text=None`) counts what it spent
        # before the crash; any other turn starts from nothing.
        self.meter.start_turn(continued=text is None, cap=cap)
        self._turn_usage = Usage(
            input_tokens=self.meter.turn.input_tokens,
            output_tokens=self.meter.turn.output_tokens,
        )
        started_at = self._turn_started = anyio.current_time()
        self._paused_time = 0.0
        # A server's metrics, which label tool calls with the tools it really has.
        emit = self._holding(observed_emit(emit, self.role, self.model.name, self._tool_names))
        try:
            # Input queued while no turn ran (an injection, a child's result)
            # is this turn's from its first model call, ahead of the turn's own
            # input as the store has them; "never at step 0" is for input that
            # arrives during a turn. An `ask_parent` answer must directly
            # follow its call, so then the queued input comes after it.
            answering = text is not None and self.pending_question is not None
            if not answering:
                self._absorb()
            if text is not None:
                self._take_input(text)
            if answering:
                self._absorb()
            await emit(Started(role=self.role, model=self.model.name))
            terminal: ChildEvent | None = None
            limit = self.timeout
            left = self.meter.seconds_left()
            self._budget_deadline = left is not None and left < limit
            if left is not None:
                limit = min(limit, left)
            with anyio.CancelScope(deadline=anyio.current_time() + limit) as scope:
                self._scope = scope
                if self._aborted is not None:
                    scope.cancel()
                try:
                    terminal = await self._loop(emit)
                except ModelError as exc:
                    terminal = Failed(reason="error", message=str(exc))
                except Exception as exc:  # contained: one child's bug ends only its turn
                    logger.exception("conversation loop failed")
                    terminal = Failed(reason="error", message=f"{type(exc).__name__}: {exc}")
                finally:
                    # Reached with no await since the loop's last look at its
                    # steering (a return, an error, the scope's cancellation):
                    # from here on `offer` refuses, so no steering can slip in
                    # after the loop stopped reading it.
                    self._accepting = False
            self._scope = None
            elapsed = max(anyio.current_time() - started_at - self._paused_time, 0.0)
            self.meter.add(Spend(seconds=elapsed))
            if terminal is None:
                if self._aborted is not None:
                    reason, message = self._aborted
                    terminal = Failed(reason=reason, message=message)
                elif self._budget_deadline:
                    terminal = Failed(
                        reason="budget", message=await self.meter.exhausted("seconds")
                    )
                else:
                    terminal = Failed(
                        reason="timeout", message=f"timed out after {self.timeout:g} s"
                    )
            if isinstance(terminal, Done | Failed):
                terminal = dataclasses.replace(
                    terminal, usage=self._turn_usage, spent=self.meter.turn
                )
            elif isinstance(terminal, InputRequired):
                terminal = dataclasses.replace(terminal, spent=self.meter.turn)
            await emit(terminal)
            return terminal
        finally:
            self._scope = None
            self._accepting = False
            self._running = False

    def _take_input(self, text: str) -> None:
        pending = self.pending_question
        if pending is not None:
            # The answer to an `ask_parent` call is that call's tool result.
            self.messages.append({"role": "tool", "tool_call_id": pending, "content": text})
        else:
            self.messages.append({"role": "user", "content": text})

    async def _checkpoint(self, scope: anyio.CancelScope | None) -> None:
        """The pause gate. The clock stops while paused: the deadline is
        lifted for the wait and moved later by the time spent paused."""
        if self._resumed.is_set():
            return
        started = anyio.current_time()
        deadline = scope.deadline if scope is not None else None
        if scope is not None:
            scope.deadline = math.inf
        try:
            # A loop, not one wait: a pause that comes right after a resume
            # (before this task ran again) holds this boundary too, and a
            # hold that lapses releases it.
            while not self._resumed.is_set():
                resumed, hold = self._resumed, self._hold
                if hold is None:
                    await resumed.wait()
                    continue
                with anyio.move_on_after(hold[1] - anyio.current_time()):
                    await resumed.wait()
                if self._hold is hold and not resumed.is_set():
                    logger.warning(
                        "a hold (%s) was neither confirmed nor released in time; going on",
                        hold[0],
                    )
                    self.resume()
        finally:
            paused = anyio.current_time() - started
            self._paused_time += paused
            if scope is not None and deadline is not None:
                scope.deadline = deadline + paused

    def _absorb(self) -> None:
        for text in self._steering:
            self.messages.append({"role": "user", "content": text})
        for _uuid, text in self._results:
            self.messages.append({"role": "user", "content": text})
        self._steering.clear()
        self._results.clear()

    async def _loop(self, emit: Emit) -> ChildEvent:
        carry: Spend | None = None
        for step in range(self.max_turns):
            await self._checkpoint(self._scope)
            over = await self.meter.over(before_call=True)
            if over is not None:
                return Failed(reason="budget", message=await self.meter.exhausted(over))
            if step > 0:
                self._absorb()
            if step + 1 == self.max_turns:
                # The last step: no boundary follows where steering could be
                # read, so from here it is refused and becomes a turn itself.
                self._accepting = False
            parts: list[str] = []
            calls: list[ToolCall] = []
            # Deltas are coalesced to at most one per DELTA_INTERVAL: a model
            # streams a token at a time, and over A2A every delta is a stored
            # status update. A model that answers at once yields one delta.
            unsent: list[str] = []
            sent = False  # whether a delta of this attempt's text went out
            last_sent = anyio.current_time()
            call_usage = Usage()
            stream = self.spans.model_call(self.model, self.messages, self._specs)
            async for item in observed_stream(stream, self.role, self.model.name):
                if isinstance(item, TextDelta):
                    if item.text:
                        parts.append(item.text)
                        unsent.append(item.text)
                        if anyio.current_time() - last_sent >= DELTA_INTERVAL:
                            await emit(MessageDelta(text="".join(unsent)))
                            unsent.clear()
                            sent = True
                            last_sent = anyio.current_time()
                elif isinstance(item, Restart):
                    # The stream was cut and the retry begins the message
                    # again: its text so far is no part of the answer. Said
                    # only when some of it went out; unsent text just goes.
                    parts.clear()
                    unsent.clear()
                    if sent:
                        await emit(MessageRestarted(reason=item.reason))
                        sent = False
                elif isinstance(item, ToolCall):
                    calls.append(item)
                else:
                    self._turn_usage = self._turn_usage + item
                    self.usage = self.usage + item
                    call_usage = call_usage + item
            spent = self.meter.add_call(call_usage)
            # Carried to the next step's first event when this one emits
            # none (an empty answer the turn goes on from).
            carry = spent if carry is None else carry + spent
            if unsent:
                await emit(MessageDelta(text="".join(unsent)))
            text = "".join(parts)
            over = await self.meter.over(before_call=False)
            if over is not None:
                # This call passed the budget: its answer is kept, its tool
                # calls are not run (nor left unanswered in the transcript).
                # Content "" rather than None: no tool call follows it.
                self.messages.append({"role": "assistant", "content": text})
                if text:
                    await emit(AssistantMessage(text=text, spent=carry))
                return Failed(reason="budget", message=await self.meter.exhausted(over))
            self.messages.append(_assistant_message(text, calls))
            if text:
                await emit(AssistantMessage(text=text, spent=carry))
                carry = None
            if not calls and (self._steering or self._results) and step + 1 < self.max_turns:
                # Input arrived during this last step (a steering message, a
                # child's result): the turn goes on, so it is read at the next
                # step boundary instead of waiting for a turn that may never come.
                continue
            if not calls:
                return Done(text=text)
            # Announce the whole batch before running it: one assistant
            # message, then its results, which is also how the transcript is
            # rebuilt from a task's history (decoding.transcript_from_history).
            for call in calls:
                await emit(
                    ToolCalled(
                        call_id=call.id, tool=call.name, arguments=call.arguments, spent=carry
                    )
                )
                carry = None
            question: str | None = None
            for call in calls:
                if call.name == ASK_PARENT and self._ask_parent:
                    question = str(call.arguments.get("question", "")).strip() or "(no question)"
                    continue
                # A step boundary too: a pause that came while the previous
                # call of this batch ran (or with its result) holds this one.
                await self._checkpoint(self._scope)
                await self._play_call(call, emit)
            if question is not None:
                return InputRequired(question=question)
        return Failed(
            reason="max_turns",
            message=f"exhausted its step budget of {self.max_turns} model calls",
        )

    async def _play_call(self, call: ToolCall, emit: Emit) -> None:
        """Run one call and emit its result, journaled when there is a journal."""
        marker = ""
        tool = self._tools.get(call.name)
        # A call that only reads has no side effect to run at most once.
        if (
            self.journal is not None
            and tool is not None
            and not tool.read_only
            and "_raw" not in call.arguments
        ):
            try:
                marker = await self.journal.started(call)
            except Exception as exc:  # the call must not run unrecorded
                logger.exception("could not journal tool call %s", call.id)
                output = f"Not run: its start could not be recorded ({type(exc).__name__}: {exc})"
                await self._record_result(call, output, False, emit)
                return
        outcome = "interrupted"
        try:
            with self.spans.tool_call(call.name) as traced:
                output, success = await self._call_tool(call, marker)
                traced.succeeded(success)
            await self._record_result(call, output, success, emit)
            outcome = "done"
        finally:
            if marker and self.journal is not None:
                # Closed once the result is recorded, or (abort, timeout) once
                # the tool has ended what it started; a crash leaves it open.
                with anyio.CancelScope(shield=True):
                    await self.journal.finished(marker, outcome)

    async def _record_result(self, call: ToolCall, output: str, success: bool, emit: Emit) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
        await emit(ToolResult(call_id=call.id, tool=call.name, output=output, success=success))

    async def _call_tool(self, call: ToolCall, marker: str = "") -> tuple[str, bool]:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "(none)"
            return f"Unknown tool {call.name!r}. Available tools: {known}", False
        if "_raw" in call.arguments:
            return f"Arguments for {call.name} are not valid JSON: {call.arguments['_raw']}", False
        token = current_call.set(self._scope_for(marker)) if marker else None
        try:
            return await tool.run(call.arguments), True
        except ToolError as exc:
            return str(exc), False
        except (TypeError, KeyError, ValueError) as exc:
            return f"Bad arguments for {call.name}: {exc}", False
        except Exception as exc:  # a tool's bug is that call's result, not the turn's end
            logger.exception("tool %s failed", call.name)
            return f"{call.name} failed: {type(exc).__name__}: {exc}", False
        finally:
            if token is not None:
                current_call.reset(token)

    def _scope_for(self, marker: str) -> CallScope:
        journal = self.journal
        assert journal is not None

        async def record_process(pgid: int, ticks: int) -> None:
            await journal.process(marker, pgid, ticks)

        return CallScope(marker=marker, record_process=record_process)


def _assistant_message(text: str, calls: Sequence[ToolCall]) -> ChatMessage:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in calls
        ]
    return message
