"""The live view of a network at work: one line per child, as a tree.

    pipeline  session 3f2a…  (scripted model)
    ├─ architect  c1a2b3  remote  completed  done "## Approach …"   412 tok
    ├─ coder      d4e5f6  remote  running    tool_called run_command
    └─ reviewer   ……      pending

On a terminal the tree is redrawn in place as events arrive (rich's `Live`
around a `Tree`, a child nested under the child that spawned it), while
`follow_while` runs; elsewhere (a pipe, CI, a log file) each event is
printed as one line instead, so nothing is lost and nothing is garbled, and
rich is not even imported. Tokens are counted per finished turn; a child
with children of its own also shows its subtree's (`Σ 900 tok`). A message
whose stream was cut and begun again (`message_restarted`) replaces the
half-shown text, and the restarted message carries `RESTART_MARK` until
it is whole.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from ..runtime.events import (
    AssistantMessage,
    Done,
    Failed,
    InputRequired,
    MessageDelta,
    MessageRestarted,
    Started,
    ToolCalled,
    ToolResult,
)
from ..runtime.render import RESTART_MARK, describe_event

if TYPE_CHECKING:
    # Only in annotations: the CLI shows stored events without loading the session.
    from ..delegation.session import RelayedEvent

if TYPE_CHECKING:
    from rich.console import Console
    from rich.tree import Tree

__all__ = ["LiveTree"]

T = TypeVar("T")

_WORKING = (Started, MessageDelta, MessageRestarted, AssistantMessage, ToolCalled, ToolResult)
"""Events of a child at work (its row says running)."""


@dataclass
class _Row:
    label: str
    child_id: str = ""
    transport: str = ""
    status: str = "pending"
    last: str = ""
    tokens: int = 0
    restarted: bool = False
    """The message being shown was begun again after a cut."""
    parent_id: str = ""
    children: list[str] = field(default_factory=list)


class LiveTree:
    """Renders relayed child events as a tree (see the module docstring)."""

    def __init__(
        self,
        title: str,
        *,
        out: TextIO | None = None,
        expected: list[str] | None = None,
        console: Console | None = None,
        log_events: bool = False,
    ) -> None:
        """Writes to `out` (default stdout), or to `console` when given (a
        rich console; tests pass one that acts as a terminal). `log_events`:
        on a terminal too, each event's line (as a log gets it) is printed
        above the live tree."""
        self.title = title
        self.log_events = log_events
        self.out = out or sys.stdout
        self._console = console
        self.live = console.is_terminal if console is not None else self.out.isatty()
        self._rows: dict[str, _Row] = {}
        self._order: list[str] = []
        self._display: Any = None
        """The rich `Live` while `follow_while` runs on a terminal."""
        for label in expected or []:
            self._add(f"pending:{label}", _Row(label=label))

    def _add(self, key: str, row: _Row) -> None:
        self._rows[key] = row
        self._order.append(key)

    def show_earlier(self, relayed: RelayedEvent) -> None:
        """Show an event from before this process (a resumed run's finished
        pass), marked as such in a log."""
        self.update(relayed, note=" (before the resume)")

    def update(self, relayed: RelayedEvent, *, note: str = "") -> None:
        row = self._rows.get(relayed.child_id)
        if row is None:
            pending = f"pending:{relayed.role}"
            if pending in self._rows:
                row = self._rows.pop(pending)
                index = self._order.index(pending)
                self._order[index] = relayed.child_id
                self._rows[relayed.child_id] = row
            else:
                row = _Row(label=relayed.agent)
                self._add(relayed.child_id, row)
            row.child_id = relayed.child_id
            row.transport = relayed.transport
            row.parent_id = relayed.parent_id
        event = relayed.event
        if isinstance(event, MessageDelta) and self.live is False:
            return  # a log gets the whole message once, not every delta
        if isinstance(event, _WORKING):
            row.status = "running"
        elif isinstance(event, Done):
            row.status = "completed"
            row.tokens += event.usage.input_tokens + event.usage.output_tokens
        elif isinstance(event, Failed):
            row.status = f"failed:{event.reason}"
            row.tokens += event.usage.input_tokens + event.usage.output_tokens
        elif isinstance(event, InputRequired):
            row.status = "waiting"
            row.tokens += event.spent.tokens
        row.last = describe_event(event)
        # The withdrawn text's place now shows the message begun again,
        # marked as such until it is whole (the next message was never cut).
        if isinstance(event, MessageRestarted):
            row.restarted = True
        elif row.restarted and isinstance(event, MessageDelta | AssistantMessage):
            row.last += f" {RESTART_MARK}"
            row.restarted = isinstance(event, MessageDelta)
        else:
            row.restarted = False
        line = f"[{row.label} {row.child_id[:6]} {row.transport}] {row.last}{note}"
        if self.live:
            if self.log_events and not isinstance(event, MessageDelta):
                # Above the live display, which stays at the bottom.
                self._rich().print(line, highlight=False, markup=False)
            if self._display is not None:
                self._display.update(self.tree(), refresh=True)
        else:
            self.out.write(line + "\n")
            self.out.flush()

    def subtree_tokens(self, child_id: str) -> int:
        """A child's tokens with its descendants' (those this view has seen)."""
        total, seen, stack = 0, set(), [child_id]
        while stack:
            current = stack.pop()
            if current in seen:
                continue
            seen.add(current)
            row = self._rows.get(current)
            total += row.tokens if row is not None else 0
            stack.extend(k for k, r in self._rows.items() if r.parent_id == current and r.child_id)
        return total

    def lines(self) -> list[str]:
        lines = [self.title]
        width = max((len(self._rows[k].label) for k in self._order), default=0)
        for position, key in enumerate(self._order):
            row = self._rows[key]
            branch = "└─" if position == len(self._order) - 1 else "├─"
            tokens = f"  {row.tokens} tok" if row.tokens else ""
            below = self.subtree_tokens(row.child_id) if row.child_id else 0
            if below != row.tokens:
                tokens += f" (Σ {below} tok)"
            ident = row.child_id[:6] if row.child_id else "······"
            lines.append(
                f"{branch} {row.label:<{width}}  {ident}  {row.transport or '-':<6}  "
                f"{row.status:<14} {row.last}{tokens}"
            )
        return lines

    async def follow_while(
        self, relay: MemoryObjectReceiveStream[RelayedEvent], work: Awaitable[T]
    ) -> T:
        """Show `relay`'s events while `work` runs; return its result.

        Events still queued when it finishes are shown too, so the view ends
        on the children's final states.
        """
        failure: Exception | None = None
        if self.live:
            from rich.live import Live

            # Refreshed on each event (no refresh thread); what is printed to
            # stdout meanwhile appears above the tree. Left on screen at the end.
            self._display = Live(self.tree(), console=self._rich(), auto_refresh=False)
            self._display.start(refresh=True)
        async with anyio.create_task_group() as tg:

            async def show() -> None:
                async for relayed in relay:
                    self.update(relayed)

            tg.start_soon(show)
            try:
                result = await work
            except Exception as exc:
                # Raised after the task group, so callers catch `work`'s own
                # error (a PipelineError), not an ExceptionGroup around it.
                failure = exc
            finally:
                tg.cancel_scope.cancel()
                while True:
                    try:
                        self.update(relay.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                        break
                if self._display is not None:
                    self._display.stop()
                    self._display = None
        if failure is not None:
            raise failure
        return result

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Stop the live display for the block (a question to a person is
        printed and answered below the tree), then draw it again."""
        display = self._display
        if display is not None:
            display.stop()
        try:
            yield
        finally:
            if display is not None and self._display is display:
                display.start(refresh=True)

    def draw(self) -> None:
        """Print the whole tree once (after a run, or where there is no live view)."""
        if self.live:
            self._rich().print(self.tree())
            return
        for line in self.lines():
            self.out.write(line + "\n")
        self.out.flush()

    def tree(self) -> Tree:
        """The rows as a rich `Tree`: each child under the one that spawned
        it, when this view has seen that one."""
        from rich.text import Text
        from rich.tree import Tree

        root = Tree(Text(self.title, style="bold"))
        nodes: dict[str, Tree] = {}
        width = max((len(self._rows[k].label) for k in self._order), default=0)
        for key in self._order:
            row = self._rows[key]
            parent = nodes.get(row.parent_id, root) if row.parent_id else root
            nodes[row.child_id or key] = parent.add(self._row_text(row, width))
        return root

    def _row_text(self, row: _Row, width: int) -> Any:
        from rich.text import Text

        style = _STATUS_STYLES.get(row.status.partition(":")[0], "")
        ident = row.child_id[:6] if row.child_id else "······"
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{row.label:<{width}}  ", style="bold")
        text.append(f"{ident}  {row.transport or '-':<6}  ", style="dim")
        text.append(f"{row.status:<14}", style=style)
        text.append(f" {row.last}")
        if row.tokens:
            text.append(f"  {row.tokens} tok", style="dim")
        below = self.subtree_tokens(row.child_id) if row.child_id else 0
        if below != row.tokens:
            text.append(f" (Σ {below} tok)", style="dim")
        return text

    def _rich(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(file=self.out)
        return self._console


_STATUS_STYLES = {
    "pending": "dim",
    "running": "yellow",
    "waiting": "cyan",
    "completed": "green",
    "failed": "bold red",
}
