"""Inject templates are contained: any failure is recorded and the next
subscription still runs; output, values and work are bounded.

Rendering happens in the parent's process whatever the child's transport, so
the supervision scenarios here run local children only.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.sessions import session_for

from a2a_orchestrator.control.plane import ControlPlane
from a2a_orchestrator.control.reactions import Reactions, load_reactions
from a2a_orchestrator.control.supervisor import Supervisor
from a2a_orchestrator.errors import ControlError
from a2a_orchestrator.runtime.selectors import render_inject
from a2a_orchestrator.runtime.templates import INJECT_CUT, INJECT_LIMIT

EVENT = {"kind": "tool_result", "tool": "run_command", "success": False, "content": "boom " * 2000}

HOSTILE = {
    "range": "{{ range(10**9) }}",
    "range-list": "{{ range(10**6)|list|length }}",
    "divide": "{{ 1 / 0 }}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "str-times": "{{ 'x' * 10**9 }}",
    "list-times": "{{ ['x'] * 10**9 }}",
    "power": "{{ 10 ** (10 ** 10) }}",
    "squaring": "{% set n = namespace(x=3) %}{% for i in range(40) %}"
    "{% set n.x = n.x * n.x %}{% endfor %}{{ n.x }}",
    "concat-doubling": "{% set n = namespace(s='x') %}{% for i in range(40) %}"
    "{% set n.s = n.s ~ n.s %}{% endfor %}{{ n.s }}",
    "plus-doubling": "{% set n = namespace(s='x') %}{% for i in range(40) %}"
    "{% set n.s = n.s + n.s %}{% endfor %}{{ n.s }}",
    "nested-loops": "{% for a in range(10000) %}{% for b in range(10000) %}"
    "{% endfor %}{% endfor %}",
    "loops-over-content": "{% for a in event.content %}{% for b in event.content %}"
    "{% endfor %}{% endfor %}",
    "slices-in-a-loop": "{% for i in range(10000) %}{{ event.content[::-1]|length }}{% endfor %}",
    "replace-filter": "{{ ('x' * 60000)|replace('x', 'y' * 60000) }}",
    "replace-method": "{{ ('x' * 60000).replace('x', 'y' * 60000) }}",
    "join-method": "{{ ('x' * 60000).join(['a'] * 60000) }}",
    "join-filter": "{{ (['a'] * 60000)|join('x' * 60000) }}",
    "center": "{{ 'x'|center(10**9) }}",
    "ljust": "{{ 'x'.ljust(10**9) }}",
    "percent-width": "{{ '%01000000000d' % 1 }}",
    "percent-star": "{{ '%*d' % (10**9, 1) }}",
    "format-width": "{{ '{:>1000000000}'.format(1) }}",
    "format-nested": "{{ '{:{}}'.format('x', 10**9) }}",
    "format-filter": "{{ '%01000000000d'|format(1) }}",
    "indent": "{{ ('x\n' * 30000)|indent('y' * 60000) }}",
    "wordwrap": "{{ event.content|wordwrap(1, wrapstring='x' * 60000) }}",
    "expandtabs": "{{ ('x\t' * 30000).expandtabs(200000) }}",
    "slice": "{{ [1]|slice(10**9)|list }}",
    "unsafe": "{{ event.content.__class__.__mro__ }}",
}


@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_template_fails_cleanly_and_cheaply(template: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ControlError, match=r"^inject template: "):
            render_inject(template, EVENT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Refused before the value is built, not after: a few MB at most (each
    # of these would otherwise allocate from 1 GB to an exabyte, or loop for
    # hours; the work budget stops those, the suite's timeout backs it up).
    assert peak < 8 * 1024 * 1024


def test_output_is_cut_at_64_kib_while_streaming() -> None:
    tracemalloc.start()
    try:
        text = render_inject("{% for i in range(10000) %}{{ 'é' * 60000 }}{% endfor %}", EVENT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert text.endswith(INJECT_CUT)
    assert INJECT_LIMIT - 8 <= len(text.encode()) <= INJECT_LIMIT
    assert set(text[: -len(INJECT_CUT)]) == {"é"}  # cut on a character boundary
    # 10 000 chunks of 120 kB each (1.2 GB in all) were never rendered whole.
    assert peak < 8 * 1024 * 1024


def test_ordinary_templates_still_work() -> None:
    template = (
        "{{ event.tool }} failed ({{ event.success }}): {{ event.content|truncate(14) }} "
        "{{ '%d' % 123456789012 }} {{ '{:,}'.format(123456789) }} {{ event.missing.deeper }}"
        "{% for word in event.content.split()[:3] %}[{{ loop.index }}]{% endfor %}"
        "{{ (event.content ~ '!')|length }}"
    )
    assert render_inject(template, EVENT) == (
        "run_command failed (False): boom boom... 123456789012 123,456,789 [1][2][3]10001"
    )
    # A long event is not itself the template's fault: content as large as
    # a tool's whole output passes through, cut only at the output limit.
    long = render_inject("{{ event.content }}", {"content": "y" * 200_000})
    assert long.endswith(INJECT_CUT) and len(long.encode()) <= INJECT_LIMIT


def coder(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A child that fails a command, then answers."""
    if not any(m["role"] == "tool" for m in messages):
        return {"tool_calls": [{"name": "run_command", "arguments": {"command": "exit 3"}}]}
    return {"text": "gave up"}


@pytest.mark.anyio
async def test_a_failing_subscription_is_recorded_and_the_next_one_runs(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with session_for("local", tmp_path, coder) as session:
            inbox: list[str] = []

            class Inbox:
                def steer(self, text: str) -> None:
                    inbox.append(text)

                def deliver(self, uuid: str, text: str) -> bool:
                    return True

            plane = ControlPlane(session, inbox=Inbox())  # type: ignore[arg-type]
            supervisor = Supervisor(plane)
            failure = {"kind": "tool_result", "success": False}
            # Both render on an empty event (subscribe checks that) and fail on a real one.
            overflow = await supervisor.subscribe(
                inject="{% if event.kind %}{{ range(10**9) }}{% endif %}", event=failure
            )
            divide = await supervisor.subscribe(
                inject="{% if event.kind %}{{ 1 / 0 }}{% endif %}", event=failure
            )
            await supervisor.subscribe(inject="{{ event.tool }} failed", event=failure)
            handle = await plane.spawn_agent("coder", "run it")
            await handle.result()
            stored = await session.store.events(session.id)
            supervisor.close()
            plane.close()
    failed = {
        e.payload["subscription"]: e.payload["error"] for e in stored if e.kind == "inject_failed"
    }
    assert set(failed) == {overflow["id"], divide["id"]}
    assert "too large" in failed[overflow["id"]]
    assert "ZeroDivisionError" in failed[divide["id"]]
    assert inbox == ["run_command failed"]
    assert [e.payload["text"] for e in stored if e.kind == "inject"] == ["run_command failed"]


@pytest.mark.anyio
async def test_a_failing_reaction_is_recorded_and_the_next_one_runs(tmp_path: Path) -> None:
    rules = tmp_path / "reactions.toml"
    rules.write_text(
        "[[reaction]]\n"
        'event = { kind = "tool_result", success = false }\n'
        "inject = \"{% if event.kind %}{{ 'x' * 10**9 }}{% endif %}\"\n"
        "\n"
        "[[reaction]]\n"
        'event = { kind = "tool_result", success = false }\n'
        'inject = "{{ event.role }} failed: {{ event.tool }}"\n'
    )
    with anyio.fail_after(30):
        async with session_for("local", tmp_path, coder) as session:
            plane = ControlPlane(session)
            reactions = Reactions(plane, load_reactions(rules))
            handle = await plane.spawn_agent("coder", "run it")
            await handle.result()
            stored = await session.store.events(session.id)
            reactions.close()
            plane.close()
    failed = [e.payload for e in stored if e.kind == "inject_failed"]
    assert len(failed) == 1 and failed[0]["reaction"].endswith("reactions.toml: reaction 1")
    assert "would make a value of 1000000000" in failed[0]["error"]
    assert [e.payload["text"] for e in stored if e.kind == "inject"] == [
        "coder failed: run_command"
    ]
