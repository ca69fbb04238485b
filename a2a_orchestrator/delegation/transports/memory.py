"""The in-memory transport: a child played by a function (httpx's MockTransport).

`MemoryDelegate(handler)` implements `Delegate` like the real transports, so
a session, its control plane and its store run unchanged while no model and
no server are involved:

    def handler(turn: Turn) -> str:
        return f"echo: {turn.text}"

    Session(store, network=..., delegates={"local": MemoryDelegate(handler)})

The handler is called once per turn with a `Turn` and may be a plain or an
async function. It returns (or, as a generator, yields) the turn's output:
text is an assistant message, a `ChildEvent` is emitted as it is; a turn
its output does not end (no `Done`, `Failed` or `InputRequired`) ends
`Done` with the text of its last message. Raising fails the turn
(`Failed(reason="error")`). Before each next item a paused child waits,
and a cancelled or interrupted one stops and ends `aborted`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeAlias

import anyio

from ...models.base import ChatMessage
from ...runtime.budgets import Budget
from ...runtime.events import (
    TERMINAL_KINDS,
    AssistantMessage,
    ChildEvent,
    Done,
    Failed,
    InputRequired,
    Started,
)
from ...runtime.pausing import selecting_rule
from ...runtime.render import CANCELED_TEXT, INTERRUPTED_TEXT
from ...runtime.selectors import Selector
from ..base import (
    ChildConfig,
    Emit,
    IdentityListener,
    Resume,
)
from ..network import AgentSpec

__all__ = ["Handler", "MemoryDelegate", "MemoryRun", "Reply", "Turn"]


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One turn of a child, as a `MemoryDelegate`'s handler is given it."""

    child_id: str
    agent: AgentSpec
    """The agent the child plays (its name and role)."""
    config: ChildConfig
    """What the parent asked of the child (its prompt is the first turn's text)."""
    text: str | None
    """The turn's input; None continues a turn a restart interrupted."""
    number: int
    """1 for the child's first turn in this process, then 2, 3, ..."""
    history: tuple[ChatMessage, ...] = ()
    """The conversation before this turn: each input (user) and answer (assistant)."""


Item: TypeAlias = str | ChildEvent
Reply: TypeAlias = Item | Iterable[Item] | AsyncIterable[Item] | None
"""What a handler gives back: one item, items, or nothing (a `Done` with no text)."""
Handler: TypeAlias = Callable[[Turn], Reply | Awaitable[Reply]]
"""A plain or async function, or a (sync or async) generator function."""


class MemoryRun:
    """A child whose turns a handler plays (see the module docstring)."""

    transport = "memory"
    task_id = ""
    context_id = ""
    message_id = ""

    def __init__(
        self,
        handler: Handler,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        history: Iterable[ChatMessage] = (),
    ) -> None:
        self.handler = handler
        self.spec = spec
        self.config = config
        self.child_id = child_id
        self.on_identity: IdentityListener | None = None
        self._messages: list[ChatMessage] = list(history)
        self._turns = 0
        self._running = False
        self._stop: str | None = None
        """Why the running turn is to end (it ends `aborted`), once asked."""
        self._scope: anyio.CancelScope | None = None
        self._resumed = anyio.Event()
        self._resumed.set()
        self._pause_rules: dict[str, Selector] = {}

    @property
    def model(self) -> str:
        return self.config.model or ""

    async def turn(self, text: str | None, emit: Emit) -> list[str]:
        self._running = True
        self._turns += 1
        turn = Turn(
            child_id=self.child_id,
            agent=self.spec,
            config=self.config,
            text=text,
            number=self._turns,
            history=tuple(dict(m) for m in self._messages),
        )
        if text is not None:
            self._messages.append({"role": "user", "content": text})
        last_text = ""
        ended = False
        try:
            with anyio.CancelScope() as self._scope:
                await emit(Started(role=self.spec.role, model=self.model))
                async with contextlib.aclosing(self._items(turn)) as items:
                    while not ended:
                        # A paused child takes no step: the handler's next
                        # item is not asked for until it is resumed.
                        await self._resumed.wait()
                        item = await anext(items, None)
                        if item is None:
                            break
                        event = AssistantMessage(text=item) if isinstance(item, str) else item
                        if isinstance(event, AssistantMessage):
                            last_text = event.text
                        await emit(event)
                        if event.kind in TERMINAL_KINDS:
                            ended = True
                            self._remember(event)
                        elif selecting_rule(self._pause_rules, event) is not None:
                            # Held before the next item: the parent's
                            # watchers hear of the event beside this turn,
                            # so their pause would come an item late.
                            await self.pause()
            if self._stop is not None and not ended:
                await emit(Failed(reason="aborted", message=self._stop))
            elif not ended:
                done = Done(text=last_text)
                await emit(done)
                self._remember(done)
        finally:
            self._running = False
            self._scope = None
            self._stop = None
        # Steering is never taken (`steer` says False): nothing is handed back.
        return []

    async def _items(self, turn: Turn) -> AsyncGenerator[Item, None]:
        reply = self.handler(turn)
        if inspect.isawaitable(reply):
            reply = await reply
        if reply is None:
            return
        if isinstance(reply, str) or not isinstance(reply, Iterable | AsyncIterable):
            yield reply
        elif isinstance(reply, AsyncIterable):
            async for item in reply:
                yield item
        else:
            for item in reply:
                yield item

    def _remember(self, event: ChildEvent) -> None:
        if isinstance(event, Done):
            self._messages.append({"role": "assistant", "content": event.text})
        elif isinstance(event, InputRequired):
            self._messages.append({"role": "assistant", "content": event.question})

    def _end(self, message: str) -> None:
        if not self._running:
            return  # no turn to end (the handle ends a waiting child itself)
        self._stop = message
        self._resumed.set()
        if self._scope is not None:
            self._scope.cancel()

    async def cancel(self) -> None:
        self._end(CANCELED_TEXT)

    async def interrupt(self) -> None:
        self._end(INTERRUPTED_TEXT)

    async def pause(self) -> None:
        if self._resumed.is_set():
            self._resumed = anyio.Event()

    async def resume(self) -> None:
        self._resumed.set()

    async def pause_on(self, rules: Mapping[str, Selector]) -> bool:
        """True: the run holds itself right after an event a rule selects,
        before the handler's next item (the handle releases the hold once
        the watchers heard of it, unless one paused or resumed the child)."""
        self._pause_rules = dict(rules)
        return True

    async def steer(self, text: str) -> bool:
        """False: a handler reads no steering mid-turn; the text opens a turn."""
        return False

    async def history(self) -> list[ChatMessage]:
        return [dict(m) for m in self._messages]

    async def budget_left(self) -> Budget | None:
        return None

    async def aclose(self) -> None:
        """Nothing held: a running turn ends with the task that runs it."""


class MemoryDelegate:
    """A `Delegate` whose children are played by `handler` (see the module docstring)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def open(
        self,
        spec: AgentSpec,
        config: ChildConfig,
        *,
        child_id: str,
        depth: int = 1,
        resume: Resume | None = None,
    ) -> MemoryRun:
        """A child played by the handler; a resumed one starts from the
        inputs and answers of its stored transcript."""
        history: list[ChatMessage] = []
        for entry in resume.entries if resume is not None else ():
            if isinstance(entry, str):
                history.append({"role": "user", "content": entry})
            elif isinstance(entry, Done):
                history.append({"role": "assistant", "content": entry.text})
            elif isinstance(entry, InputRequired):
                history.append({"role": "assistant", "content": entry.question})
        return MemoryRun(self.handler, spec, config, child_id=child_id, history=history)
