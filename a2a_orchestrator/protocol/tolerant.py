"""The tolerant reader's byte-level part: peers' JSON fixed before the SDK parses it.

Some stock A2A agents write timestamps with no UTC offset
(`"timestamp": "2026-01-05T10:00:00.123456"`, fasta2a 0.6 and 2.x), which
a2a-sdk's parser refuses (`Failed to parse timestamp field`), for a whole
response or stream frame. `tolerate_naive_timestamps` adds an httpx
response hook that reads such a timestamp as UTC (appends `Z`) in JSON and
server-sent-event bodies, as they stream, before the SDK sees them. It is a
byte substitution on the `timestamp` key only: a response without one is
passed on unchanged, and nothing is parsed twice.

Each tolerance is logged once per peer, at debug level (`wire.note_once`).

A line is held until it ends (a timestamp never spans lines), at most
`MAX_LINE` bytes: a peer sending more without a newline gets its response
refused (`httpx.DecodingError`) rather than held in memory without bound.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx

from .wire import note_once

__all__ = ["MAX_LINE", "tolerate_naive_timestamps"]

MAX_LINE = 16 * 1024 * 1024
"""Bytes of one line (a JSON body, an SSE data line) held to be rewritten."""


# A JSON "timestamp" whose date-time ends right after its seconds (and
# fraction): no `Z`, no `+hh:mm`.
_NAIVE = re.compile(rb'("timestamp"\s*:\s*"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)"')
_READ_AS_UTC = rb'\1Z"'
_TEXT_TYPES = ("application/json", "text/event-stream")


def _fix(data: bytes, peer: str) -> bytes:
    if b'"timestamp"' not in data:
        return data
    fixed, count = _NAIVE.subn(_READ_AS_UTC, data)
    if count:
        note_once(peer, "timestamp without a UTC offset read as UTC")
    return fixed


class _FixedStream(httpx.AsyncByteStream):
    """A response body rewritten line by line (a JSON body, or SSE frames)."""

    def __init__(self, stream: httpx.AsyncByteStream, peer: str) -> None:
        self._stream = stream
        self._peer = peer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        # The unfinished line's chunks, joined once it ends: each byte is
        # copied and searched a bounded number of times, however long the line.
        pending: list[bytes] = []
        held = 0
        async for chunk in self._stream:
            # A timestamp never spans lines: rewrite what is up to the last
            # newline, keep the rest until its line ends.
            cut = chunk.rfind(b"\n") + 1
            if cut:
                pending.append(chunk[:cut])
                yield _fix(b"".join(pending), self._peer)
                pending, held = [chunk[cut:]], len(chunk) - cut
            else:
                pending.append(chunk)
                held += len(chunk)
            if held > MAX_LINE:
                raise httpx.DecodingError(
                    f"{self._peer} sent a line longer than {MAX_LINE} bytes; not read further"
                )
        if held:
            yield _fix(b"".join(pending), self._peer)

    async def aclose(self) -> None:
        await self._stream.aclose()


async def _response_hook(response: httpx.Response) -> None:
    kind = response.headers.get("content-type", "")
    if not kind.startswith(_TEXT_TYPES) or not isinstance(response.stream, httpx.AsyncByteStream):
        return
    if response.headers.get("content-encoding", "identity") != "identity":
        return  # compressed bytes: no peer we know both compresses and writes naive times
    # Lengths change with the bytes: httpx reads the body to its end anyway.
    response.headers.pop("content-length", None)
    peer = f"{response.request.url.scheme}://{response.request.url.netloc.decode()}"
    response.stream = _FixedStream(response.stream, peer)


def tolerate_naive_timestamps(http: httpx.AsyncClient) -> None:
    """Add the response hook to `http` (once)."""
    hooks = http.event_hooks
    if _response_hook not in hooks.get("response", []):
        http.event_hooks = {**hooks, "response": [*hooks.get("response", []), _response_hook]}
