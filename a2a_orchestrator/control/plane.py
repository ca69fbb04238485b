"""The control plane: a parent's operations over its children.

The seeds' semantics over the one delegation interface, so every operation
works the same on local and remote children:

- `agent([...])` spawns one or many and answers at once (Creo);
  `spawn_agent(...)` spawns one and raises on refusal (TypeScript agent).
- `agent_manage(messages)`: RESUME -> MESSAGES -> CHECK -> BLOCK -> COLLECT.
- `wait_agent(child_id, timeout_ms)`: completed / failed / timeout, only once
  the result is delivered to the parent; a timeout leaves the child running.
- `send_message(child_id, text)`: exactly once, stored before it returns:
  the running turn reads it at its next step boundary if it still can,
  otherwise it opens a turn (now for an idle child, right after the turn
  that just ended otherwise).
- `agent_abort([...])`, `stop_children()` (cascading, returns the count):
  stops are final. An aborted child, running or idle, refuses messages until
  `resume(child_id)`; agent_manage reports it `done`.
- A concurrency gate per parent and hooks (spawn.before may deny, and sees
  the config as asked); then the session's spawn policy narrows or denies
  (`policy.py`), and what is left of the parent's budget caps the child's.
- A model name a parent chooses (`spawn_agent`/`agent`'s `model`) is one the
  operator offers (`default`, `mini`, the role's `models`, `$A2A_MODELS`),
  never a model script; `Session.spawn` (the operator's own code) is not
  narrowed.

As tools (`as_tool`), every refusal or failure is the tool's result, which
the model reads; the parent's turn goes on. Only cancellation propagates.

Delivery contract (TS seed: "transcript first, then mailbox"): when a child's
turn ends done or failed, its result is already stored with the child; the
rendered FINAL_ANSWER (with the child's subtree usage so far) is appended
to the parent's transcript in the store,
then offered to the parent's inbox (de-duplicated by uuid there), then marked
delivered, which is what `wait_agent` waits for; the `complete` hook runs last.
Delivery is a watcher of the session (off the child's path): a waiter that
finds the result not delivered yet delivers it itself, once, or waits for
the delivery under way.
"""

from __future__ import annotations

import json
import logging
import math
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ..delegation.base import ChildConfig, ChildHandle
from ..delegation.hooks import CompleteInfo, Hooks, SpawnInfo
from ..errors import (
    ConfigError,
    ControlError,
    OrchestratorError,
    SpawnRefusedError,
    ToolError,
    UnknownChildError,
)
from ..runtime.conversation import Conversation
from ..runtime.events import ChildEvent, Done, Failed, InputRequired
from ..runtime.overrides import check_wire_overrides, offered_models, operator_models
from ..runtime.records import RecordKind
from ..runtime.render import normalise, render_final_answer, truncate_to_budget
from ..runtime.roles import Role, find_role
from ..tools import Tool

if TYPE_CHECKING:
    # Only in annotations: keeps the control plane importable without the transports.
    from ..delegation.session import Session

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_DEPTH",
    "GATE_MESSAGE",
    "WAIT_BOUNDS_MS",
    "ControlPlane",
    "as_tool",
    "clamp_timeout",
    "control_tools",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENT = 4
DEFAULT_MAX_DEPTH = 1
GATE_MESSAGE = "Concurrent subagent limit reached"
WAIT_BOUNDS_MS = (10_000, 3_600_000)
DEFAULT_WAIT_MS = 30_000
_DELIVERY = uuidlib.UUID("5f0c2a52-6d1b-4f4e-9a7e-2d3c1b0a9f11")


def clamp_timeout(timeout_ms: float | None, bounds: tuple[int, int] = WAIT_BOUNDS_MS) -> float:
    """`wait_agent`'s timeout in seconds: default 30 s, clamped to `bounds` (ms)."""
    low, high = bounds
    value = DEFAULT_WAIT_MS if timeout_ms is None else timeout_ms
    return min(max(float(value), low), high) / 1000


def as_tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    call: Callable[[dict[str, Any]], Awaitable[Any]],
) -> Tool:
    """A control operation as a tool whose result is `call`'s answer as JSON.

    Errors are contained here, once for every control and supervisor tool:
    whatever the operation meets (a refusal, an unknown agent or child, a
    peer that cannot do it, a broken connection) becomes a `ToolError`, so
    the model reads what went wrong and its turn goes on. Cancellation is
    not an `Exception` and propagates.
    """

    async def run(arguments: dict[str, Any]) -> str:
        try:
            return as_json(await call(arguments))
        except ToolError:
            raise
        except OrchestratorError as exc:
            raise ToolError(str(exc)) from exc
        except KeyError as exc:
            raise ToolError(f"{name}: missing argument {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise ToolError(f"{name}: bad arguments: {exc}") from exc
        except Exception as exc:
            # Not one of ours: a bug or an unexpected failure below. The
            # model still gets an answer; the traceback goes to the log.
            logger.exception("tool %s failed", name)
            raise ToolError(f"{name} failed: {type(exc).__name__}: {exc}") from exc

    return Tool(name=name, description=description, parameters=parameters, run=run)


class ControlPlane:
    """One parent's control over its children (see the module docstring).

    `parent_id` is "" for the session's root parent, else the child id of a
    child that is itself a parent (when `max_depth` allows it).
    """

    def __init__(
        self,
        session: Session,
        *,
        parent_id: str = "",
        depth: int = 0,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        max_depth: int = DEFAULT_MAX_DEPTH,
        hooks: Hooks | None = None,
        inbox: Conversation | None = None,
        wait_bounds_ms: tuple[int, int] = WAIT_BOUNDS_MS,
        model_names: Collection[str] | None = None,
    ) -> None:
        """`model_names`: the names a parent may choose for a child besides
        `default`, `mini` and the role's `models` (None: `$A2A_MODELS`)."""
        self.session = session
        self.parent_id = parent_id
        self.depth = depth
        self.max_concurrent = max_concurrent
        self.max_depth = max_depth
        self.hooks = hooks or Hooks()
        self.inbox = inbox
        self.wait_bounds_ms = wait_bounds_ms
        self.model_names = tuple(model_names if model_names is not None else operator_models())
        # A model script among them is refused here, at start-up.
        offered_models(Role(name="-", prompt="-"), self.model_names)
        self._delivered: dict[str, str] = {}
        self._delivering: dict[str, anyio.Event] = {}
        """Deliveries under way, by the uuid of the result they carry."""
        self._reported: dict[str, str] = {}
        self._changed = anyio.Event()
        self._reserved = 0
        self._remove_listener = session.add_listener(self._on_event)
        # A turn's end wakes waiters once the child is idle; a waiter that
        # finds its result not delivered yet delivers it (`_outcome`).
        self._remove_settle = session.add_settle_listener(self._on_settled)
        if depth == 0:
            session.child_tools = self._tools_for_child

    @property
    def task_name(self) -> str:
        """What the FINAL_ANSWER's `Task name` says: the parent's id."""
        return self.parent_id or self.session.id

    def close(self) -> None:
        """Stop listening; the control planes of this parent's children go too."""
        self._remove_listener()
        self._remove_settle()
        for child_id, plane in list(self.session.nested_planes.items()):
            handle = self.session.children.get(child_id)
            if handle is not None and handle.parent_id == self.parent_id:
                plane.close()
                self.session.nested_planes.pop(child_id, None)

    def _on_settled(self, handle: ChildHandle) -> None:
        if handle.parent_id == self.parent_id:
            self._notify()

    # -- children ---------------------------------------------------------------

    def children(self) -> list[ChildHandle]:
        """This parent's children held in memory, oldest first."""
        return [h for h in self.session.children.values() if h.parent_id == self.parent_id]

    async def _child(self, child_id: str) -> ChildHandle:
        handle = self.session.children.get(child_id)
        if handle is None:
            record = await self.session.store.get_child(child_id)
            if record is None or record.session_id != self.session.id:
                raise UnknownChildError(child_id)
            handle = await self.session.child(child_id)
        if handle.parent_id != self.parent_id:
            raise UnknownChildError(child_id)
        return handle

    def _matching(self, target: str, *, live: bool = False) -> list[ChildHandle]:
        """Children named by id, else by role or agent name (`live`: by role,
        only those not terminated)."""
        mine = self.children()
        by_id = [h for h in mine if h.child_id == target]
        return by_id or [
            h for h in mine if target in (h.role, h.agent) and not (live and h.terminated)
        ]

    def running_count(self) -> int:
        return sum(1 for h in self.children() if h.running)

    # -- spawning -----------------------------------------------------------------

    async def spawn_agent(
        self,
        role: str,
        prompt: str,
        *,
        model: str | None = None,
        system_prompt: str | None = None,
        tools: Sequence[str] | None = None,
        **config: Any,
    ) -> ChildHandle:
        """Spawn one child; `SpawnRefusedError` when a hook or the gate says
        no, `ConfigError` for an unknown agent or a model not offered. A
        refusal is recorded (`SPAWN_REFUSED`), so the views show it."""
        try:
            if model is not None:
                self._check_model(role, model)
            return await self._spawn(role, prompt, model, system_prompt, tools, config)
        except (SpawnRefusedError, ConfigError) as exc:
            await self.session.store.append_event(
                self.session.id,
                RecordKind.SPAWN_REFUSED,
                {"role": role, "prompt": prompt[:500], "reason": str(exc)},
                child_id=self.parent_id or None,
            )
            raise

    def _check_model(self, agent: str, model: object) -> None:
        """Refuse a model the operator does not offer for `agent`'s role: the
        name comes from a model, as untrusted as a caller over A2A."""
        spec = self.session.network.resolve(agent)
        try:
            role = find_role(spec.role)
        except ConfigError:
            # A foreign agent's role: only what every role offers; its own
            # server narrows further.
            role = Role(name=spec.role, prompt="-")
        offered = offered_models(role, self.model_names)
        check_wire_overrides({"model": model}, role, offered)

    async def _spawn(
        self,
        role: str,
        prompt: str,
        model: str | None,
        system_prompt: str | None,
        tools: Sequence[str] | None,
        config: dict[str, Any],
    ) -> ChildHandle:
        child_config = ChildConfig(
            role=role,
            prompt=prompt,
            model=model,
            system_prompt=system_prompt,
            tools=tuple(tools) if tools is not None else None,
            **config,
        )
        info = SpawnInfo(
            session_id=self.session.id,
            parent_id=self.parent_id,
            role=role,
            prompt=prompt,
            config=child_config.to_dict(),
        )
        deny = await self.hooks.before_spawn(info)
        if deny is not None:
            raise SpawnRefusedError(f"Subagent spawn denied: {deny.reason}")
        # The gate after the hooks (the seed's order): a spawn a hook denies,
        # or one still waiting for its hooks, takes no slot from another.
        # Spawns in flight hold their slot, so concurrent spawns cannot all
        # pass the gate before any of them is counted.
        if self.running_count() + self._reserved >= self.max_concurrent:
            raise SpawnRefusedError(GATE_MESSAGE)
        self._reserved += 1
        try:
            handle = await self.session.spawn(
                child_config, parent_id=self.parent_id, depth=self.depth + 1
            )
        finally:
            self._reserved -= 1
        await self.hooks.notify(
            "spawn.after",
            SpawnInfo(
                session_id=info.session_id,
                parent_id=info.parent_id,
                role=handle.role,
                prompt=prompt,
                child_id=handle.child_id,
                config=info.config,
            ),
        )
        return handle

    async def agent(self, agents: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Spawn each of `agents` ({role, prompt, model?, tools?, system_prompt?});
        one entry per request: `{child_id, role, status}` or `{role, status: error, error}`."""
        out: list[dict[str, Any]] = []
        for request in agents:
            role = str(request.get("role", ""))
            try:
                prompt = request.get("prompt")
                if not role or not isinstance(prompt, str) or not prompt.strip():
                    raise SpawnRefusedError("each agent needs a role and a non-empty prompt")
                extra = set(request) - {"role", "prompt", "model", "tools", "system_prompt"}
                if extra:
                    raise SpawnRefusedError(f"unknown field(s) {sorted(extra)}")
                tools = request.get("tools")
                handle = await self.spawn_agent(
                    role,
                    prompt,
                    model=request.get("model"),
                    system_prompt=request.get("system_prompt"),
                    tools=list(tools) if tools is not None else None,
                )
            except OrchestratorError as exc:
                out.append({"role": role, "status": "error", "error": str(exc)})
                continue
            out.append({"child_id": handle.child_id, "role": handle.role, "status": "running"})
        return out

    # -- waiting ------------------------------------------------------------------

    async def _outcome(self, handle: ChildHandle) -> ChildEvent | None:
        """The child's last turn's end once it is settled, delivered first if
        it ended done or failed (a child reopened after a restart, or finished
        before this plane existed, gets its delivery now; it happens once)."""
        terminal = handle.last_terminal if handle.settled else None
        if isinstance(terminal, Done | Failed) and self._delivered.get(handle.child_id) != (
            terminal.uuid
        ):
            await self._deliver(handle, terminal)
        return terminal

    async def wait_agent(self, child_id: str, timeout_ms: float | None = None) -> dict[str, Any]:
        """Wait for a child's result: `completed`, `failed` or `timeout`."""
        handle = await self._child(child_id)
        with anyio.move_on_after(clamp_timeout(timeout_ms, self.wait_bounds_ms)):
            while True:
                outcome = await self._outcome(handle)
                if isinstance(outcome, Done | Failed):
                    status, payload = normalise(outcome)
                    return {
                        "child_id": child_id,
                        "status": status,
                        "result": truncate_to_budget(payload),
                    }
                changed = self._changed
                await changed.wait()
        answer: dict[str, Any] = {
            "child_id": child_id,
            "status": "timeout",
            "child_status": handle.status,
        }
        if isinstance(handle.last_terminal, InputRequired) and handle.settled:
            answer["question"] = handle.last_terminal.question
        return answer

    async def agent_manage(
        self, messages: Mapping[str, str] | None = None, *, block_for: float | None = None
    ) -> list[dict[str, Any]]:
        """Creo's FSM; returns every child's status (idle ones with their message).

        `block_for` bounds the BLOCK step in seconds (None: until a child
        finishes a turn); COLLECT runs either way."""
        # RESUME: children whose runner died (a crash, a restart) run again,
        # and finished ones the store knows of come back for COLLECT.
        await self.session.recover(parent_id=self.parent_id)
        records = await self.session.store.list_children(
            session_id=self.session.id, parent_id=self.parent_id
        )
        errors: list[dict[str, Any]] = []
        for record in records:
            try:
                await self.session.child(record.child_id)
            except OrchestratorError as exc:  # e.g. its remote agent is gone
                errors.append({"child_id": record.child_id, "status": "error", "error": str(exc)})
        # MESSAGES
        for target, text in (messages or {}).items():
            handles = self._matching(target)
            if not handles:
                errors.append(
                    {"target": target, "status": "error", "error": str(UnknownChildError(target))}
                )
            for handle in handles:
                try:
                    await handle.send(text)
                except ControlError as exc:  # terminated: refused, the others still go
                    errors.append(
                        {"child_id": handle.child_id, "status": "error", "error": str(exc)}
                    )
        # CHECK: a child that finished a turn nobody has heard of yet answers at once.
        if not self._unreported() and any(h.running for h in self.children()):
            # BLOCK until a child finishes a turn.
            with anyio.move_on_after(block_for if block_for is not None else math.inf):
                while not self._unreported():
                    changed = self._changed
                    await changed.wait()
        # COLLECT
        for handle in self.children():
            await self._outcome(handle)
        return errors + [self._report(handle) for handle in self.children()]

    def _unreported(self) -> list[ChildHandle]:
        out = []
        for handle in self.children():
            terminal = handle.last_terminal
            if (
                handle.settled
                and terminal is not None
                and self._reported.get(handle.child_id) != terminal.uuid
            ):
                out.append(handle)
        return out

    def _report(self, handle: ChildHandle) -> dict[str, Any]:
        entry: dict[str, Any] = {"child_id": handle.child_id, "role": handle.role}
        terminal = handle.last_terminal
        if not handle.settled or terminal is None:
            entry["status"] = "running"
            return entry
        self._reported[handle.child_id] = terminal.uuid
        if handle.terminated:
            # Creo: an aborted child is done, whatever its last turn said
            # (an idle one keeps its result).
            entry.update(status="done", message=normalise(terminal)[1])
        elif isinstance(terminal, InputRequired):
            entry.update(status="idle", message=terminal.question, waiting_for="input")
        elif isinstance(terminal, Done):
            entry.update(status="idle", message=normalise(terminal)[1])
        elif isinstance(terminal, Failed) and terminal.reason == "aborted":
            entry.update(status="done", message=normalise(terminal)[1])
        else:
            entry.update(status="failed", message=normalise(terminal)[1])
        entry["message"] = truncate_to_budget(entry["message"])
        return entry

    # -- messages, abort, stop ------------------------------------------------------

    async def send_message(self, child_id: str, text: str) -> dict[str, Any]:
        """Deliver `text` once (see the module docstring); `mode` says whether
        the running turn took it (`steer`) or it opened a turn (`turn`). The
        child's transcript holds it when this returns. `ControlError` for a
        terminated child."""
        handle = await self._child(child_id)
        mode = await handle.steer(text)
        return {"child_id": child_id, "delivered": True, "mode": mode}

    async def agent_abort(self, targets: Sequence[str]) -> dict[str, list[str]]:
        """Abort children named by id or role, running or idle: each ends for
        good (see `terminate`). Which are aborted, which names are unknown."""
        aborted: list[str] = []
        unknown: list[str] = []
        for target in targets:
            handles = self._matching(target, live=True)
            if not handles and not self._matching(target):
                unknown.append(target)
            for handle in handles:
                await self.terminate(handle)
                aborted.append(handle.child_id)
        return {"aborted": aborted, "unknown": unknown}

    async def terminate(self, handle: ChildHandle) -> bool:
        """End a child for good: a running or waiting turn ends aborted, and
        it refuses messages until `resume`; recorded, so a restart keeps it.
        True when a turn was stopped."""
        first = not handle.terminated
        # The handle refuses input from the start of `terminate`, before
        # anything awaits; the record follows.
        stopped = await handle.terminate()
        if first:
            await self.session.store.append_event(
                self.session.id,
                RecordKind.CONTROL,
                {"action": "terminate"},
                child_id=handle.child_id,
            )
        return stopped

    async def resume(self, child_id: str) -> dict[str, Any]:
        """Undo a stop: a terminated child takes messages again, a paused one
        runs on. Which of the two it was."""
        handle = await self._child(child_id)
        reinstated = handle.reinstate()
        if reinstated:
            await self.session.store.append_event(
                self.session.id, RecordKind.CONTROL, {"action": "reinstate"}, child_id=child_id
            )
        was_paused = handle.paused
        if was_paused:
            await handle.resume()
        return {"child_id": child_id, "reinstated": reinstated, "resumed": was_paused}

    async def stop_children(self) -> int:
        """Stop every descendant of this parent for good (see `terminate`);
        how many had a turn running or waiting for input."""
        stopped = 0
        for handle in self._descendants():
            if await self.terminate(handle):
                stopped += 1
        return stopped

    def _descendants(self) -> list[ChildHandle]:
        everyone = list(self.session.children.values())
        parents = {self.parent_id}
        found: list[ChildHandle] = []
        grew = True
        while grew:
            grew = False
            for handle in everyone:
                if handle.parent_id in parents and handle not in found:
                    found.append(handle)
                    parents.add(handle.child_id)
                    grew = True
        # Deepest first, so grandchildren stop before the children waiting on them.
        return sorted(found, key=lambda h: -h.depth)

    async def result(self, child_id: str) -> str:
        """The child's full last result (not cut to the budget)."""
        handle = await self._child(child_id)
        record = await self.session.store.get_child(handle.child_id)
        return record.result if record is not None else ""

    # -- delivery -----------------------------------------------------------------

    async def _on_event(self, handle: ChildHandle, event: ChildEvent) -> None:
        if handle.parent_id != self.parent_id:
            return
        if isinstance(event, Done | Failed) and self._delivered.get(handle.child_id) != event.uuid:
            await self._deliver(handle, event)
        self._notify()

    async def _deliver(self, handle: ChildHandle, event: Done | Failed) -> None:
        # The watcher and a waiter (`wait_agent`, COLLECT) may both come to
        # deliver a result: the second waits for the first, hooks included,
        # so a waiter returns only once the delivery is over.
        running = self._delivering.get(event.uuid)
        if running is not None:
            await running.wait()
            return
        done = self._delivering[event.uuid] = anyio.Event()
        try:
            await self._deliver_once(handle, event)
        finally:
            del self._delivering[event.uuid]
            done.set()

    async def _deliver_once(self, handle: ChildHandle, event: Done | Failed) -> None:
        status, payload = normalise(event)
        # The child's turn is stored by now (the store before anyone is
        # told), so its subtree total includes this turn.
        usage = (await self.session.store.subtree_usage(self.session.id)).get(handle.child_id)
        text = render_final_answer(self.task_name, handle.child_id, payload, usage)
        # Named after the result it carries: delivering the same result again
        # (another plane, a restart) is recognised by the store and the inbox.
        uuid = uuidlib.uuid5(_DELIVERY, event.uuid).hex
        # The parent's transcript first: once this is stored the result
        # survives a crash even if the inbox below never sees it.
        stored = await self.session.store.append_event(
            self.session.id,
            RecordKind.SUBAGENT_RESULT,
            {
                "child_id": handle.child_id,
                "role": handle.role,
                "status": status,
                "text": text,
            },
            child_id=self.parent_id or None,
            uuid=uuid,
        )
        if stored is not None and self.inbox is not None:
            self.inbox.deliver(uuid, text)
        self._delivered[handle.child_id] = event.uuid
        self._notify()
        if stored is None:
            return  # delivered before: its hooks ran then
        await self.hooks.notify(
            "complete",
            CompleteInfo(
                session_id=self.session.id,
                parent_id=self.parent_id,
                child_id=handle.child_id,
                role=handle.role,
                status=status,
                reason=event.reason if isinstance(event, Failed) else "",
                result=event.text if isinstance(event, Done) else event.message,
            ),
        )

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _tools_for_child(self, child_id: str, depth: int) -> Mapping[str, Tool]:
        """A local child's own control tools, while the depth limit allows."""
        if depth >= self.max_depth:
            return {}
        plane = ControlPlane(
            self.session,
            parent_id=child_id,
            depth=depth,
            max_concurrent=self.max_concurrent,
            max_depth=self.max_depth,
            hooks=self.hooks,
            wait_bounds_ms=self.wait_bounds_ms,
            model_names=self.model_names,
        )
        # The session binds its inbox to the child's conversation once open.
        self.session.nested_planes[child_id] = plane
        return control_tools(plane)


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)


_AGENT_ITEM = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "description": "Agent name or role, e.g. coder."},
        "prompt": {"type": "string", "description": "The task for this child."},
        "model": {"type": "string", "description": "Only if a specific model is required."},
        "tools": {
            "type": "array",
            "items": {"type": "string"},
            "description": "A subset of the role's tools.",
        },
        "system_prompt": {"type": "string", "description": "Replaces the role's prompt."},
    },
    "required": ["role", "prompt"],
}


def _tool(
    name: str,
    description: str,
    properties: dict[str, Any],
    required: list[str],
    call: Callable[[dict[str, Any]], Awaitable[Any]],
) -> Tool:
    parameters = {"type": "object", "properties": properties, "required": required}
    return as_tool(name, description, parameters, call)


def control_tools(plane: ControlPlane) -> dict[str, Tool]:
    """The control-plane operations as tools for a parent's model."""

    async def spawn_agent(args: dict[str, Any]) -> Any:
        handle = await plane.spawn_agent(
            str(args["name"]),
            str(args["prompt"]),
            model=args.get("model"),
            system_prompt=args.get("system_prompt"),
        )
        return {"child_id": handle.child_id, "role": handle.role}

    tools = [
        _tool(
            "agent",
            "Start one or more sub-agents at once. Returns immediately with their "
            "child ids; their results arrive in your context when they finish.",
            {"agents": {"type": "array", "items": _AGENT_ITEM}},
            ["agents"],
            lambda a: plane.agent(a["agents"]),
        ),
        _tool(
            "agent_manage",
            "Optionally send messages to children ({role or child_id: text}), then "
            "wait until a child finishes a turn; returns every child's status, with "
            "the message of those that are idle (a result or a question).",
            {"messages": {"type": "object", "additionalProperties": {"type": "string"}}},
            [],
            lambda a: plane.agent_manage(a.get("messages")),
        ),
        _tool(
            "wait_agent",
            "Wait for one child to finish, only when its result blocks your next step. "
            "timeout_ms is clamped to [10000, 3600000] (default 30000). Returns "
            "completed, failed or timeout; a timeout does not stop the child.",
            {"child_id": {"type": "string"}, "timeout_ms": {"type": "integer"}},
            ["child_id"],
            lambda a: plane.wait_agent(str(a["child_id"]), a.get("timeout_ms")),
        ),
        _tool(
            "send_message",
            "Send a message to a child: a running child reads it at its next step, "
            "an idle one (or one whose turn just ended) starts a new turn with it. "
            "An aborted child takes no messages.",
            {"child_id": {"type": "string"}, "text": {"type": "string"}},
            ["child_id", "text"],
            lambda a: plane.send_message(str(a["child_id"]), str(a["text"])),
        ),
        _tool(
            "agent_abort",
            "Abort children, named by child id or role, running or idle: they stop "
            "for good and take no more messages.",
            {"abort": {"type": "array", "items": {"type": "string"}}},
            ["abort"],
            lambda a: plane.agent_abort([str(t) for t in a["abort"]]),
        ),
        _tool(
            "spawn_agent",
            "Start one sub-agent (name = agent or role). Returns its child id at once.",
            {
                "name": {"type": "string"},
                "prompt": {"type": "string"},
                "model": {"type": "string"},
                "system_prompt": {"type": "string"},
            },
            ["name", "prompt"],
            spawn_agent,
        ),
    ]
    return {tool.name: tool for tool in tools}
