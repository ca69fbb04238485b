"""The cost of sending whole numbers as integers (`numbers.IntegralNumbers`).

    python bench/integers.py [--rounds 7] [-n 2000] [--quick]

Frames as a role server sends them, built with the SDK's own serializer
(`MessageToDict`, then `json.dumps` as its SSE path and Starlette's
JSONResponse do): SSE events of a text delta (nothing to rewrite), a tool
result with 4 KB of output (nothing to rewrite, but more bytes to scan) and
a finished turn (usage and spend: rewritten), and the JSON answer to GetTask
for a task with 200 events in its history (rewritten). Each goes through a
minimal ASGI app that sends it, with and without the wrapper, interleaved in
rounds; CPU (process time) per frame, min and median over the rounds, the
difference being what the wrapper adds. Beside it, what the SDK spends
making the same frame (MessageToDict + json.dumps), for scale.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import anyio
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    Message,
    Role,
    StreamResponse,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from benchkit import machine_line, min_median
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage

from a2a_orchestrator.protocol.numbers import IntegralNumbers
from a2a_orchestrator.protocol.wire import EVENT_KEY, to_wire
from a2a_orchestrator.runtime.budgets import Spend
from a2a_orchestrator.runtime.events import Usage

SSE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
}
JSON_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"application/json"), (b"content-length", b"0")],
}


def message(meta: dict[str, Any], *parts: Any) -> Message:
    built = Message(message_id="m", role=Role.ROLE_AGENT, parts=list(parts))
    built.metadata.update(to_wire(meta))
    return built


def done_meta() -> dict[str, Any]:
    usage = Usage(input_tokens=56_500, output_tokens=1_200)
    spent = Spend(input_tokens=56_500, output_tokens=1_200, model_calls=12, seconds=4.2, cost=0.2)
    return {EVENT_KEY: "done", "usage": usage.as_dict(), "spent": spent.as_dict()}


def status_frame(update_message: Message, state: TaskState) -> ProtoMessage:
    update = TaskStatusUpdateEvent(
        task_id="t", context_id="c", status=TaskStatus(state=state, message=update_message)
    )
    return StreamResponse(status_update=update)


def frames() -> dict[str, tuple[ProtoMessage, bool]]:
    """Name: (the protobuf the SDK turns into JSON, whether it is an SSE event)."""
    working = TaskState.TASK_STATE_WORKING
    delta = message({EVENT_KEY: "message_delta"}, new_text_part("a few words of the answer"))
    output = {"callId": "c1", "tool": "read_file", "output": "x = 1\n" * 700, "success": True}
    result = message({EVENT_KEY: "tool_result"}, new_data_part(output))
    done = message(done_meta(), new_text_part("TASK_DONE"))
    history = [
        message({EVENT_KEY: "tool_called"}, new_data_part({"callId": str(i), "n": i, "k": 2}))
        for i in range(200)
    ]
    task = Task(
        id="t",
        context_id="c",
        history=history,
        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=done),
    )
    return {
        "text delta (SSE)": (status_frame(delta, working), True),
        "4 KB tool result (SSE)": (status_frame(result, working), True),
        "finished turn (SSE)": (status_frame(done, TaskState.TASK_STATE_COMPLETED), True),
        "GetTask, 200 events (JSON)": (task, False),
    }


def sdk_bytes(frame: ProtoMessage, sse: bool) -> bytes:
    document = {"jsonrpc": "2.0", "id": 1, "result": MessageToDict(frame)}
    if sse:
        return b"data: " + json.dumps(document, ensure_ascii=False).encode() + b"\r\n\r\n"
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def app_sending(body: bytes, sse: bool, count: int) -> Callable[..., Any]:
    """An ASGI app sending `body` `count` times as SSE events, or once as JSON."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if sse:
            await send(SSE_START)
            for _ in range(count):
                await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send(JSON_START)
            await send({"type": "http.response.body", "body": body, "more_body": False})

    return app


async def per_frame(app: Callable[..., Any], sse: bool, count: int) -> float:
    """CPU seconds per frame sent through `app`."""

    async def nowhere(message: Any) -> None:
        pass

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    calls = 1 if sse else count
    started = time.process_time()
    for _ in range(calls):
        await app({"type": "http"}, receive, nowhere)
    return (time.process_time() - started) / count


async def main(rounds: int, count: int) -> None:
    print(f"whole numbers as integers, {rounds} rounds of {count} frames; {machine_line()}")
    built = {name: (frame, sse, sdk_bytes(frame, sse)) for name, (frame, sse) in frames().items()}
    samples: dict[str, dict[str, list[float]]] = {
        name: {"bare": [], "wrapped": [], "sdk": []} for name in built
    }
    for _ in range(rounds):
        for name, (frame, sse, body) in built.items():
            bare = app_sending(body, sse, count)
            samples[name]["bare"].append(await per_frame(bare, sse, count))
            samples[name]["wrapped"].append(await per_frame(IntegralNumbers(bare), sse, count))
            started = time.process_time()
            for _ in range(count):
                sdk_bytes(frame, sse)
            samples[name]["sdk"].append((time.process_time() - started) / count)
    for name, (_, _, body) in built.items():
        bare_min, bare_median = min_median(samples[name]["bare"])
        wrapped_min, wrapped_median = min_median(samples[name]["wrapped"])
        _, sdk_median = min_median(samples[name]["sdk"])
        added_min, added_median = wrapped_min - bare_min, wrapped_median - bare_median
        print(
            f"{name:28} {len(body):7,} bytes  added cpu per frame min {added_min * 1e6:8.1f} us"
            f"  median {added_median * 1e6:8.1f} us  (SDK making it {sdk_median * 1e6:8.1f} us)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("-n", type=int, default=2000, help="frames per variant and round")
    parser.add_argument("--quick", action="store_true", help="a small run (tests)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.n = 2, 50
    anyio.run(main, args.rounds, args.n)
