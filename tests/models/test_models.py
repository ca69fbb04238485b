"""Models: the OpenAI-compatible client against a real loopback server, the
scripted model, and the resolution of role model names."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import a2a_orchestrator.models as models_pkg
from a2a_orchestrator.errors import ConfigError, ModelError
from a2a_orchestrator.models import (
    OFFLINE_NOTICE,
    ChatMessage,
    Model,
    ModelItem,
    ModelSettings,
    OpenAIModel,
    ScriptedModel,
    ScriptedTurn,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    describe_model,
    is_scripted,
    resolve_model,
)

pytestmark = pytest.mark.anyio

MESSAGES: list[ChatMessage] = [
    {"role": "system", "content": "You are a coder."},
    {"role": "user", "content": "Read the README."},
]
READ_FILE = ToolSpec(
    name="read_file",
    description="Read a file.",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


async def collect(model: Model, messages: Sequence[ChatMessage] = MESSAGES) -> list[ModelItem]:
    return [item async for item in model.stream(messages, [READ_FILE])]


def text_of(items: Sequence[ModelItem]) -> str:
    return "".join(item.text for item in items if isinstance(item, TextDelta))


# --- a fake OpenAI-compatible endpoint, served for real by uvicorn ----------


class FakeOpenAI:
    """`/v1/chat/completions` answering with whatever `events` says, in the
    OpenAI streaming wire format (a float is a pause of that many seconds);
    it records every request it gets.

    The model is the thing under test here, so the endpoint is the fake: a
    real HTTP server, with a canned answer.
    """

    def __init__(self, events: Sequence[dict[str, Any] | str | float] = ()) -> None:
        self.events = list(events)
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        self.requests.append(
            {"body": await request.json(), "authorization": request.headers.get("authorization")}
        )
        if request.headers.get("authorization") == "Bearer wrong-key":
            return JSONResponse(
                {
                    "error": {
                        "message": "Incorrect API key provided.",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
                status_code=401,
            )
        if self.status != 200:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=self.status)

        async def body() -> AsyncIterator[str]:
            for event in self.events:
                if isinstance(event, float):
                    # A stalled endpoint: sleep mid-stream.
                    await anyio.sleep(event)
                    continue
                data = event if isinstance(event, str) else json.dumps(event)
                yield f"data: {data}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")


@asynccontextmanager
async def serving(app: Starlette) -> AsyncIterator[str]:
    """Serve `app` on 127.0.0.1 and yield its `/v1` base URL."""
    # Bound up front so the port is known before uvicorn starts; IPPROTO_TCP so
    # asyncio sets TCP_NODELAY (see A2A-SDK-NOTES.md pitfall 10).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            # uvicorn exposes readiness only as a flag, so poll it.
            while not server.started:
                await anyio.sleep(0.01)
            try:
                yield f"http://127.0.0.1:{port}/v1"
            finally:
                server.should_exit = True
    finally:
        sock.close()


def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        # With include_usage every chunk but the last carries "usage": null.
        "usage": None,
    }


def call_fragment(index: int, *, arguments: str, id: str | None = None, name: str | None = None):
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    fragment: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        fragment.update(id=id, type="function")
    return fragment


USAGE_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "gpt-test",
    "choices": [],
    "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49},
}

TOOL_TURN: list[dict[str, Any] | str] = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Let me "}),
    chunk({"content": "read it."}),
    chunk({"tool_calls": [call_fragment(0, id="call_abc", name="read_file", arguments="")]}),
    chunk({"tool_calls": [call_fragment(0, arguments='{"pa')]}),
    chunk({"tool_calls": [call_fragment(1, id="call_def", name="grep", arguments="{not")]}),
    chunk({"tool_calls": [call_fragment(0, arguments='th": "READ')]}),
    chunk({"tool_calls": [call_fragment(1, arguments=" json")]}),
    chunk({"tool_calls": [call_fragment(0, arguments='ME.md"}')]}),
    chunk({}, finish_reason="tool_calls"),
    USAGE_CHUNK,
]


async def test_openai_model_streams_text_tool_calls_and_usage() -> None:
    fake = FakeOpenAI(TOOL_TURN)
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None) as model:
                items = await collect(model)

    assert text_of(items) == "Let me read it."
    assert [type(item) for item in items] == [TextDelta] * 2 + [ToolCall] * 2 + [Usage]
    assert items[2] == ToolCall(id="call_abc", name="read_file", arguments={"path": "README.md"})
    # Invalid JSON arguments are handed on raw, for the runtime to report.
    assert items[3] == ToolCall(id="call_def", name="grep", arguments={"_raw": "{not json"})
    assert items[4] == Usage(input_tokens=42, output_tokens=7)

    [request] = fake.requests
    body = request["body"]
    assert body["model"] == "gpt-test"
    assert body["messages"] == MESSAGES
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": READ_FILE.parameters,
            },
        }
    ]
    # No key configured: a placeholder, since local servers need none.
    assert request["authorization"] == "Bearer not-needed"


async def test_openai_model_sends_no_tools_when_none_and_passes_the_key() -> None:
    fake = FakeOpenAI([chunk({"content": "Hi."}, finish_reason="stop"), USAGE_CHUNK])
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key="sk-test") as model:
                items = [item async for item in model.stream(MESSAGES, [])]
    assert text_of(items) == "Hi."
    assert items[-1] == Usage(input_tokens=42, output_tokens=7)
    [request] = fake.requests
    assert "tools" not in request["body"]
    assert request["authorization"] == "Bearer sk-test"


async def test_openai_model_refuses_tool_calls_without_finish_reason() -> None:
    # Without a finish reason the calls may be cut short: a failure, not an answer
    # (retries and their limits are tested in test_model_client.py).
    fake = FakeOpenAI(
        [
            chunk({"tool_calls": [call_fragment(0, id="c1", name="read_file", arguments="{}")]}),
        ]
    )
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=0) as model:
                with pytest.raises(ModelError, match="without a finish reason"):
                    await collect(model)
    assert len(fake.requests) == 1


async def test_openai_model_unreachable_endpoint() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    url = f"http://127.0.0.1:{port}/v1"
    with anyio.fail_after(10):
        async with OpenAIModel("gpt-x", base_url=url, api_key=None, retries=0) as model:
            with pytest.raises(ModelError) as info:
                await collect(model)
    message = str(info.value)
    assert f"model endpoint {url} unreachable" in message
    assert "'gpt-x'" in message


async def test_openai_model_bad_credentials() -> None:
    fake = FakeOpenAI(TOOL_TURN)
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key="wrong-key") as model:
                with pytest.raises(ModelError) as info:
                    await collect(model)
    message = str(info.value)
    assert url in message
    assert "401" in message
    assert "Incorrect API key" in message
    assert "wrong-key" not in message


async def test_openai_model_error_status() -> None:
    fake = FakeOpenAI()
    fake.status = 503
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None, retries=0) as m:
                with pytest.raises(ModelError, match="answered HTTP 503"):
                    await collect(m)


@pytest.mark.parametrize(
    ("event", "match"),
    [
        ("{not json", "malformed stream"),
        ({"error": {"message": "upstream exploded"}}, "upstream exploded"),
    ],
)
async def test_openai_model_bad_stream(event: dict[str, Any] | str, match: str) -> None:
    fake = FakeOpenAI([chunk({"content": "Hel"}), event])
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None) as model:
                with pytest.raises(ModelError, match=match):
                    await collect(model)


async def test_openai_model_consumer_may_stop_early_and_closed_model_refuses() -> None:
    fake = FakeOpenAI(TOOL_TURN)
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            model = OpenAIModel("gpt-test", base_url=url, api_key=None)
            async with aclosing(model.stream(MESSAGES, [READ_FILE])) as stream:
                first = await anext(stream)
            assert first == TextDelta(text="Let me ")
            await model.aclose()
            await model.aclose()  # idempotent
            with pytest.raises(ModelError, match="closed"):
                await collect(model)
    assert model.name == "gpt-test"
    assert model.base_url == url
    assert "not-needed" not in repr(model)


async def test_openai_model_cancelled_mid_stream() -> None:
    fake = FakeOpenAI([chunk({"content": "Thinking"}), 30.0, chunk({"content": "never"})])
    received: list[ModelItem] = []
    with anyio.fail_after(10):
        async with serving(fake.app) as url:
            async with OpenAIModel("gpt-test", base_url=url, api_key=None) as model:
                with anyio.move_on_after(0.5) as scope:
                    async for item in model.stream(MESSAGES, []):
                        received.append(item)
    assert scope.cancel_called
    assert received == [TextDelta(text="Thinking")]


# --- ScriptedModel ------------------------------------------------------------

SCRIPT: list[dict[str, Any]] = [
    {"text": "I will read the README file first, then decide what to change."},
    {
        "text": "Reading now.",
        "tool_calls": [
            {"name": "read_file", "arguments": {"path": "README.md"}},
            {"name": "grep", "arguments": {"pattern": "TODO"}},
        ],
    },
    {"text": "Done.", "usage": {"input_tokens": 100, "output_tokens": 2}},
]


def conversation(assistant_turns: int) -> list[ChatMessage]:
    messages = list(MESSAGES)
    for n in range(assistant_turns):
        messages.append({"role": "assistant", "content": f"turn {n}"})
        messages.append({"role": "user", "content": "go on"})
    return messages


async def test_scripted_turn_chosen_by_assistant_count() -> None:
    model = ScriptedModel(SCRIPT)
    with anyio.fail_after(10):
        first = await collect(model, conversation(0))
        second = await collect(model, conversation(1))
        third = await collect(model, conversation(2))
        again = await collect(model, conversation(0))  # stateless: no cursor to advance

    assert text_of(first) == SCRIPT[0]["text"]
    assert text_of(second) == "Reading now."
    assert text_of(third) == "Done."
    assert again == first
    assert model.name == "scripted"
    assert is_scripted(model)


async def test_scripted_text_streams_as_several_deltas() -> None:
    text = "  Leading space,\nnew lines\n\nand   runs of  spaces stay exactly. "
    model = ScriptedModel([{"text": text}])
    with anyio.fail_after(10):
        items = await collect(model)
    deltas = [item for item in items if isinstance(item, TextDelta)]
    assert len(deltas) > 2
    assert "".join(delta.text for delta in deltas) == text


async def test_scripted_tool_calls_and_usage() -> None:
    model = ScriptedModel(SCRIPT)
    with anyio.fail_after(10):
        items = await collect(model, conversation(1))
    calls = [item for item in items if isinstance(item, ToolCall)]
    assert calls == [
        ToolCall(id="call_1_0", name="read_file", arguments={"path": "README.md"}),
        ToolCall(id="call_1_1", name="grep", arguments={"pattern": "TODO"}),
    ]
    # Text first, then the calls, then exactly one usage, last.
    assert isinstance(items[0], TextDelta)
    usage = items[-1]
    assert isinstance(usage, Usage)
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert sum(isinstance(item, Usage) for item in items) == 1

    with anyio.fail_after(10):
        explicit = await collect(model, conversation(2))
    assert explicit[-1] == Usage(input_tokens=100, output_tokens=2)


async def test_scripted_past_the_end() -> None:
    model = ScriptedModel(SCRIPT)
    with anyio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(model, conversation(3))
    assert str(info.value) == "scripted model has no turn 4 (script has 3 turns)"


async def test_scripted_delay_is_cancellable() -> None:
    model = ScriptedModel([ScriptedTurn(text="slow", delay=30)])
    with anyio.move_on_after(0.2) as scope:
        await collect(model)
    assert scope.cancel_called

    quick = ScriptedModel([ScriptedTurn(text="soon", delay=0.01)])
    with anyio.fail_after(10):
        assert text_of(await collect(quick)) == "soon"


async def test_scripted_error_turn() -> None:
    model = ScriptedModel([{"text": "fine"}, {"error": "simulated outage"}])
    with anyio.fail_after(10):
        assert text_of(await collect(model, conversation(0))) == "fine"
        with pytest.raises(ModelError, match=r"^simulated outage$"):
            await collect(model, conversation(1))


async def test_scripted_serves_concurrent_conversations() -> None:
    model = ScriptedModel(SCRIPT)
    results: dict[int, str] = {}

    async def run(turns: int) -> None:
        results[turns] = text_of(await collect(model, conversation(turns)))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for turns in (0, 1, 2, 0, 2):
                tg.start_soon(run, turns)
    assert results == {0: SCRIPT[0]["text"], 1: "Reading now.", 2: "Done."}


async def test_scripted_function_chooses_the_turn() -> None:
    def answer(messages: Sequence[ChatMessage]) -> dict[str, Any]:
        return {"text": f"echo: {messages[-1]['content']}"}

    model = ScriptedModel(answer)
    with anyio.fail_after(10):
        assert text_of(await collect(model)) == "echo: Read the README."


async def test_scripted_from_json_and_yaml_files(tmp_path: Path) -> None:
    json_path = tmp_path / "demo.json"
    json_path.write_text(json.dumps(SCRIPT))
    yaml_path = tmp_path / "demo-run.yaml"
    yaml_path.write_text(
        "- text: Reading now.\n"
        "  tool_calls:\n"
        "    - name: read_file\n"
        "      arguments: {path: README.md}\n"
        "- text: Done.\n"
        "  delay: 0.01\n"
    )
    from_json = ScriptedModel.from_file(json_path)
    from_yaml = ScriptedModel.from_file(str(yaml_path))
    assert from_json.name == "scripted:demo"
    assert from_yaml.name == "scripted:demo-run"
    assert len(from_yaml.turns) == 2
    with anyio.fail_after(10):
        assert text_of(await collect(from_json, conversation(2))) == "Done."
        items = await collect(from_yaml, conversation(0))
    assert ToolCall(id="call_0_0", name="read_file", arguments={"path": "README.md"}) in items


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read"),
        ("- text: [unclosed", "does not parse"),
        ("text: not a list", "expected a list of turns"),
        ("- txt: typo", "turn 1: unknown turn field"),
        ("- text: ok\n- tool_calls: [{arguments: {}}]", "turn 2: a tool call needs"),
        ("- delay: -1", "'delay'"),
    ],
)
def test_scripted_bad_file(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "bad.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=match) as info:
        ScriptedModel.from_file(path)
    assert str(path) in str(info.value)


def test_scripted_bad_turn_in_code() -> None:
    with pytest.raises(ConfigError, match="'text' must be a string"):
        ScriptedModel([{"text": 3}])


# --- settings and resolution --------------------------------------------------


def test_settings_from_env() -> None:
    settings = ModelSettings.from_env(
        {
            "OPENAI_BASE_URL": "http://fallback/v1",
            "A2A_MODEL_BASE_URL": "http://localhost:11434/v1",
            "OPENAI_API_KEY": "sk-secret",
            "A2A_MODEL_DEFAULT": "llama3.1:8b",
            "A2A_MODEL_MINI": "",
        }
    )
    assert settings.base_url == "http://localhost:11434/v1"
    assert settings.api_key == "sk-secret"
    assert settings.default == "llama3.1:8b"
    assert settings.mini == "gpt-4o-mini"  # empty counts as unset
    assert settings.script is None
    assert not settings.offline
    assert "sk-secret" not in repr(settings)

    empty = ModelSettings.from_env({})
    assert empty.offline
    assert empty.default == "gpt-4o"
    assert not ModelSettings.from_env({"A2A_MODEL_BASE_URL": "http://h/v1"}).offline
    assert not ModelSettings.from_env({"OPENAI_API_KEY": "k"}).offline


@pytest.mark.parametrize(
    ("name", "expected"),
    [(None, "big-model"), ("default", "big-model"), ("mini", "small-model"), ("qwen3", "qwen3")],
)
async def test_resolve_model_names(name: str | None, expected: str) -> None:
    settings = ModelSettings(
        base_url="http://127.0.0.1:9/v1", default="big-model", mini="small-model"
    )
    model = resolve_model(name, settings)
    assert isinstance(model, OpenAIModel)
    assert model.name == expected
    assert model.base_url == "http://127.0.0.1:9/v1"
    assert describe_model(model) == f"model: {expected} at http://127.0.0.1:9/v1"
    assert not is_scripted(model)
    await model.aclose()


async def test_resolve_model_offline_builtin_says_it_is_scripted() -> None:
    model = resolve_model("default", ModelSettings())
    assert isinstance(model, ScriptedModel)
    assert describe_model(model).startswith("model: scripted (offline)")
    assert OFFLINE_NOTICE.startswith("model: scripted (offline)")
    with anyio.fail_after(10):
        text = text_of(await collect(model))
    assert "scripted offline model" in text
    assert "A2A_MODEL_BASE_URL" in text and "OPENAI_API_KEY" in text
    assert text.splitlines()[-1] == "TASK_SKIPPED"


async def test_resolve_model_offline_prefers_script_then_fallback(tmp_path: Path) -> None:
    fallback = [{"text": "fallback answer"}]
    model = resolve_model("mini", ModelSettings(), fallback_script=fallback)
    with anyio.fail_after(10):
        assert text_of(await collect(model)) == "fallback answer"

    path = tmp_path / "recorded.json"
    path.write_text(json.dumps([{"text": "from the file"}]))
    model = resolve_model("gpt-4.1", ModelSettings(script=str(path)), fallback_script=fallback)
    assert model.name == "scripted:recorded"
    with anyio.fail_after(10):
        assert text_of(await collect(model)) == "from the file"


async def test_resolve_model_scripted_names(tmp_path: Path) -> None:
    path = tmp_path / "pinned.yaml"
    path.write_text("- text: pinned\n")
    online = ModelSettings(api_key="sk-test", script=str(path))

    explicit = resolve_model(f"scripted:{path}", ModelSettings(api_key="sk-test"))
    bare = resolve_model("scripted", online)
    via_default = resolve_model(None, ModelSettings(api_key="k", default=f"scripted:{path}"))
    for model in (explicit, bare, via_default):
        assert isinstance(model, ScriptedModel)
        assert model.name == "scripted:pinned"
        with anyio.fail_after(10):
            assert text_of(await collect(model)) == "pinned"

    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        resolve_model(f"scripted:{tmp_path / 'missing.yaml'}", online)


def test_models_exports() -> None:
    for name in models_pkg.__all__:
        assert getattr(models_pkg, name) is not None, name
    assert isinstance(ScriptedModel([]), Model)
