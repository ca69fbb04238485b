"""The OpenAI-compatible model client under real failures: streams cut short,
connections dropped or refused, endpoints that hang, limits from the
environment and from role files, and token counts that stay whole numbers all
the way to the orchestrator's store and `events --jsonl`.

Every endpoint here is a real HTTP server on 127.0.0.1 (`ScriptedEndpoint`),
scripted per request.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn

from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.delegation.network import AgentSpec, Network
from a2a_orchestrator.delegation.session import Session
from a2a_orchestrator.errors import ConfigError, ModelError, RoleFileError
from a2a_orchestrator.models import (
    ChatMessage,
    ModelItem,
    ModelSettings,
    OpenAIModel,
    Restart,
    ScriptedModel,
    TextDelta,
    ToolCall,
    Usage,
    limit_model,
    resolve_model,
)
from a2a_orchestrator.protocol.wire import plain
from a2a_orchestrator.runtime.events import Done, Failed
from a2a_orchestrator.runtime.roles import find_role, load_role_file
from a2a_orchestrator.server.app import run_role_server
from a2a_orchestrator.storage.store import Store

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]

MESSAGES: list[ChatMessage] = [
    {"role": "system", "content": "You are an architect."},
    {"role": "user", "content": "Say something."},
]


# --- a scripted OpenAI-compatible endpoint, served for real by uvicorn ---------

HANG = "hang"
"""Send nothing more until the test ends (a hung endpoint)."""
DROP = "drop"
"""Close the connection in the middle of the response (a dropped connection)."""
EOF = "eof"
"""End the response cleanly, without `data: [DONE]`."""


@dataclasses.dataclass(frozen=True)
class Status:
    """Answer with this HTTP error status instead of a stream."""

    code: int
    retry_after: str | None = None


Step = dict[str, Any] | str | float | Status


class ScriptedEndpoint:
    """A fake OpenAI-compatible `/v1/chat/completions`, served by uvicorn.

    Only the model may be faked in these tests, and to an OpenAI-compatible
    client the model *is* an HTTP server, so this is the fake: a real server
    on a real socket whose answers are scripted. Request n gets `replies[n]`
    (the last reply repeats), played step by step in the streaming wire
    format: a dict is one `data:` chunk, a float a pause of that many
    seconds, `HANG`, `DROP`, `EOF` and `Status` as their docstrings say;
    after the last step `data: [DONE]` ends the response. Every request body
    is recorded.
    """

    def __init__(self, *replies: Sequence[Step]) -> None:
        self.replies = [list(reply) for reply in replies]
        self.requests: list[dict[str, Any]] = []
        self.released = anyio.Event()
        """Set when the test ends: hung requests finish, so the server can stop."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests.append(json.loads(body))
        reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
        started = False

        async def start(status: int = 200, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
            nonlocal started
            if not started:
                started = True
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [(b"content-type", b"text/event-stream"), *headers],
                    }
                )

        async def chunk(data: bytes, *, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        for step in reply:
            if isinstance(step, Status):
                extra = [(b"retry-after", step.retry_after.encode())] if step.retry_after else []
                await start(step.code, extra)
                error = {"error": {"message": f"scripted HTTP {step.code}"}}
                await chunk(json.dumps(error).encode(), more=False)
                return
            if step == HANG:
                await self.released.wait()
                return
            if step == DROP:
                await start()
                # Returning with the body unfinished makes uvicorn close the
                # connection: the client sees the stream break off.
                return
            if step == EOF:
                await start()
                await chunk(b"", more=False)
                return
            if isinstance(step, float):
                await anyio.sleep(step)
                continue
            assert isinstance(step, dict)
            await start()
            await chunk(f"data: {json.dumps(step)}\n\n".encode())
        await start()
        await chunk(b"data: [DONE]\n\n", more=False)


def bound_socket() -> socket.socket:
    # IPPROTO_TCP so asyncio sets TCP_NODELAY (see A2A-SDK-NOTES.md pitfall 10).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    return sock


@asynccontextmanager
async def serving(
    endpoint: ScriptedEndpoint,
    sock: socket.socket | None = None,
    *,
    start: anyio.Event | None = None,
) -> AsyncIterator[str]:
    """Serve `endpoint` on 127.0.0.1 and yield its `/v1` base URL. With
    `start`, the socket is bound (connections are refused) until it is set."""
    sock = sock or bound_socket()
    port = sock.getsockname()[1]
    # The drops are deliberate; uvicorn would log each as an application error.
    config = uvicorn.Config(endpoint, log_level="critical", lifespan="off")
    server = uvicorn.Server(config)

    async def run() -> None:
        if start is not None:
            await start.wait()
        await server.serve([sock])

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            if start is None:
                # uvicorn exposes readiness only as a flag, so poll it.
                while not server.started:
                    await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{port}/v1"
            finally:
                endpoint.released.set()
                server.should_exit = True
                if not server.started:
                    tg.cancel_scope.cancel()
    finally:
        sock.close()


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        "usage": None,
    }


def text(content: str, finish_reason: str | None = None) -> dict[str, Any]:
    return chunk({"content": content}, finish_reason)


def usage(prompt: float, completion: float) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def answer(*parts: str, tokens: tuple[float, float] = (42, 7)) -> list[Step]:
    """A complete streamed answer: the parts, a finish reason, the usage."""
    return [*(text(part) for part in parts), chunk({}, "stop"), usage(*tokens)]


async def stream_into(model: OpenAIModel, received: list[ModelItem]) -> None:
    """Stream one turn into `received`, so a test still sees what came before a failure."""
    async for item in model.stream(MESSAGES, []):
        received.append(item)


def text_of(items: Sequence[ModelItem]) -> str:
    """The turn's text: the deltas after the last `Restart` (which withdraws those before it)."""
    restarts = [n for n, item in enumerate(items) if isinstance(item, Restart)]
    kept = items[restarts[-1] + 1 :] if restarts else items
    return "".join(item.text for item in kept if isinstance(item, TextDelta))


def shapes(items: Sequence[ModelItem]) -> list[ModelItem | str]:
    """`items` with each `Restart` as the word "restart" (its reason is the endpoint's error)."""
    return ["restart" if isinstance(item, Restart) else item for item in items]


# --- a stream cut short -------------------------------------------------------


@pytest.mark.parametrize("ending", [EOF, "[DONE]"])
async def test_a_stream_cut_without_finish_reason_is_retried_then_fails(ending: str) -> None:
    # The finding: "This is " then the end of the stream was taken as the answer.
    reply: list[Step] = [chunk({"role": "assistant", "content": ""}), text("This is ")]
    if ending == EOF:
        reply.append(EOF)
    endpoint = ScriptedEndpoint(reply)
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=2) as model:
                with pytest.raises(ModelError) as info:
                    await stream_into(model, received)
    message = str(info.value)
    assert "ended its stream without a finish reason" in message
    assert "gave up after 3 attempts" in message and url in message
    assert len(endpoint.requests) == 3
    # Each retry began the message again, withdrawing the cut attempt's text
    # first; the last attempt's failure is the call's, with nothing to withdraw.
    assert shapes(received) == [TextDelta(text="This is "), "restart"] * 2 + [
        TextDelta(text="This is ")
    ]
    [restart, *_] = [item for item in received if isinstance(item, Restart)]
    assert "without a finish reason" in restart.reason and url in restart.reason


async def test_a_cut_stream_fails_the_child_through_both_transports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The regression end to end: the child fails with the reason, it does
    not complete with the fragment, in process and on a real role server."""
    endpoint = ScriptedEndpoint([text("This is ")])
    monkeypatch.chdir(tmp_path)
    with anyio.fail_after(30):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=1) as model:
                async with run_role_server(
                    find_role("architect"), model, tmp_path, db=str(tmp_path / "role.db")
                ) as server:
                    network = Network.of(
                        AgentSpec(name="remote", role="architect", url=server.url),
                        AgentSpec(name="local", role="architect"),
                    )
                    async with Session(
                        Store(tmp_path / "o.db"),
                        workdir=tmp_path,
                        network=network,
                        models=lambda name: model,
                    ) as session:
                        outcomes = [
                            await (await session.spawn(ChildConfig(role=n, prompt="x"))).result()
                            for n in ("local", "remote")
                        ]
    for outcome in outcomes:
        assert isinstance(outcome, Failed), outcome
        assert outcome.reason == "error"
        assert "without a finish reason" in outcome.message
        assert "gave up after 2 attempts" in outcome.message
    assert len(endpoint.requests) == 4  # two attempts for each child


# --- dropped and refused connections ---------------------------------------------


async def test_a_connection_dropped_mid_stream_is_retried_from_the_start() -> None:
    endpoint = ScriptedEndpoint(
        [text("This is "), DROP],
        # The retry happens to answer the same (a deterministic endpoint); the
        # server also counts its tokens as doubles, as some do.
        answer("This is ", "the answer.", tokens=(565.0, 7.0)),
    )
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=2) as model:
                await stream_into(model, received)
    assert len(endpoint.requests) == 2
    assert endpoint.requests[0] == endpoint.requests[1]  # the same request, resent
    assert shapes(received) == [
        TextDelta(text="This is "),
        "restart",
        TextDelta(text="This is "),
        TextDelta(text="the answer."),
        Usage(input_tokens=565, output_tokens=7),
    ]
    assert text_of(received) == "This is the answer."
    [restart] = [item for item in received if isinstance(item, Restart)]
    assert f"model endpoint {url} unreachable" in restart.reason
    usage_item = received[-1]
    assert isinstance(usage_item, Usage) and type(usage_item.input_tokens) is int


async def test_a_retry_that_answers_differently_begins_the_message_again() -> None:
    """A sampling model never answers twice alike: the cut attempt's text is
    withdrawn and the retry's answer is the call's, whole."""
    endpoint = ScriptedEndpoint(
        [text("This is "), DROP], answer("That was ", "another answer.", tokens=(30, 4))
    )
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=2) as model:
                await stream_into(model, received)
    assert shapes(received) == [
        TextDelta(text="This is "),
        "restart",
        TextDelta(text="That was "),
        TextDelta(text="another answer."),
        Usage(input_tokens=30, output_tokens=4),
    ]
    assert text_of(received) == "That was another answer."
    assert len(endpoint.requests) == 2


async def test_a_running_usage_count_is_handed_on_once_and_never_before_a_restart() -> None:
    """An endpoint that reports its running count on every chunk (vLLM's
    continuous usage stats): the call's usage is the finished attempt's last
    report, once; the cut attempt's tokens are in no total."""

    def counted(item: dict[str, Any], prompt: int, completion: int) -> dict[str, Any]:
        return {**item, "usage": usage(prompt, completion)["usage"]}

    endpoint = ScriptedEndpoint(
        [counted(text("This is "), 30, 2), counted(text("half"), 30, 3), DROP],
        [
            counted(text("That was "), 30, 2),
            counted(text("whole."), 30, 4),
            counted(chunk({}, "stop"), 30, 4),
        ],
    )
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=1) as model:
                await stream_into(model, received)
    assert shapes(received) == [
        TextDelta(text="This is "),
        TextDelta(text="half"),
        "restart",
        TextDelta(text="That was "),
        TextDelta(text="whole."),
        Usage(input_tokens=30, output_tokens=4),
    ]


async def test_a_cut_with_nothing_shown_restarts_nothing() -> None:
    endpoint = ScriptedEndpoint([chunk({"role": "assistant", "content": ""}), DROP], answer("Hi."))
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=1) as model:
                await stream_into(model, received)
    assert shapes(received) == [TextDelta(text="Hi."), Usage(input_tokens=42, output_tokens=7)]


async def test_a_tool_call_cut_mid_stream_is_retried_whole() -> None:
    def fragment(arguments: str, **first: str) -> dict[str, Any]:
        # The first fragment of a call carries its id and name, the rest only arguments.
        function = {"arguments": arguments, **({"name": first.pop("name")} if first else {})}
        return chunk({"tool_calls": [{"index": 0, **first, "function": function}]})

    first = {"id": "c1", "type": "function", "name": "read_file"}
    endpoint = ScriptedEndpoint(
        [fragment('{"pa', **first), DROP],
        [fragment("{", **first), fragment('"path": "a"}'), chunk({}, "tool_calls"), usage(10, 2)],
    )
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=1) as model:
                await stream_into(model, received)
    assert received == [
        ToolCall(id="c1", name="read_file", arguments={"path": "a"}),
        Usage(input_tokens=10, output_tokens=2),
    ]


async def test_a_cut_mid_arguments_restarts_the_text_and_never_gives_the_half_call() -> None:
    """The cut attempt said something and began a call; the retry says
    something else and calls another file. Only the retry's call comes out,
    once, whole: a half call is never handed on to be run."""

    def call(index: int, arguments: str, **first: str) -> dict[str, Any]:
        function = {"arguments": arguments, **({"name": first.pop("name")} if first else {})}
        return chunk({"tool_calls": [{"index": index, **first, "function": function}]})

    endpoint = ScriptedEndpoint(
        [text("Reading a. "), call(0, '{"path": "a', id="c1", name="read_file"), DROP],
        [
            text("Reading b first. "),
            call(0, '{"path": ', id="c9", name="read_file"),
            call(0, '"b"}'),
            chunk({}, "tool_calls"),
            usage(12, 3),
        ],
    )
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=1) as model:
                await stream_into(model, received)
    assert shapes(received) == [
        TextDelta(text="Reading a. "),
        "restart",
        TextDelta(text="Reading b first. "),
        ToolCall(id="c9", name="read_file", arguments={"path": "b"}),
        Usage(input_tokens=12, output_tokens=3),
    ]


async def test_a_refused_connection_is_retried_until_the_server_is_up() -> None:
    endpoint = ScriptedEndpoint(answer("Up now."))
    up = anyio.Event()

    class StartOnRetry(logging.Handler):
        # The server starts only once the client has been refused and said
        # it will retry: no timing guess decides what this test proves.
        def emit(self, record: logging.LogRecord) -> None:
            if "unreachable" in record.getMessage() and "retry 1 of" in record.getMessage():
                up.set()

    handler = StartOnRetry(level=logging.WARNING)
    logger = logging.getLogger("a2a_orchestrator.models.openai")
    logger.addHandler(handler)
    received: list[ModelItem] = []
    try:
        with anyio.fail_after(20):
            async with serving(endpoint, start=up) as url:
                async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=4) as model:
                    await stream_into(model, received)
    finally:
        logger.removeHandler(handler)
    assert up.is_set()
    assert text_of(received) == "Up now."
    assert len(endpoint.requests) == 1  # the refused attempt never reached it


async def test_an_unreachable_endpoint_gives_up_after_its_retries() -> None:
    sock = bound_socket()  # bound, never listening: every connection is refused
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    try:
        with anyio.fail_after(20):
            async with OpenAIModel("gpt-x", base_url=url, api_key=None, retries=2) as model:
                with pytest.raises(ModelError) as info:
                    await stream_into(model, [])
    finally:
        sock.close()
    message = str(info.value)
    assert f"model endpoint {url} unreachable" in message
    assert "gave up after 3 attempts" in message
    assert isinstance(info.value.__cause__, Exception)


async def test_overload_is_retried_and_a_bad_request_is_not() -> None:
    overloaded = ScriptedEndpoint([Status(503, retry_after="0")], answer("Fine."))
    bad = ScriptedEndpoint([Status(400)])
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(overloaded) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=2) as model:
                await stream_into(model, received)
        async with serving(bad) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=2) as model:
                with pytest.raises(ModelError, match="answered HTTP 400") as info:
                    await stream_into(model, [])
    assert text_of(received) == "Fine." and len(overloaded.requests) == 2
    assert len(bad.requests) == 1 and "gave up" not in str(info.value)


# --- timeouts -------------------------------------------------------------------


async def test_a_hung_endpoint_fails_within_its_configured_bounds() -> None:
    endpoint = ScriptedEndpoint([HANG])
    with anyio.fail_after(15):
        async with serving(endpoint) as url:
            async with OpenAIModel(
                "gpt-test", base_url=url, api_key=None, timeout=1, retries=2
            ) as model:
                started = anyio.current_time()
                with pytest.raises(ModelError) as info:
                    await stream_into(model, [])
                elapsed = anyio.current_time() - started
    message = str(info.value)
    assert "timed out" in message and "no byte for 1 s" in message
    assert "A2A_MODEL_TIMEOUT" in message and "gave up after 3 attempts" in message
    assert len(endpoint.requests) == 3
    # Three silent seconds, plus at most 0.5 + 1 s of backoff; generous above
    # for a busy machine, but far from the 361 s the finding measured.
    assert 3 <= elapsed < 10


async def test_the_timeout_is_for_silence_not_for_a_long_answer() -> None:
    parts = [step for n in range(6) for step in (0.4, text(f"part {n}. "))]
    endpoint = ScriptedEndpoint([*parts, chunk({}, "stop"), usage(1, 6)])
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel(
                "gpt-test", base_url=url, api_key=None, timeout=1, retries=0
            ) as model:
                await stream_into(model, received)
    # 2.4 s in all, never 1 s without a byte: one attempt, the whole answer.
    assert text_of(received) == "".join(f"part {n}. " for n in range(6))
    assert len(endpoint.requests) == 1


async def test_silence_mid_stream_times_out_and_the_retry_begins_the_message_again() -> None:
    endpoint = ScriptedEndpoint([text("Thinking"), HANG], answer("Thinking", " done."))
    received: list[ModelItem] = []
    with anyio.fail_after(20):
        async with serving(endpoint) as url:
            async with OpenAIModel(
                "gpt-test", base_url=url, api_key=None, timeout=1, retries=1
            ) as model:
                await stream_into(model, received)
    assert text_of(received) == "Thinking done."
    assert sum(isinstance(item, Restart) for item in received) == 1
    assert len(endpoint.requests) == 2


# --- settings: environment and role files --------------------------------------------


def test_timeout_and_retries_from_the_environment() -> None:
    defaults = ModelSettings.from_env({})
    assert (defaults.timeout, defaults.retries) == (15.0, 2)
    # A hung endpoint fails well under a minute, and under a role's default 60 s.
    assert defaults.timeout * (defaults.retries + 1) + 0.5 + 1.0 < 50
    settings = ModelSettings.from_env(
        {"A2A_MODEL_TIMEOUT": "2.5", "A2A_MODEL_RETRIES": "0", "A2A_MODEL_BASE_URL": "http://h/v1"}
    )
    assert (settings.timeout, settings.retries) == (2.5, 0)
    model = resolve_model("default", settings)
    assert isinstance(model, OpenAIModel)
    assert (model.timeout, model.retries) == (2.5, 0)
    assert ModelSettings.from_env({"A2A_MODEL_TIMEOUT": "0"}).timeout == 0  # no limit
    for variable, value in [
        ("A2A_MODEL_TIMEOUT", "soon"),
        ("A2A_MODEL_TIMEOUT", "-1"),
        ("A2A_MODEL_TIMEOUT", "inf"),
        ("A2A_MODEL_RETRIES", "1.5"),
        ("A2A_MODEL_RETRIES", "-2"),
    ]:
        with pytest.raises(ConfigError, match=variable):
            ModelSettings.from_env({variable: value})


def test_role_files_set_model_timeout_and_retries(tmp_path: Path) -> None:
    path = tmp_path / "patient.md"
    path.write_text("---\nmodel_timeout: 300\nmodel_retries: 0\n---\nThink long.\n")
    role = load_role_file(path)
    assert (role.model_timeout, role.model_retries) == (300.0, 0)
    assert (find_role("architect").model_timeout, find_role("architect").model_retries) == (
        None,
        None,
    )
    for field, value in [
        ("model_timeout", "-1"),
        ("model_timeout", "soon"),
        ("model_retries", "1.5"),
        ("model_retries", "true"),
    ]:
        path.write_text(f"---\n{field}: {value}\n---\nThink.\n")
        with pytest.raises(RoleFileError, match=field):
            load_role_file(path)


async def test_limit_model_applies_role_limits_to_endpoint_models_only() -> None:
    base = OpenAIModel("gpt-test", base_url="http://127.0.0.1:9/v1", api_key=None)
    async with base:
        limited = limit_model(base, timeout=0, retries=5)
        assert isinstance(limited, OpenAIModel)
        assert (limited.timeout, limited.retries) == (0, 5)
        assert (base.timeout, base.retries) == (15.0, 2)  # the operator's model is untouched
        assert limit_model(base, timeout=None, retries=None) is base
        scripted = ScriptedModel([{"text": "x"}])
        assert limit_model(scripted, timeout=1, retries=0) is scripted
        with pytest.raises(ConfigError, match="retries"):
            limit_model(base, timeout=None, retries=-1)


async def test_a_roles_model_limits_reach_its_children_through_both_transports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator allows a patient 60 s and 2 retries; the role file says
    1 s and none, and that is what its children get, local and remote."""
    (tmp_path / "roles").mkdir()
    (tmp_path / "roles" / "hasty.md").write_text(
        "---\ntools: [read_file]\nmodel_timeout: 1\nmodel_retries: 0\n---\nBe quick.\n"
    )
    monkeypatch.chdir(tmp_path)  # ./roles/ is the first place roles are looked up
    endpoint = ScriptedEndpoint([HANG])
    with anyio.fail_after(30):
        async with serving(endpoint) as url:
            async with OpenAIModel(
                "gpt-test", base_url=url, api_key=None, timeout=60, retries=2
            ) as model:
                async with run_role_server(
                    find_role("hasty"), model, tmp_path, db=str(tmp_path / "role.db")
                ) as server:
                    network = Network.of(
                        AgentSpec(name="remote", role="hasty", url=server.url),
                        AgentSpec(name="local", role="hasty"),
                    )
                    async with Session(
                        Store(tmp_path / "o.db"),
                        workdir=tmp_path,
                        network=network,
                        models=lambda name: model,
                    ) as session:
                        outcomes = [
                            await (await session.spawn(ChildConfig(role=n, prompt="x"))).result()
                            for n in ("local", "remote")
                        ]
    for outcome in outcomes:
        assert isinstance(outcome, Failed), outcome
        assert "no byte for 1 s" in outcome.message and "retries are off" in outcome.message
    assert len(endpoint.requests) == 2  # one attempt each


# --- whole numbers stay whole -------------------------------------------------------


def test_plain_turns_whole_doubles_back_into_ints() -> None:
    decoded = {"usage": {"input_tokens": 565.0}, "args": [3.0, 2.5, True, None, "7"], "big": 1e300}
    assert plain(decoded) == {
        "usage": {"input_tokens": 565},
        "args": [3, 2.5, True, None, "7"],
        "big": 1e300,  # beyond 2**53 a double is not an exact int: kept as it is
    }
    assert type(plain(decoded)["usage"]["input_tokens"]) is int


async def test_token_counts_stay_ints_from_a_role_server_to_the_store_and_events_jsonl(
    tmp_path: Path,
) -> None:
    """A2A metadata is a protobuf Struct (numbers are doubles on the wire);
    what the orchestrator stores and prints has the ints the model sent."""
    call = {"index": 0, "id": "c1", "type": "function"}
    arguments = json.dumps({"path": "notes.txt", "limit": 3})
    endpoint = ScriptedEndpoint(
        [
            chunk(
                {
                    "tool_calls": [
                        {**call, "function": {"name": "read_file", "arguments": arguments}}
                    ]
                }
            ),
            chunk({}, "tool_calls"),
            usage(565, 7),
        ],
        answer("Read it.", tokens=(600, 5)),
    )
    (tmp_path / "notes.txt").write_text("one\ntwo\nthree\nfour\n")
    db = tmp_path / "o.db"
    with anyio.fail_after(30):
        async with serving(endpoint) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None) as model:
                async with run_role_server(
                    find_role("architect"), model, tmp_path, db=str(tmp_path / "role.db")
                ) as server:
                    network = Network.of(
                        AgentSpec(name="architect", role="architect", url=server.url)
                    )
                    async with Session(Store(db), workdir=tmp_path, network=network) as session:
                        handle = await session.spawn(ChildConfig(role="architect", prompt="read"))
                        outcome = await handle.result()
        exported = await anyio.run_process(
            [*CLI, "events", session.id, "--jsonl", "--store", str(db)]
        )
    assert isinstance(outcome, Done) and outcome.text == "Read it."
    assert outcome.usage == Usage(input_tokens=1165, output_tokens=12)
    out = exported.stdout.decode()
    lines = [json.loads(line) for line in out.splitlines()]
    [done] = [line for line in lines if line["kind"] == "done"]
    [called] = [line for line in lines if line["kind"] == "tool_called"]
    assert done["payload"]["usage"] == {"input_tokens": 1165, "output_tokens": 12}
    assert type(done["payload"]["usage"]["input_tokens"]) is int
    assert called["payload"]["arguments"] == {"path": "notes.txt", "limit": 3}
    assert type(called["payload"]["arguments"]["limit"]) is int
    # Counts print as ints (a float's ".0" would mean a Struct double leaked
    # through); seconds, cost and times are floats of their own.
    counted = "".join(line for line in out.splitlines() if '"usage"' in line)
    assert not re.search(r'(_tokens|model_calls)": \d+\.\d', counted), counted
    assert done["payload"]["spent"]["model_calls"] == 2
