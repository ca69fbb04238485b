"""What a role server's task store spends saving one long task, frame by frame.

    python bench/taskstore.py [--rounds 5] [--frames 2000] [--quick]

One task grows the way a2a-sdk's TaskManager grows it: each frame is a
status update whose message the previous frame's message is moved out of
into `task.history`, and the same Task object is saved after every frame
(`SQLiteTaskStore.save`, a real SQLite file). The frames alternate a tool
call and its result (a child making one tool call after another), so the
role server's settings write every other frame at once (`write_at_once`:
a tool's result) and hold the calls (`FRAME_WRITE_DELAY`); the other
variant writes every frame (`coalesce=0`). Variants interleaved in rounds;
the time spent inside `save` only (building the frames is the SDK's work):
wall and CPU (process time) for all the frames, min and median over the
rounds, and per frame over the last tenth of the frames (where the history
is longest: a store that saves the whole task pays most there). Then a
`get` of the finished task from memory and from the reopened file.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio
from a2a.auth.user import UnauthenticatedUser
from a2a.helpers import new_text_message
from a2a.server.context import ServerCallContext
from a2a.types import Role, Task, TaskState, TaskStatus
from benchkit import machine_line, min_median

from a2a_orchestrator.protocol.wire import EVENT_KEY, write_at_once
from a2a_orchestrator.server.app import FRAME_WRITE_DELAY
from a2a_orchestrator.storage.tasks.sqlite import SQLiteTaskStore

CONTEXT = ServerCallContext(user=UnauthenticatedUser())


def next_frame(task: Task, index: int) -> None:
    """The SDK's step for one status update: the previous status message
    joins the history, the new one becomes the status."""
    kind = "tool_result" if index % 2 else "tool_called"
    text = '{"output": "' + "x" * 200 + '"}' if index % 2 else '{"path": "src/main.py"}'
    message = new_text_message(text, role=Role.ROLE_AGENT, task_id=task.id)
    message.metadata.update({EVENT_KEY: kind, "callId": f"call-{index // 2}"})
    if task.status.HasField("message"):
        task.history.append(task.status.message)
    task.status.message.CopyFrom(message)
    task.status.timestamp.GetCurrentTime()


async def run(path: Path, frames: int, coalesced: bool) -> tuple[float, float, float, Task]:
    """(wall, cpu) inside `save` for all frames, wall per frame over the last
    tenth, and the finished task."""
    if coalesced:
        store = SQLiteTaskStore(path, coalesce=FRAME_WRITE_DELAY, write_now=write_at_once)
    else:
        store = SQLiteTaskStore(path)
    task = Task(id="t", context_id="c", status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
    task.history.append(new_text_message("make 1,000 tool calls", role=Role.ROLE_USER))
    await store.save(task, CONTEXT)
    task.status.state = TaskState.TASK_STATE_WORKING
    wall = cpu = tail = 0.0
    tail_from = frames - max(1, frames // 10)
    for index in range(frames):
        next_frame(task, index)
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        await store.save(task, CONTEXT)
        spent = time.perf_counter() - wall_start
        wall += spent
        cpu += time.process_time() - cpu_start
        if index >= tail_from:
            tail += spent
    task.status.state = TaskState.TASK_STATE_COMPLETED
    await store.save(task, CONTEXT)
    store.close()
    return wall, cpu, tail / (frames - tail_from), task


async def gets(path: Path, task: Task) -> tuple[float, float]:
    """Seconds for a `get` of `task` from memory (just saved), and from the file."""
    store = SQLiteTaskStore(path)
    working = Task()
    working.CopyFrom(task)
    working.id = "live"
    working.status.state = TaskState.TASK_STATE_WORKING
    await store.save(working, CONTEXT)
    start = time.perf_counter()
    got = await store.get("live", CONTEXT)
    memory = time.perf_counter() - start
    store.close()
    store = SQLiteTaskStore(path)
    start = time.perf_counter()
    again = await store.get("live", CONTEXT)
    from_file = time.perf_counter() - start
    store.close()
    if got != working or again != working:
        raise SystemExit("the store did not give the saved task back")
    return memory, from_file


async def main(rounds: int, frames: int) -> None:
    print(machine_line())
    variants = {
        "role server (results at once, calls held)": True,
        "every frame written": False,
    }
    walls: dict[str, list[float]] = {name: [] for name in variants}
    cpus: dict[str, list[float]] = {name: [] for name in variants}
    tails: dict[str, list[float]] = {name: [] for name in variants}
    memory: list[float] = []
    from_file: list[float] = []
    with tempfile.TemporaryDirectory() as work:
        for round_index in range(rounds):
            for name, coalesced in variants.items():
                path = Path(work) / f"{round_index}-{coalesced}.db"
                wall, cpu, tail, task = await run(path, frames, coalesced)
                walls[name].append(wall)
                cpus[name].append(cpu)
                tails[name].append(tail)
            got_memory, got_file = await gets(Path(work) / f"{round_index}-get.db", task)
            memory.append(got_memory)
            from_file.append(got_file)
    print(f"{frames} frames of one task, {rounds} rounds; time inside save:")
    for name in variants:
        wall_min, wall_median = min_median(walls[name])
        cpu_min, cpu_median = min_median(cpus[name])
        print(
            f"  {name:42} wall min {wall_min:.3f} s median {wall_median:.3f} s, "
            f"cpu min {cpu_min:.3f} s median {cpu_median:.3f} s, "
            f"per frame (last tenth) median {statistics.median(tails[name]) * 1e6:.0f} us"
        )
    print(
        f"get of the {frames + 1}-message task: from memory median "
        f"{statistics.median(memory) * 1e3:.2f} ms, from the file median "
        f"{statistics.median(from_file) * 1e3:.2f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 200 frames: smoke test")
    args = parser.parse_args()
    rounds, frames = (3, 200) if args.quick else (max(args.rounds, 5), args.frames)
    anyio.run(main, rounds, frames)
