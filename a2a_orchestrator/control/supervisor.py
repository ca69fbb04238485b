"""The supervisor: a parent watches its children's events and steps in (agent_os).

One tool, `supervisor`, with an `action`: spawn, subscribe, unsubscribe,
subscriptions, send, pause, resume, stop, status, session. Also a Python API
(`Supervisor`), and declarative rules without a parent agent (`reactions.py`).

A subscription selects events (`{kind?, tool?, success?, contains?}`) of one
child or of any direct child (optionally of one role). When one matches:
the child is paused first if `pause_child`; the `inject` template is rendered
in a bounded Jinja sandbox (`templates.py`; a template that fails is stored
as an `inject_failed` event naming the subscription, and the subscriptions
after it still run) with `event` in its context and put into the parent's
context (its transcript, then its inbox; with `run_turn` a parent that is
idle starts a turn on it at once; otherwise a running parent reads it at its
next step, an idle one in the first model call of its next turn);
the child is resumed right after if `resume_after`; a `once` subscription is
then removed. Subscriptions are stored, so they outlive a restart.

`pause_child` lands at the matching event, with no step after it, on either
transport: the supervisor hears of events beside the child's turn (a
watcher, `watchers.py`), so the child gets the subscription's selector as a
pause rule (`ChildHandle.pause_on`): an in-process run holds itself at the
match, a role server does (the rule carried by the control extension), and
the supervisor's pause confirms the hold. The rules go to a child when it
is subscribed to, or when the supervisor first hears of it (spawned, or
after a restart), and are dropped with the subscription.

Operations on one child are allowed only to its direct parent. As a tool,
every error an action meets is its result (`control.as_tool`). A stop with
`signal="terminate"` is final: the child refuses messages until `resume`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..delegation.base import ChildHandle
from ..errors import ControlError, UnknownChildError
from ..runtime.events import ChildEvent, new_uuid
from ..runtime.records import RecordKind
from ..runtime.render import describe_event
from ..runtime.selectors import EVENT_KINDS, Selector, event_context, render_inject
from ..tools import Tool
from .plane import ControlPlane, as_tool

__all__ = [
    "STOP_SIGNALS",
    "Subscription",
    "Supervisor",
    "supervisor_tool",
]

STOP_SIGNALS = ("pause", "interrupt", "terminate")
SESSION_LIMIT = 50

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Subscription:
    id: str
    inject: str
    event: Selector = field(default_factory=Selector)
    child: str | None = None
    role: str | None = None
    pause_child: bool = False
    resume_after: bool = False
    run_turn: bool = False
    once: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["event"] = {k: v for k, v in asdict(self.event).items() if v is not None}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Subscription:
        fields = dict(data)
        fields["event"] = Selector.from_dict(fields.get("event"))
        return cls(**fields)


class Supervisor:
    """A parent's supervision of its direct children (see the module docstring)."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        start_turn: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`start_turn(text)` gives the parent the injected text: a new turn if
        it is idle, its inbox if not. Without it, injections wait in the
        parent's inbox for its next turn."""
        self.plane = plane
        self.session = plane.session
        self.start_turn = start_turn
        self._subscriptions: dict[str, Subscription] = {}
        self._armed: set[str] = set()
        """Children given the pause rules of the subscriptions that apply to them."""
        self.loaded = False
        self._remove = self.session.add_listener(self._on_event)

    def close(self) -> None:
        self._remove()

    async def load(self) -> None:
        """Read this parent's stored subscriptions (they survive restarts)."""
        for data in await self.session.store.subscriptions(self.session.id, self.plane.parent_id):
            subscription = Subscription.from_dict(data)
            self._subscriptions.setdefault(subscription.id, subscription)
        self.loaded = True

    # -- the tool's actions ----------------------------------------------------------

    async def act(self, action: str, fields: Mapping[str, Any]) -> Any:
        """Dispatch one `supervisor` tool call."""
        if not self.loaded:
            await self.load()
        handlers: dict[str, Callable[..., Awaitable[Any]]] = {
            "spawn": self.spawn,
            "subscribe": self.subscribe,
            "unsubscribe": self.unsubscribe,
            "subscriptions": self.subscriptions,
            "send": self.send,
            "pause": self.pause,
            "resume": self.resume,
            "stop": self.stop,
            "status": self.status,
            "session": self.session_messages,
        }
        handler = handlers.get(action)
        if handler is None:
            raise ControlError(f"unknown action {action!r}; actions: {', '.join(handlers)}")
        try:
            return await handler(**fields)
        except TypeError as exc:
            raise ControlError(f"{action}: {exc}") from exc

    async def spawn(
        self, template: str, task: str | None = None, session_key: str | None = None
    ) -> dict[str, Any]:
        """Start a child of `template` (an agent or role) without waiting; its pid.

        With `session_key`, the child spawned before under that key (this
        session, this parent) is reused, and `task` becomes its next turn.
        """
        if session_key:
            records = await self.session.store.list_children(
                session_id=self.session.id, parent_id=self.plane.parent_id
            )
            for record in records:
                if record.config.get("metadata", {}).get("session_key") == session_key:
                    handle = await self.session.child(record.child_id)
                    if task:
                        await handle.send(task)
                    return {"pid": handle.child_id, "reused": True}
        handle = await self.plane.spawn_agent(
            template,
            task or "Wait for instructions.",
            metadata={"session_key": session_key} if session_key else {},
        )
        await self._arm(handle)
        return {"pid": handle.child_id}

    async def subscribe(
        self,
        inject: str,
        event: Mapping[str, Any] | None = None,
        child: str | None = None,
        role: str | None = None,
        pause_child: bool = False,
        resume_after: bool = False,
        run_turn: bool = False,
        once: bool = False,
    ) -> dict[str, Any]:
        if child is not None:
            await self._direct(child)
        render_inject(inject, {})  # a template that does not parse fails now
        subscription = Subscription(
            id=new_uuid()[:12],
            inject=inject,
            event=Selector.from_dict(event),
            child=child,
            role=role,
            pause_child=bool(pause_child),
            resume_after=bool(resume_after),
            run_turn=bool(run_turn),
            once=bool(once),
        )
        await self.session.store.put_subscription(
            subscription.id, self.session.id, self.plane.parent_id, _spec(subscription)
        )
        self._subscriptions[subscription.id] = subscription
        if subscription.pause_child:
            for handle in self.plane.children():
                if self._applies(subscription, handle):
                    await handle.pause_on(subscription.id, subscription.event)
        return {"id": subscription.id}

    async def unsubscribe(self, id: str) -> dict[str, Any]:
        removed = self._subscriptions.pop(id, None) is not None
        removed = await self.session.store.delete_subscription(id) or removed
        if not removed:
            raise ControlError(f"no subscription {id!r}")
        await self._disarm(id)
        return {"removed": id}

    async def subscriptions(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self._subscriptions.values()]

    async def send(self, pid: str, content: str, role: str = "user") -> dict[str, Any]:
        """Put a message into the child's context (a new turn if it is idle)."""
        await self._direct(pid)
        text = content if role == "user" else f"[{role}] {content}"
        return await self.plane.send_message(pid, text)

    async def pause(self, pid: str) -> dict[str, Any]:
        handle = await self._direct(pid)
        await handle.pause()
        await self._record(handle, "pause")
        return {"pid": pid, "paused": True}

    async def resume(self, pid: str) -> dict[str, Any]:
        """Run a paused child on; a terminated one takes messages again."""
        handle = await self._direct(pid)
        lifted = await self.plane.resume(pid)
        if not (lifted["reinstated"] or lifted["resumed"]):
            # A pause this process did not see (set before a restart): the
            # child's run is asked all the same.
            await handle.resume()
        await self._record(handle, "resume")
        return {"pid": pid, "paused": False, "terminated": False}

    async def stop(self, pid: str, signal: str = "interrupt") -> dict[str, Any]:
        """`pause`; `interrupt` (end the turn, keep the conversation); `terminate`."""
        if signal not in STOP_SIGNALS:
            raise ControlError(f"signal must be one of {', '.join(STOP_SIGNALS)}")
        handle = await self._direct(pid)
        if signal == "pause":
            return await self.pause(pid)
        if signal == "interrupt":
            stopped = await handle.interrupt()
            await self._record(handle, signal)
        else:
            # Final: it refuses messages until `resume` (recorded by the plane).
            stopped = await self.plane.terminate(handle)
        return {"pid": pid, "signal": signal, "stopped": stopped}

    async def status(self, pid: str) -> dict[str, Any]:
        handle = await self._direct(pid)
        last = handle.log[-1] if handle.log else None
        return {
            "pid": pid,
            "agent": handle.agent,
            "role": handle.role,
            "transport": handle.transport,
            "status": handle.status,
            "running": handle.running,
            "paused": handle.paused,
            "events": len(handle.log),
            "last_event": describe_event(last) if last is not None else None,
        }

    async def session_messages(self, pid: str, limit: int = SESSION_LIMIT) -> dict[str, Any]:
        """The child's live context: its last `limit` messages."""
        handle = await self._direct(pid)
        messages = await handle.run.history()
        keep = ("role", "content", "tool_call_id", "tool_calls")
        window = messages[-max(1, int(limit)) :]
        return {"pid": pid, "messages": [{k: m[k] for k in keep if k in m} for m in window]}

    # -- matching ---------------------------------------------------------------

    async def _direct(self, pid: str) -> ChildHandle:
        try:
            return await self.plane._child(pid)
        except UnknownChildError:
            record = await self.session.store.get_child(pid)
            if record is not None and record.session_id == self.session.id:
                raise ControlError(
                    f"{pid} is not a direct child of this parent; only its parent may act on it"
                ) from None
            raise

    async def _record(self, handle: ChildHandle, action: str) -> None:
        await self.session.store.append_event(
            self.session.id, RecordKind.CONTROL, {"action": action}, child_id=handle.child_id
        )

    def _applies(self, subscription: Subscription, handle: ChildHandle) -> bool:
        """The subscription watches this child (a direct child, of its pid or role)."""
        if handle.parent_id != self.plane.parent_id:
            return False
        if subscription.child is not None and subscription.child != handle.child_id:
            return False
        return subscription.role is None or subscription.role in (handle.role, handle.agent)

    async def _arm(self, handle: ChildHandle) -> None:
        """Give a child the pause rules of the `pause_child` subscriptions on it."""
        self._armed.add(handle.child_id)
        for subscription in list(self._subscriptions.values()):
            if subscription.pause_child and self._applies(subscription, handle):
                await handle.pause_on(subscription.id, subscription.event)

    async def _disarm(self, subscription_id: str) -> None:
        for handle in self.plane.children():
            await handle.pause_on(subscription_id, None)

    async def _on_event(self, handle: ChildHandle, event: ChildEvent) -> None:
        if handle.parent_id != self.plane.parent_id or not self._subscriptions:
            return
        if handle.child_id not in self._armed:
            # A child spawned some other way, or held before a restart.
            await self._arm(handle)
        for subscription in list(self._subscriptions.values()):
            if not self._applies(subscription, handle):
                continue
            if not subscription.event.matches(handle, event):
                continue
            await self._fire(subscription, handle, event)

    async def _fire(
        self, subscription: Subscription, handle: ChildHandle, event: ChildEvent
    ) -> None:
        if subscription.once:
            # Removed before acting, so a second match while this one runs cannot fire it again.
            self._subscriptions.pop(subscription.id, None)
            await self.session.store.delete_subscription(subscription.id)
        if subscription.pause_child:
            # Confirms the hold the child's pause rule put it in (remote).
            await handle.pause()
            await self._record(handle, "pause")
            if subscription.once:
                # Only now: dropping the rule first would release the hold.
                await self._disarm(subscription.id)
        try:
            text = render_inject(subscription.inject, event_context(handle, event))
        except ControlError as exc:
            # A template that fails on this event must not fail the child:
            # record why, and leave the parent's context alone.
            logger.warning("subscription %s: %s", subscription.id, exc)
            await self.session.store.append_event(
                self.session.id,
                "inject_failed",
                {"subscription": subscription.id, "error": str(exc), "from_child": handle.child_id},
                child_id=self.plane.parent_id or None,
            )
        else:
            as_turn = subscription.run_turn and self.start_turn is not None
            await self.inject(
                text, subscription=subscription.id, child_id=handle.child_id, as_turn=as_turn
            )
            if as_turn and self.start_turn is not None:
                await self.start_turn(text)
            elif self.plane.inbox is not None:
                self.plane.inbox.steer(text)
        if subscription.resume_after:
            await handle.resume()
            await self._record(handle, "resume")

    async def inject(
        self, text: str, *, subscription: str = "", child_id: str = "", as_turn: bool = False
    ) -> None:
        """Record an injection in the parent's transcript. `as_turn`: it starts
        a parent turn, whose input row records it in the transcript already."""
        await self.session.store.append_event(
            self.session.id,
            RecordKind.INJECT,
            {
                "text": text,
                "subscription": subscription,
                "from_child": child_id,
                "as_turn": as_turn,
            },
            child_id=self.plane.parent_id or None,
        )


def _spec(subscription: Subscription) -> dict[str, Any]:
    data = subscription.to_dict()
    data.pop("id")
    return data


SUPERVISOR_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {
            "type": "string",
            "enum": [
                "spawn",
                "subscribe",
                "unsubscribe",
                "subscriptions",
                "send",
                "pause",
                "resume",
                "stop",
                "status",
                "session",
            ],
        },
        "template": {"type": "string", "description": "spawn: the agent or role to start"},
        "task": {"type": "string", "description": "spawn: its task"},
        "session_key": {"type": "string", "description": "spawn: reuse the child with this key"},
        "event": {
            "type": "object",
            "description": "subscribe: selector {kind, tool, success, contains}; kind is one of "
            + ", ".join(EVENT_KINDS),
        },
        "inject": {
            "type": "string",
            "description": "subscribe: Jinja template put into your context, e.g. "
            "'Failed: {{ event.content }}'",
        },
        "child": {"type": "string", "description": "subscribe: only this pid"},
        "role": {"type": "string", "description": "subscribe: only children of this role"},
        "pause_child": {"type": "boolean"},
        "resume_after": {"type": "boolean"},
        "run_turn": {"type": "boolean"},
        "once": {"type": "boolean"},
        "id": {"type": "string", "description": "unsubscribe: the subscription id"},
        "pid": {"type": "string", "description": "the child's pid"},
        "content": {"type": "string", "description": "send: the message"},
        "signal": {"type": "string", "enum": list(STOP_SIGNALS)},
        "limit": {"type": "integer", "description": "session: how many messages (50)"},
    },
    "required": ["action"],
}


def supervisor_tool(supervisor: Supervisor) -> Tool:
    """The one `supervisor` tool over a `Supervisor`."""

    async def run(arguments: dict[str, Any]) -> Any:
        fields = dict(arguments)
        action = str(fields.pop("action", ""))
        return await supervisor.act(action, fields)

    return as_tool(
        "supervisor",
        "Supervise your sub-agents: spawn them, subscribe to their events "
        "(injected into your context when they match), message, pause, resume or stop "
        "them, read their status and their live context. stop with signal=terminate "
        "is final until resume.",
        SUPERVISOR_PARAMETERS,
        run,
    )
