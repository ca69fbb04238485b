"""`Quotas`: how much of a server each caller may take, and the refusal's HTTP shape.

Limits (`callers.Limits`, set by the operator in the callers file) are
checked when a message would start work: a new task or a follow-up. A
control message, or a repeat of a message already handled, is not work. In
order: tokens per UTC day (the day's tokens are read from the `UsageLog`,
so a restart keeps them), turns running at once, messages that started work
in the last 60 seconds. The turn that crosses the token budget finishes;
the next message is refused. Other callers are not affected: every count is
per caller (owner key).

A refusal is a2a-sdk's `InvalidRequestError` (JSON-RPC -32600: A2A defines
no quota error, and this project never invents codes) whose message names
the limit, with data `{"quota", "limit", "retry_after"}`. Its HTTP shape is
set by `RefusalMiddleware`: a `Retry-After` header on every binding, and on
the HTTP+JSON binding status 429 (`RESOURCE_EXHAUSTED` in the body) instead
of the 400 the SDK gives an invalid request. The handler reaches the
middleware through the request's `ServerCallContext` (`QuotaContextBuilder`
puts a per-request cell there).

Running turns are counted from the task store: every save of a task passes
`observe` (`ObservedTaskStore`), with the context of the request that runs
it. A task saved as submitted or working is running; its next save in
another state ends it, and the usage its final status reports (the
executor's Done and Failed) is added to the caller's day. An admitted
message counts as running from its admission until its task's first such
save (or the end of its request, if that never comes), so two messages
arriving together cannot both take the last slot.

Across replicas (`QuotaSlots`, the role's replicas on one PostgreSQL
database): turns running at once are counted in the database, not in each
process, so a caller's `concurrent_tasks` holds across replicas; the
admission takes a slot in one atomic statement, the task's save as running
renames it to the task, the save that ends the turn (on any replica) frees
it, and a replica that dies stops renewing its slots, which stop counting
after a lease (the replica that adopts its turn counts that turn again).
The usage log is then a table in that database (`PgUsageLog`) and the
day's tokens are read from it at each admission, so
`tokens_per_day` holds across replicas too. `tasks_per_minute` is still
counted per replica.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from a2a.server.context import ServerCallContext
from a2a.server.owner_resolver import resolve_user_scope
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.types import InvalidRequestError, Task, TaskState
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ...errors import StoreError
from ...protocol.decoding import reported_usage
from ...storage.quota_slots import QuotaSlots
from .callers import Limits
from .usage import PgUsageLog, UsageLog, today

__all__ = [
    "CONCURRENCY_RETRY_AFTER",
    "QuotaContextBuilder",
    "Quotas",
    "RefusalMiddleware",
    "refusal",
]

CONCURRENCY_RETRY_AFTER = 5
"""Seconds a caller at its concurrency limit is told to wait (no turn's end is known)."""

logger = logging.getLogger(__name__)

_RESERVATION = "a2a_orchestrator.quota_reservation"
_SLOT = "a2a_orchestrator.quota_slot"
_REFUSAL = "a2a_orchestrator.refusal"
_WINDOW = 60.0

_ACTIVE = frozenset({TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING})
_TERMINAL = frozenset(
    {
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    }
)


@dataclass
class _Caller:
    """One caller's counters (mutable: the quotas' own state)."""

    running: set[str] = field(default_factory=set)
    reserved: int = 0
    starts: deque[float] = field(default_factory=deque)
    day: str = ""
    tokens: int | None = None
    """Tokens used on `day`; None until read from the usage log."""


class Quotas:
    """Per-caller admission and accounting (see the module docstring).

    `limits(owner)` gives a caller's limits (`Access.limits`); `usage`
    records what each caller took (None: counted in memory only); `slots`
    counts running turns across replicas (None: in this process).
    """

    def __init__(
        self,
        limits: Callable[[str], Limits],
        usage: UsageLog | PgUsageLog | None = None,
        *,
        slots: QuotaSlots | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = limits
        self.usage = usage
        self.slots = slots
        self._clock = clock
        self._callers: dict[str, _Caller] = {}
        # Reading the day's tokens and adding a turn's are kept apart, so
        # neither is lost or counted twice.
        self._tokens_lock = anyio.Lock()

    def _caller(self, owner: str) -> _Caller:
        return self._callers.setdefault(owner, _Caller())

    def running(self, owner: str) -> int:
        """Turns of `owner` running now (admitted ones included)."""
        state = self._caller(owner)
        return len(state.running) + state.reserved

    async def _tokens_today(self, owner: str, state: _Caller, day: str) -> int:
        if state.day != day or self.slots is not None:
            # Across replicas the others' turns add to the day too: read it each time.
            state.day, state.tokens = day, None
        if state.tokens is None:
            rows = await self.usage.rows(day=day, owner=owner) if self.usage else []
            state.tokens = sum(row.tokens for row in rows)
        return state.tokens

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[None]:
        """For the server's lifetime: keep this replica's slots renewed."""
        if self.slots is None:
            yield
            return
        await self.slots.create()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._renew_slots, self.slots)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()
                self.slots.close()

    async def _renew_slots(self, slots: QuotaSlots) -> None:
        while True:
            await anyio.sleep(min(1.0, slots.seconds / 3))
            try:
                await slots.renew()
            except StoreError as exc:
                logger.warning("renewing this replica's quota slots failed: %s", exc)

    @contextlib.asynccontextmanager
    async def admitted(self, context: ServerCallContext) -> AsyncIterator[None]:
        """Admit the request's work for the block (or raise its refusal)."""
        try:
            # Inside: an admission that fails after counting (its slot
            # taken, then the usage write failing) is taken back too, not
            # left counting (a slot is renewed with its replica's others).
            await self.admit(context)
            yield
        finally:
            await self._end_admission(context)

    async def tokens_left(self, context: ServerCallContext) -> int | None:
        """How many tokens the request's caller may still use today (its
        `tokens_per_day` less what it used); None when it has no such limit.
        A child's budget on this server is capped by it, turn by turn."""
        owner = resolve_user_scope(context)
        limit = self._limits(owner).tokens_per_day
        if limit is None:
            return None
        async with self._tokens_lock:
            used = await self._tokens_today(owner, self._caller(owner), today())
        return max(limit - used, 0)

    async def admit(self, context: ServerCallContext) -> None:
        """Count the request as a turn of its caller, or refuse it
        (`InvalidRequestError`) when that would pass one of its limits."""
        owner = resolve_user_scope(context)
        limits = self._limits(owner)
        state = self._caller(owner)
        day = today()
        if limits.tokens_per_day is not None:
            async with self._tokens_lock:
                used = await self._tokens_today(owner, state, day)
            if used >= limits.tokens_per_day:
                await self._refuse(
                    context,
                    owner,
                    day,
                    "tokens_per_day",
                    limits.tokens_per_day,
                    _until_utc_midnight(),
                    f"used {used} model tokens today (UTC)",
                )
        # No await from here to the reservation: two requests of one caller
        # cannot both pass the checks for the last slot.
        now = self._clock()
        while state.starts and now - state.starts[0] >= _WINDOW:
            state.starts.popleft()
        if (
            self.slots is None
            and limits.concurrent_tasks is not None
            and len(state.running) + state.reserved >= limits.concurrent_tasks
        ):
            await self._refuse(
                context,
                owner,
                day,
                "concurrent_tasks",
                limits.concurrent_tasks,
                CONCURRENCY_RETRY_AFTER,
                f"{len(state.running) + state.reserved} task(s) running",
            )
        if limits.tasks_per_minute is not None and len(state.starts) >= limits.tasks_per_minute:
            wait = math.ceil(_WINDOW - (now - state.starts[0]))
            await self._refuse(
                context,
                owner,
                day,
                "tasks_per_minute",
                limits.tasks_per_minute,
                max(1, wait),
                f"{len(state.starts)} task(s) started in the last minute",
            )
        state.starts.append(now)
        state.reserved += 1
        context.state[_RESERVATION] = True
        if self.slots is not None and limits.concurrent_tasks is not None:
            key = f"admission:{uuid.uuid4().hex}"
            try:
                # Shielded: a request cancelled once the slot's row is
                # committed would leave it counting, renewed with this
                # replica's others, with nobody to free it.
                with anyio.CancelScope(shield=True):
                    taken = await self.slots.take(owner, key, limits.concurrent_tasks)
            except BaseException:
                self._undo(context, state, now)
                raise
            if taken is not None:
                self._undo(context, state, now)
                await self._refuse(
                    context,
                    owner,
                    day,
                    "concurrent_tasks",
                    limits.concurrent_tasks,
                    CONCURRENCY_RETRY_AFTER,
                    f"{taken} task(s) running across replicas",
                )
            context.state[_SLOT] = key
        if self.usage is not None:
            await self.usage.add(owner, day, tasks=1)

    async def _refuse(
        self,
        context: ServerCallContext,
        owner: str,
        day: str,
        quota: str,
        limit: int,
        retry_after: int,
        why: str,
    ) -> None:
        if self.usage is not None:
            await self.usage.add(owner, day, refused=1)
        raise refusal(
            context,
            quota,
            limit,
            retry_after,
            f"quota exceeded: {quota} is {limit} for this caller ({why}); "
            f"retry after {retry_after} s",
        )

    async def adopted(self, owner: str, task_id: str) -> None:
        """Count a turn this replica took over from a dead one (across
        replicas only: a single server adopts nothing); its end frees it."""
        if self.slots is not None and self._limits(owner).concurrent_tasks is not None:
            await self.slots.hold(owner, task_id)

    async def abandoned(self, owner: str, task_id: str) -> None:
        """Stop counting a turn whose end could not be stored (it runs no
        more; the save that would have ended its count failed)."""
        self._caller(owner).running.discard(task_id)
        if self.slots is not None:
            try:
                await self.slots.free(owner, task_id)
            except StoreError as exc:
                logger.warning("could not free task %s's quota slot: %s", task_id, exc)

    def _undo(self, context: ServerCallContext, state: _Caller, start: float) -> None:
        """Take back an admission refused after it was counted here."""
        self.release(context)
        with contextlib.suppress(ValueError):
            state.starts.remove(start)

    def release(self, context: ServerCallContext) -> None:
        """End the request's admission if no task save has taken it over."""
        if context.state.pop(_RESERVATION, None):
            self._caller(resolve_user_scope(context)).reserved -= 1

    async def _end_admission(self, context: ServerCallContext) -> None:
        """`release`, and free the admission's slot no task took over."""
        self.release(context)
        key = context.state.pop(_SLOT, None)
        if key is not None and self.slots is not None:
            with anyio.CancelScope(shield=True):
                await self.slots.free(resolve_user_scope(context), key)

    async def observe(self, task: Task, context: ServerCallContext) -> None:
        """Told each save of a task (`ObservedTaskStore`)."""
        owner = resolve_user_scope(context)
        state = self._caller(owner)
        status = task.status.state
        if status in _ACTIVE or status in _TERMINAL:
            # The admitted turn runs (or already ended): the task counts now.
            self.release(context)
        if self.slots is not None:
            await self._observe_slot(task, context, owner)
        if status in _ACTIVE:
            state.running.add(task.id)
            return
        if task.id not in state.running:
            return  # not a turn that ran here, or its end was counted already
        state.running.discard(task.id)
        input_tokens, output_tokens = _reported_usage(task)
        if not input_tokens and not output_tokens:
            return
        day = today()
        async with self._tokens_lock:
            if state.day == day and state.tokens is not None:
                state.tokens += input_tokens + output_tokens
            if self.usage is not None:
                await self.usage.add(
                    owner, day, input_tokens=input_tokens, output_tokens=output_tokens
                )

    async def _observe_slot(self, task: Task, context: ServerCallContext, owner: str) -> None:
        """The slots' side of `observe`: the admission's slot becomes the
        task's while it runs; any other save (on any replica) ends it."""
        assert self.slots is not None
        if task.status.state in _ACTIVE:
            key = context.state.pop(_SLOT, None)
            if key is not None:
                await self.slots.move(owner, key, task.id)
            return
        await self.slots.free(owner, task.id)
        key = context.state.pop(_SLOT, None)
        if key is not None:
            await self.slots.free(owner, key)


def refusal(
    context: ServerCallContext, quota: str, limit: int, retry_after: int, message: str
) -> InvalidRequestError:
    """The error refusing a request past a limit (a quota, or `streams.py`'s
    caps), its HTTP shape set for `RefusalMiddleware`."""
    cell = context.state.get(_REFUSAL)
    if isinstance(cell, dict):
        cell["retry_after"] = retry_after
    return InvalidRequestError(
        message=message, data={"quota": quota, "limit": limit, "retry_after": retry_after}
    )


def _reported_usage(task: Task) -> tuple[int, int]:
    """The usage a task's final status reports (`wire.publish` of Done / Failed,
    alone or ending a batch)."""
    message = task.status.message
    if not message.HasField("metadata"):
        return 0, 0
    try:
        usage = reported_usage(message)
    except (TypeError, ValueError):
        return 0, 0
    return usage.input_tokens, usage.output_tokens


def _until_utc_midnight() -> int:
    now = dt.datetime.now(dt.UTC)
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    return max(1, math.ceil((midnight - now).total_seconds()))


class QuotaContextBuilder(DefaultServerCallContextBuilder):
    """a2a-sdk's context builder, plus the request's refusal cell (`RefusalMiddleware`)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        cell = request.scope.get(_REFUSAL)
        if cell is not None:
            context.state[_REFUSAL] = cell
        return context


class RefusalMiddleware:
    """Gives a quota refusal its HTTP shape (see the module docstring).

    JSON-RPC answers keep their 200 (the error is in the body, where JSON-RPC
    clients look) and gain `Retry-After`; an HTTP+JSON answer's 400 becomes
    a 429 with `Retry-After`, its body's code and status to match.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cell: dict[str, Any] = {}
        scope[_REFUSAL] = cell
        start: Message | None = None
        chunks: list[bytes] = []

        async def shaped(message: Message) -> None:
            nonlocal start
            if "retry_after" not in cell:
                await send(message)
                return
            if message["type"] == "http.response.start":
                if message["status"] != 400:
                    headers = [*message.get("headers", ()), _retry_after(cell)]
                    await send({**message, "headers": headers})
                    return
                start = message  # held until the whole body is rewritten
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = _as_429(b"".join(chunks))
            headers = [
                (name, value)
                for name, value in start.get("headers", ())
                if name.lower() != b"content-length"
            ]
            headers += [(b"content-length", str(len(body)).encode()), _retry_after(cell)]
            await send({**start, "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await self.app(scope, receive, shaped)


def _retry_after(cell: dict[str, Any]) -> tuple[bytes, bytes]:
    return (b"retry-after", str(cell["retry_after"]).encode())


def _as_429(body: bytes) -> bytes:
    try:
        payload = json.loads(body)
        error = payload["error"]
        error["code"] = 429
        error["status"] = "RESOURCE_EXHAUSTED"
    except (ValueError, KeyError, TypeError):
        return body
    return json.dumps(payload).encode()
