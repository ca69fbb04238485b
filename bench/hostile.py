"""Hostile clients without a token against a role server process: trickled
request heads and one caller's pile of streams. Loopback only, bounded in
count and time; it stops by itself.

    python bench/hostile.py [--trickle 500] [--silent 1500] [--streams 100]
                            [--uploads 300] [--quick]

- trickle: `--trickle` connections each send a request line, then one header
  byte every 0.5 s, never ending the head; meanwhile the card is fetched
  every 0.2 s. Printed: when the server closed them (its head deadline,
  `serving.HEAD_TIMEOUT`), the card's latency, and the server's open file
  descriptors and memory before, during and after.
- silent: `--silent` connections that send nothing, past the server's cap
  on connections waiting for a head (`serving.MAX_PENDING_HEADS`): how many
  it closed at once (the longest waiting), and the card's latency.
- streams: one caller opens `--streams` SendStreamingMessage streams on a
  server started with `--max-streams-per-caller 32` (a slow scripted model
  keeps them open): how many were accepted, what the next one got, and the
  card's and GetTask's latency while they are held.
- uploads: `--uploads` connections each announce a 3.75 MiB body to
  `serve orchestrator`'s push webhook (`/a2a/push/x`) without its token and
  send 64 KiB of it: how many were refused before the rest was sent, and
  the server's memory before and while they are held; then the same to `/`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import anyio.abc
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import machine_line, rss_mib, start_servers, stop_servers

from a2a_orchestrator.server.serving import HEAD_TIMEOUT, MAX_PENDING_HEADS

CARD = "/.well-known/agent-card.json"
STREAM_CAP = 32
SLOW = {"delay": 60, "text": "late"}
TOKEN_ENV = "A2A_HOSTILE_BENCH_TOKEN"


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def card_latencies(url: str, seconds: float) -> list[float]:
    """Seconds each card request took, one every 0.2 s for `seconds`."""
    latencies: list[float] = []
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() < end:
            started = time.monotonic()
            answer = await http.get(url + CARD)
            answer.raise_for_status()
            latencies.append(time.monotonic() - started)
            await anyio.sleep(0.2)
    return latencies


def latency_line(name: str, latencies: list[float]) -> str:
    return (
        f"{name}: {len(latencies)} requests, median {statistics.median(latencies) * 1000:.1f} ms, "
        f"max {max(latencies) * 1000:.1f} ms"
    )


async def trickle(url: str, port: int, pid: int, count: int) -> None:
    closed_after: list[float] = []
    replies: list[bytes] = []
    fds_before, rss_before = open_fds(pid), rss_mib(pid)
    during: list[tuple[int, float]] = []
    started = time.monotonic()

    async def one() -> None:
        stream = await anyio.connect_tcp("127.0.0.1", port)
        reply = b""
        async with stream:
            try:
                await stream.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                with anyio.move_on_after(HEAD_TIMEOUT * 3):
                    while True:
                        await stream.send(b"X")
                        with anyio.move_on_after(0.5):
                            reply += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass
        closed_after.append(time.monotonic() - started)
        replies.append(reply)

    async def sample() -> None:
        await anyio.sleep(HEAD_TIMEOUT / 2)
        during.append((open_fds(pid), rss_mib(pid)))

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
        tg.start_soon(sample)
        latencies = await card_latencies(url, HEAD_TIMEOUT + 2)
    fds_after, rss_after = open_fds(pid), rss_mib(pid)
    timed_out = sum(reply.startswith(b"HTTP/1.1 408") for reply in replies)
    print(
        f"trickle: {count} connections, {timed_out} answered 408 and closed "
        f"{min(closed_after):.1f}-{max(closed_after):.1f} s after opening "
        f"(deadline {HEAD_TIMEOUT:g} s)"
    )
    print("  " + latency_line("card while trickling", latencies))
    fds_during, rss_during = during[0] if during else (0, 0.0)
    print(
        f"  server fds {fds_before} before, {fds_during} during, {fds_after} after; "
        f"RSS {rss_before:.0f} / {rss_during:.0f} / {rss_after:.0f} MiB"
    )


async def silent(url: str, port: int, count: int) -> None:
    streams: list[anyio.abc.SocketStream] = []
    try:
        for _ in range(count):
            streams.append(await anyio.connect_tcp("127.0.0.1", port))
        latencies = await card_latencies(url, 2)
        closed = 0

        async def check(stream: anyio.abc.SocketStream) -> None:
            nonlocal closed
            # All at once, well within the head deadline: only the cap closes them.
            with anyio.move_on_after(0.5):
                try:
                    if (await stream.receive()).startswith(b"HTTP/1.1 408"):
                        closed += 1
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    closed += 1

        async with anyio.create_task_group() as tg:
            for stream in streams:
                tg.start_soon(check, stream)
    finally:
        for stream in streams:
            await stream.aclose()
    print(
        f"silent: {count} connections sending nothing, {closed} closed at once "
        f"(cap {MAX_PENDING_HEADS} waiting for a head)"
    )
    print("  " + latency_line("card meanwhile", latencies))


def message() -> dict[str, object]:
    text = {"role": "ROLE_USER", "messageId": uuid.uuid4().hex, "parts": [{"text": "go"}]}
    return {"message": text}


async def streams(url: str, count: int) -> None:
    headers = {"A2A-Version": "1.0"}
    accepted = 0
    refusal = ""
    task_id = ""
    async with AsyncExitStack() as held, httpx.AsyncClient(timeout=30) as http:
        for _ in range(count):
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendStreamingMessage",
                "params": message(),
            }
            response = await held.enter_async_context(
                http.stream("POST", url, json=body, headers=headers)
            )
            if response.headers.get("content-type", "").startswith("application/json"):
                refusal = json.loads(await response.aread())["error"]["message"]
                break
            lines = response.aiter_lines()
            held.push_async_callback(lines.aclose)  # type: ignore[attr-defined]  # kept: dropping it closes the stream
            async for line in lines:
                if line.startswith("data:"):
                    task_id = task_id or json.loads(line[5:])["result"]["task"]["id"]
                    break
            accepted += 1
        latencies = await card_latencies(url, 2)
        get_times = []
        for _ in range(5):
            started = time.monotonic()
            body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}}
            (await http.post(url, json=body, headers=headers)).raise_for_status()
            get_times.append(time.monotonic() - started)
    print(f"streams: one caller asked for {count}, {accepted} accepted (cap {STREAM_CAP})")
    print(f"  the next: {refusal or 'accepted (no cap reached)'}")
    print("  " + latency_line("card while held", latencies))
    print("  " + latency_line("GetTask while held", get_times))


async def uploads(work: Path, count: int, path: str) -> None:
    # With auth on, so `/` refuses a body without a token too.
    os.environ[TOKEN_ENV] = uuid.uuid4().hex
    flags = ["--token-env", TOKEN_ENV]
    processes, urls = start_servers(1, work, [SLOW], role="orchestrator", flags=flags)
    try:
        port = int(urls[0].rsplit(":", 1)[1].strip("/"))
        pid = processes[0].pid
        rss_before = rss_mib(pid)
        size = 3 * 1024 * 1024 + 768 * 1024
        answered = 0
        connections: list[anyio.abc.SocketStream] = []

        async def one() -> None:
            nonlocal answered
            stream = await anyio.connect_tcp("127.0.0.1", port)
            connections.append(stream)
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
                + f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode()
            )
            try:
                await stream.send(head + b" " * 65536)
                with anyio.move_on_after(5):
                    if (await stream.receive()).startswith(b"HTTP/1.1 4"):
                        answered += 1
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                pass

        try:
            async with anyio.create_task_group() as tg:
                for _ in range(count):
                    tg.start_soon(one)
            rss_during = rss_mib(pid)
        finally:
            for stream in connections:
                await stream.aclose()
    finally:
        stop_servers(processes)
    print(
        f"uploads: {count} unauthenticated 3.75 MiB uploads to {path}, "
        f"{answered} refused before their body was sent"
    )
    print(f"  server RSS {rss_before:.0f} MiB before, {rss_during:.0f} MiB while held")


async def main(args: argparse.Namespace) -> None:
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        processes, urls = start_servers(
            1,
            work,
            [SLOW] * (args.streams + 8),
            role="architect",
            flags=["--max-streams-per-caller", str(STREAM_CAP)],
        )
        try:
            url = urls[0]
            port = int(url.rsplit(":", 1)[1].strip("/"))
            pid = processes[0].pid
            with anyio.fail_after(HEAD_TIMEOUT * 6 + 120):
                await trickle(url, port, pid, args.trickle)
                await silent(url, port, args.silent)
                await streams(url, args.streams)
        finally:
            stop_servers(processes)
        with anyio.fail_after(240):
            # The push webhook has a token of its own; / the callers' auth.
            for path in ("/a2a/push/x", "/"):
                await uploads(work, args.uploads, path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trickle", type=int, default=500)
    parser.add_argument("--silent", type=int, default=1500)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--uploads", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="a small run (tests)")
    args = parser.parse_args()
    if args.quick:
        args.trickle, args.silent, args.streams = 30, MAX_PENDING_HEADS + 20, STREAM_CAP + 2
        args.uploads = 20
    anyio.run(main, args)
