"""The control plane: a parent's operations over its children.

The seeds' semantics over the one delegation interface, so every operation
works the same on local and remote children:

- `agent([...])` spawns one or many and answers at once (Creo);
  `spawn_agent(...)` spawns one and raises on refusal (TypeScript agent).
- `agent_manage(messages)`: RESUME -> MESSAGES -> CHECK -> BLOCK -> COLLECT.
- `wait_agent(child_id, timeout_ms)`: completed / failed / timeout, only once
  the result is delivered to the parent; a timeout leaves the child running.
- `send_message(child_id, text)`: the recipient's transcript first, then its
  inbox (absorbed at its next step boundary; an idle child starts a turn).
- `agent_abort([...])`, `stop_children()` (cascading, returns the count).
- A concurrency gate per parent and hooks (spawn.before may deny).

Delivery contract (TS seed: "transcript first, then mailbox"): when a child's
turn ends done or failed, its result is already stored with the child; the
rendered FINAL_ANSWER is appended to the parent's transcript in the store,
then offered to the parent's inbox (de-duplicated by uuid there), then marked
delivered, which is what `wait_agent` waits for; the `complete` hook runs last.
"""

from __future__ import annotations

import json
import math
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from .delegation import ChildConfig, ChildHandle
from .errors import OrchestratorError, SpawnRefusedError, UnknownChildError
from .events import ChildEvent, Done, Failed, InputRequired
from .hooks import CompleteInfo, Hooks, SpawnInfo
from .render import normalise, render_final_answer, truncate_to_budget
from .runtime import Conversation
from .session import Session
from .tools import Tool

__all__ = [
    "DEFAULT_MAX_CONCURRENT",
    "DEFAULT_MAX_DEPTH",
    "GATE_MESSAGE",
    "WAIT_BOUNDS_MS",
    "ControlPlane",
    "clamp_timeout",
]

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
    ) -> None:
        self.session = session
        self.parent_id = parent_id
        self.depth = depth
        self.max_concurrent = max_concurrent
        self.max_depth = max_depth
        self.hooks = hooks or Hooks()
        self.inbox = inbox
        self.wait_bounds_ms = wait_bounds_ms
        self._delivered: dict[str, str] = {}
        self._reported: dict[str, str] = {}
        self._changed = anyio.Event()
        self._reserved = 0
        self._remove_listener = session.add_listener(self._on_event)
        # A turn's end wakes waiters once the child is idle, after every
        # listener of its terminal event has run.
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

    def _matching(self, target: str) -> list[ChildHandle]:
        """Children named by id, else by role or agent name."""
        mine = self.children()
        by_id = [h for h in mine if h.child_id == target]
        return by_id or [h for h in mine if target in (h.role, h.agent)]

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
        """Spawn one child; `SpawnRefusedError` when a hook or the gate says no."""
        return await self._spawn(role, prompt, model, system_prompt, tools, config)

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
                await handle.send(text)
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
        if isinstance(terminal, InputRequired):
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
        """The recipient's transcript first (only if it exists), then its inbox."""
        handle = await self._child(child_id)
        mode = "steer" if handle.running else "turn"
        if mode == "steer":
            await self.session.store.append_event(
                self.session.id, "steer", {"text": text}, child_id=child_id
            )
        # An idle child takes the message as a new turn, which the session
        # records as that turn's input.
        await handle.steer(text)
        return {"child_id": child_id, "delivered": True, "mode": mode}

    async def agent_abort(self, targets: Sequence[str]) -> dict[str, list[str]]:
        """Abort children named by id or role; which were aborted, which unknown."""
        aborted: list[str] = []
        unknown: list[str] = []
        for target in targets:
            handles = self._matching(target)
            if not handles:
                unknown.append(target)
            for handle in handles:
                if await handle.cancel():
                    aborted.append(handle.child_id)
        return {"aborted": aborted, "unknown": unknown}

    async def stop_children(self) -> int:
        """Stop every running descendant of this parent; how many were stopped."""
        stopped = 0
        for handle in self._descendants():
            if await handle.cancel():
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
        if isinstance(event, Done | Failed):
            await self._deliver(handle, event)
        self._notify()

    async def _deliver(self, handle: ChildHandle, event: Done | Failed) -> None:
        status, payload = normalise(event)
        text = render_final_answer(self.task_name, handle.child_id, payload)
        # Named after the result it carries: delivering the same result again
        # (another plane, a restart) is recognised by the store and the inbox.
        uuid = uuidlib.uuid5(_DELIVERY, event.uuid).hex
        # The parent's transcript first: once this is stored the result
        # survives a crash even if the inbox below never sees it.
        stored = await self.session.store.append_event(
            self.session.id,
            "subagent_result",
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
        from .parent import control_tools

        plane = ControlPlane(
            self.session,
            parent_id=child_id,
            depth=depth,
            max_concurrent=self.max_concurrent,
            max_depth=self.max_depth,
            hooks=self.hooks,
            wait_bounds_ms=self.wait_bounds_ms,
        )
        # The session binds its inbox to the child's conversation once open.
        self.session.nested_planes[child_id] = plane
        return control_tools(plane)


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)
