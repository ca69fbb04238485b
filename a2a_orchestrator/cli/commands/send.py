"""`send URL TEXT`: one message to any A2A agent, its task followed to the end.

The agent may be a role server, `serve orchestrator` or any other A2A
server: the card is read and the client made as the remote transport makes
its children's (`transports/remote.py`), and the task's stream is read back
into child events by the same decoder. What happens is printed as it
happens, a line per event (`--json`: one JSON object per line); a question
(INPUT_REQUIRED) is asked on the terminal and the answer sent as the task's
next message. The exit code is how the task ended (`SEND_EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from ...errors import OrchestratorError
from ..defaults import DEFAULT_TOKEN_ENV

if TYPE_CHECKING:
    from a2a.client import Client
    from a2a.types import StreamResponse

    from ...protocol.decoding import StreamDecoder

__all__ = ["CARD_SECONDS", "POLL_SECONDS", "SEND_EXIT_CODES", "add_parser", "send"]

SEND_EXIT_CODES = {
    "completed": 0,
    "failed": 1,
    "canceled": 4,
    "rejected": 5,
    "input-required": 6,
    "auth-refused": 7,
    "unreachable": 8,
    "protocol-error": 9,
}
"""`send`'s exit codes by how the task ended (2: bad usage, as every command).
`input-required`: the agent asked a question and no one could answer here
(no terminal, or `--no-input`); `auth-refused`: the agent refused the
credential (HTTP 401/403, or the task wants AUTH_REQUIRED); `unreachable`:
no connection, or no answer in time; `protocol-error`: the agent answered,
but not with a usable card or task."""


CARD_SECONDS = 15.0
"""How long the agent has to answer for its card. The client reads with no
limit (a task may work for long between two events), so without this a port
that accepts and answers nothing (a hung or stopped server) held `send` for
ever."""


POLL_SECONDS = 1.0
"""How often a task is read back once its stream ended before its turn did."""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """`send`'s parser, added to the CLI's subcommands."""
    codes = ", ".join(f"{name} {code}" for name, code in SEND_EXIT_CODES.items())
    parser: argparse.ArgumentParser = commands.add_parser(
        "send",
        help="send one message to any A2A agent and follow its task",
        description="Send TEXT to the A2A agent at URL (a role server, `serve orchestrator`, "
        "any A2A server), print what happens as it happens, answer its questions from the "
        f"terminal, and exit by how the task ended: {codes} (2: bad usage).",
    )
    parser.add_argument("url", metavar="URL", help="the agent's base URL (its card is read there)")
    parser.add_argument("text", metavar="TEXT", help="the message")
    parser.add_argument(
        "--token-env",
        default=None,
        metavar="NAME",
        help=f"environment variable holding the bearer token to send (e.g. {DEFAULT_TOKEN_ENV}; "
        "default: none is sent)",
    )
    parser.add_argument(
        "--context", default=None, metavar="ID", help="continue this context (a follow-up)"
    )
    parser.add_argument(
        "--task",
        default=None,
        metavar="ID",
        help="continue this task: the answer to its question (with --context when the agent "
        "needs it)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per line, for a program: it never asks (a question ends it, exit 6)",
    )
    parser.add_argument(
        "--no-input",
        action="store_true",
        help="never ask on the terminal: a question ends the command (exit 6)",
    )
    return parser


async def send(args: argparse.Namespace) -> int:
    import anyio
    import httpx
    from a2a.helpers import new_text_message
    from a2a.types import Role, SendMessageRequest

    from ...delegation.network import AgentSpec
    from ...delegation.transports.remote import RemoteDelegate
    from ...errors import AgentUnavailableError
    from ...protocol.decoding import StreamDecoder

    if not args.text.strip():
        raise OrchestratorError("TEXT is empty: say what to send")
    if not args.url.startswith(("http://", "https://")):
        raise OrchestratorError(f"URL {args.url!r}: give the agent's http:// or https:// address")
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise OrchestratorError(f"--token-env {args.token_env}: that variable is not set")
    out = _Output(json_lines=args.json)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # No read limit: a task may work for long between two events.
    timeout = httpx.Timeout(30.0, read=None)
    spec = AgentSpec(name="send", role="agent", url=args.url.rstrip("/"), token_env=args.token_env)
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as http:
        delegate = RemoteDelegate(http=http)
        try:
            with anyio.move_on_after(CARD_SECONDS) as scope:
                card = await delegate.card(spec)
            if scope.cancelled_caught:
                raise AgentUnavailableError(
                    f"agent at {spec.url} did not answer within {CARD_SECONDS:g} s"
                )
            client = delegate.streaming_client(spec, card)
            decoder = StreamDecoder(peer=spec.url or "")
            text, task_id, context_id = args.text, args.task or "", args.context or ""
            while True:
                message = new_text_message(text, role=Role.ROLE_USER)
                message.task_id, message.context_id = task_id, context_id
                decoder.new_turn()
                await _follow(client, SendMessageRequest(message=message), decoder, out, card.name)
                ending = _ending(decoder)
                task_id, context_id = decoder.task_id, decoder.context_id
                if ending != "input-required":
                    break
                answer = None if args.json else await _ask(args.no_input)
                if not answer:
                    break
                text = answer
        except OrchestratorError as exc:
            ending = _failure_kind(exc)
            print(f"error: {exc}", file=sys.stderr)
            task_id, context_id = "", ""
        finally:
            await delegate.aclose()
    out.ending(ending, task_id, context_id, args.url)
    return SEND_EXIT_CODES[ending]


async def _follow(
    client: Client,
    request: Any,
    decoder: StreamDecoder,
    out: _Output,
    agent: str,
) -> None:
    """Send `request` and print the task's events until its turn ends: from
    the stream, and then, when the stream ended first (an agent that does not
    stream answers at once with a task still working), from the task itself."""
    import anyio
    from a2a.types import GetTaskRequest

    from ...delegation.transports.client_errors import translated

    with translated(decoder.peer):
        async for response in client.send_message(request):
            _show_child_event(response, out)
            for event in decoder.decode(response):
                out.event(agent, event)
            if decoder.finished_turn:
                return
        while decoder.task_id and not decoder.finished_turn:
            await anyio.sleep(POLL_SECONDS)
            task = await client.get_task(GetTaskRequest(id=decoder.task_id))
            for event in decoder.decode_task(task):
                out.event(agent, event)


def _show_child_event(response: StreamResponse, out: _Output) -> None:
    """`serve orchestrator` reports its children's events as status messages
    naming the child (README: Calling the orchestrator); shown as they are."""
    from a2a.helpers import get_message_text

    from ...protocol.wire import EVENT_KEY, metadata_of

    if response.WhichOneof("payload") != "status_update":
        return
    status = response.status_update.status
    if not status.HasField("message"):
        return
    message = status.message
    if metadata_of(message).get(EVENT_KEY) != "child_event":
        return
    data = next((p.data for p in message.parts if p.HasField("data")), None)
    if out.json_lines:
        from google.protobuf.json_format import MessageToDict

        out.write({"child_event": MessageToDict(data) if data is not None else None})
    else:
        out.line(get_message_text(message))


def _ending(decoder: StreamDecoder) -> str:
    """How the turn ended, as a key of `SEND_EXIT_CODES`."""
    from a2a.types import TaskState

    return {
        TaskState.TASK_STATE_COMPLETED: "completed",
        TaskState.TASK_STATE_CANCELED: "canceled",
        TaskState.TASK_STATE_REJECTED: "rejected",
        TaskState.TASK_STATE_INPUT_REQUIRED: "input-required",
        TaskState.TASK_STATE_AUTH_REQUIRED: "auth-refused",
    }.get(decoder.state, "failed")


def _failure_kind(exc: OrchestratorError) -> str:
    """Which `SEND_EXIT_CODES` key a failure to reach or read the agent is."""
    import httpx

    from ...errors import AgentUnavailableError, DelegationTimeoutError

    cause = exc.__cause__
    while cause is not None and not isinstance(cause, httpx.HTTPStatusError):
        cause = cause.__cause__
    if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code in (401, 403):
        return "auth-refused"
    if isinstance(exc, AgentUnavailableError | DelegationTimeoutError):
        return "unreachable"
    return "protocol-error"


async def _ask(no_input: bool) -> str | None:
    """The person's answer to a question, read from the terminal; None when
    no one can be asked (`--no-input`, a pipe, CI; or output that goes to a
    file, where the question would not be seen) or input ended (Ctrl-D)."""
    from .asking import interactive, read_line

    if not interactive(no_input):
        return None
    print("answer> ", end="", flush=True)
    # Read on the event loop: a thread blocked in input() kept the process
    # alive after Ctrl-C until the next line.
    return (await read_line()).strip() or None


class _Output:
    """Lines for a person, or JSON objects for a program (`--json`). On a
    terminal an agent's message streams as it is written (its deltas); a log
    gets it whole, once."""

    def __init__(self, *, json_lines: bool) -> None:
        self.json_lines = json_lines
        self.live = not json_lines and sys.stdout.isatty()
        self._streaming = False
        """A message is being streamed onto the current line."""

    def _end_stream(self) -> None:
        if self._streaming:
            self._streaming = False
            print(flush=True)

    def write(self, data: dict[str, Any]) -> None:
        print(json.dumps(data), flush=True)

    def line(self, text: str) -> None:
        self._end_stream()
        print(text, flush=True)

    def event(self, agent: str, event: Any) -> None:
        from ...runtime.events import (
            AssistantMessage,
            Done,
            InputRequired,
            MessageDelta,
            event_to_dict,
        )
        from ...runtime.render import describe_event

        if isinstance(event, MessageDelta):
            if self.live:
                if not self._streaming:
                    print(f"[{agent}] says: ", end="")
                    self._streaming = True
                print(event.text, end="", flush=True)
            return  # elsewhere the whole message follows
        if isinstance(event, AssistantMessage) and self._streaming:
            self._end_stream()  # shown already, as it was written
            return
        if self.json_lines:
            self.write({"event": event_to_dict(event)})
        elif isinstance(event, InputRequired):
            # The whole question: a person answers it from this.
            self.line(f"[{agent}] asks: {event.question}")
        elif isinstance(event, Done):
            # The whole answer: what the person sent the message for.
            self.line(f"[{agent}] done:\n{event.text}")
        else:
            self.line(f"[{agent}] {describe_event(event)}")

    def ending(self, ending: str, task_id: str, context_id: str, url: str) -> None:
        code = SEND_EXIT_CODES[ending]
        if self.json_lines:
            self.write({"end": ending, "exit": code, "taskId": task_id, "contextId": context_id})
            return
        ids = f"  task {task_id}  context {context_id}" if task_id else ""
        self.line(f"\n{ending} (exit {code}){ids}")
        if ending == "input-required":
            self.line(
                f"answer it with: a2a-orchestrator send {url} 'ANSWER' "
                f"--task {task_id} --context {context_id}"
            )
