"""One trace across the hops: `run` and two role servers, each a real
process, export over OTLP/HTTP to a receiver in this test, and their spans
form one trace whose parents follow the delegation.

The network: the architect and the coder are role servers (`serve`), the
reviewer runs in-process in `run`. Only the model is scripted. The receiver
is a Starlette app on 127.0.0.1 that decodes what the SDK's exporter posts
to /v1/traces with opentelemetry-proto's `ExportTraceServiceRequest`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from support.servers import served_url
from support.sessions import session_for

from a2a_orchestrator.cli.entry import service_name
from a2a_orchestrator.cli.parser import build_parser
from a2a_orchestrator.delegation.base import ChildConfig
from a2a_orchestrator.observe import tracing
from a2a_orchestrator.runtime.events import Done

CLI = [sys.executable, "-m", "a2a_orchestrator.cli"]
OFFLINE = {
    "A2A_MODEL_BASE_URL": "",
    "A2A_MODEL_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "OPENAI_API_KEY": "",
    "OTEL_SERVICE_NAME": "",
    "OTEL_RESOURCE_ATTRIBUTES": "",
    "OTEL_TRACES_EXPORTER": "",
    "OTEL_SDK_DISABLED": "",
}


@dataclass(frozen=True, kw_only=True)
class Received:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    return getattr(any_value, any_value.WhichOneof("value"))


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1, served by uvicorn in a thread."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self._lock = threading.Lock()
        app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    async def _traces(self, request: Request) -> Response:
        export = ExportTraceServiceRequest.FromString(await request.body())
        received = []
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Received(
                            service=resource.get("service.name", ""),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                        )
                    )
        with self._lock:
            self.spans.extend(received)
        body = ExportTraceServiceResponse().SerializeToString()
        return Response(body, media_type="application/x-protobuf")

    def received(self) -> list[Received]:
        with self._lock:
            return list(self.spans)

    @contextmanager
    def serving(self) -> Iterator[Receiver]:
        thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]})
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while not self._server.started:
                assert time.monotonic() < deadline, "the receiver did not start"
                time.sleep(0.02)
            yield self
        finally:
            self._server.should_exit = True
            thread.join(timeout=20)
            self._socket.close()


@contextmanager
def role_server(role: str, workdir: Path, env: dict[str, str]) -> Iterator[str]:
    """`a2a-orchestrator serve ROLE` on a free port; its URL. Stopped with
    SIGTERM, and waited for: it flushes its spans on the way out."""
    process = subprocess.Popen(
        [*CLI, "serve", role, "--port", "0", "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=workdir,
        env={**os.environ, **OFFLINE, **env},
    )
    try:
        yield served_url(process)
    finally:
        process.terminate()
        try:
            out, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate(timeout=10)
            raise
        assert process.returncode == 0, (out, err)
        assert "Traceback" not in err, err


def command(text: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "run_command", "arguments": {"command": text}}]}


def ancestors(span: Received, by_id: dict[str, Received]) -> list[Received]:
    """`span`'s parent, its parent's parent, ... up to the root."""
    chain = []
    while span.parent_id:
        assert span.parent_id in by_id, f"{span.name}'s parent was not exported"
        span = by_id[span.parent_id]
        chain.append(span)
    return chain


@pytest.mark.timeout(180)
def test_a_pipeline_over_two_role_servers_is_one_trace(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "script.json"
    # Every role replays it: a command (the architect has no run_command, so
    # its call fails), then the answer; each model call reports its tokens.
    usage = {"input_tokens": 120, "output_tokens": 7}
    turns = [
        {**command("echo traced"), "usage": usage},
        {"text": "All done.\nTASK_SKIPPED", "usage": usage},
    ]
    script.write_text(json.dumps(turns))
    with Receiver().serving() as receiver:
        env = {
            "A2A_MODEL_SCRIPT": str(script),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
            # Batches go out every 100 ms, not every 5 s.
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with (
            role_server("architect", work, env) as architect,
            role_server("coder", work, env) as coder,
        ):
            run = subprocess.run(
                [*CLI, "run", "Build it"],
                capture_output=True,
                text=True,
                cwd=work,
                timeout=120,
                env={
                    **os.environ,
                    **OFFLINE,
                    **env,
                    "A2A_AGENT_ARCHITECT_URL": architect,
                    "A2A_AGENT_CODER_URL": coder,
                },
            )
            assert run.returncode == 3, (run.stdout, run.stderr)  # TASK_SKIPPED
        # The role servers have stopped (flushing); `run` flushed as it returned.
        services = {"a2a-orchestrator", "a2a-architect", "a2a-coder"}
        deadline = time.monotonic() + 30
        while {s.service for s in receiver.received()} != services:
            assert time.monotonic() < deadline, {s.service for s in receiver.received()}
            time.sleep(0.1)
        spans = receiver.received()

    assert len({s.trace_id for s in spans}) == 1, "not one trace"
    by_id = {s.span_id: s for s in spans}
    roots = [s for s in spans if not s.parent_id]
    assert [(r.service, r.name) for r in roots] == [("a2a-orchestrator", "session")]
    session = roots[0]

    children = {
        s.attributes["a2a.role"]: s
        for s in spans
        if s.name == "child" and s.service == "a2a-orchestrator"
    }
    assert set(children) == {"architect", "coder", "reviewer"}
    for role, child in children.items():
        assert child.parent_id == session.span_id
        assert child.attributes["a2a.child.status"] == "completed"
        assert child.attributes["a2a.transport"] == ("local" if role == "reviewer" else "remote")

    for role in ("architect", "coder"):
        # The role server's turn: its caller is the orchestrator's turn of
        # that child, whose parent is the child, whose parent is the session.
        (served,) = [s for s in spans if s.service == f"a2a-{role}" and s.name == "turn"]
        chain = ancestors(served, by_id)
        assert [(s.service, s.name) for s in chain] == [
            ("a2a-orchestrator", "turn"),
            ("a2a-orchestrator", "child"),
            ("a2a-orchestrator", "session"),
        ]
        assert chain[1] is children[role]
        assert served.kind == 2  # SERVER
        assert chain[0].kind == 3  # CLIENT
        assert served.attributes["a2a.outcome"] == "done"
        # Its model and tool calls are its children, in its own process.
        calls = [s for s in spans if s.parent_id == served.span_id]
        models = [s for s in calls if s.name.startswith("chat ")]
        assert len(models) == 2
        for model in models:
            assert model.service == f"a2a-{role}"
            assert model.attributes["gen_ai.request.model"] == "scripted:script"
            assert model.attributes["gen_ai.usage.input_tokens"] == 120
            assert model.attributes["gen_ai.usage.output_tokens"] == 7
        (tool,) = [s for s in calls if s.name == "execute_tool run_command"]
        assert tool.attributes["gen_ai.tool.name"] == "run_command"
        # The architect may not run commands: its call fails.
        assert tool.attributes["a2a.tool.success"] is (role == "coder")

    # The in-process reviewer: its turn and calls are in the orchestrator's process.
    (local_turn,) = [s for s in spans if s.parent_id == children["reviewer"].span_id]
    assert local_turn.name == "turn" and local_turn.kind == 1  # INTERNAL
    names = sorted(s.name for s in spans if s.parent_id == local_turn.span_id)
    assert names == ["chat scripted:script", "chat scripted:script", "execute_tool run_command"]


def test_tracing_is_off_without_the_variables() -> None:
    assert tracing.wanted({}) == []
    assert tracing.wanted({"OTEL_SERVICE_NAME": "x"}) == []
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == ["otlp"]
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h/v1/traces"}) == ["otlp"]
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.wanted({**on, "OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.wanted({**on, "OTEL_SDK_DISABLED": "true"}) == []


def test_a_bad_exporter_setting_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "serve", "coder", "--port", "0", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **OFFLINE, "OTEL_TRACES_EXPORTER": "zipkin"},
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: OTEL_TRACES_EXPORTER='zipkin': use otlp, console or none"


def test_service_names_follow_the_command() -> None:
    parser = build_parser()
    assert service_name(parser.parse_args(["serve", "coder"])) == "a2a-coder"
    assert service_name(parser.parse_args(["serve", "orchestrator"])) == "a2a-orchestrator"
    assert service_name(parser.parse_args(["run", "a task"])) == "a2a-orchestrator"


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["remote", "grpc"])
async def test_trace_context_travels_over_json_rpc_and_grpc(transport: str, tmp_path: Path) -> None:
    # Both ends in this process, their spans made by a real SDK provider
    # kept apart from the global one (`use_provider`), finished spans kept
    # in memory: the server's turn must be the client's turn's child.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        with anyio.fail_after(30):
            async with session_for(transport, tmp_path, [{"text": "traced"}]) as session:
                handle = await session.spawn(ChildConfig(role="coder", prompt="hi"))
                assert isinstance(await handle.result(), Done)
    finally:
        tracing.use_provider(None)
    spans = exporter.get_finished_spans()
    assert len({s.context.trace_id for s in spans}) == 1
    (client,) = [s for s in spans if s.name == "turn" and s.kind == SpanKind.CLIENT]
    (server,) = [s for s in spans if s.name == "turn" and s.kind == SpanKind.SERVER]
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert server.parent.is_remote  # it came over the wire
    (model,) = [s for s in spans if s.name.startswith("chat ")]
    assert model.parent is not None and model.parent.span_id == server.context.span_id


def test_the_sdk_spans_are_not_made_unless_asked_for(tmp_path: Path) -> None:
    """a2a-sdk's own spans are left out of what is exported, but cost all
    the same: the CLI turns them off (before a2a-sdk reads its switch)
    unless the switch is set. Each case in a fresh interpreter, as a
    command starts."""
    code = (
        "import os, sys; from a2a_orchestrator.cli import main;"
        " main(['status', '--store', sys.argv[1]]);"
        " import a2a.utils.telemetry as t;"
        " print(os.environ.get('OTEL_INSTRUMENTATION_A2A_SDK_ENABLED'), t.otel_enabled)"
    )
    base = {k: v for k, v in os.environ.items() if k != tracing.SDK_SPANS}

    def outcome(**env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "store.db")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**base, **OFFLINE, **env},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert outcome() == "false False"
    assert outcome(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9") == "false False"
    assert outcome(OTEL_INSTRUMENTATION_A2A_SDK_ENABLED="true") == "true True"
    quiet: dict[str, str] = {}
    assert tracing.quiet_sdk_spans(quiet) is False  # a2a-sdk is loaded in this process
    assert quiet == {}


def test_a_dead_collector_costs_one_line_and_a_short_timeout(tmp_path: Path) -> None:
    """Issue 25: a dead OTLP endpoint turned a 1.4 s run into 9.6 s (the
    SDK's 10 s export timeout, retried) with a long warning per retry."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()  # nothing listens there: every export is refused
    run = subprocess.run(
        [*CLI, "run", "Build it"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, **OFFLINE, "OTEL_EXPORTER_OTLP_ENDPOINT": dead},
    )
    assert run.returncode in (0, 3), run.stderr
    assert run.stderr.splitlines() == [
        f"WARNING a2a_orchestrator.observe.tracing: spans cannot be exported to {dead}; they are "
        "dropped (said once; -v shows each failure)"
    ]
    # The exporter gives up after EXPORT_TIMEOUT, retries included (the
    # SDK's 10 s with its backoff cost 0.9 + 1.7 + 4 s), unless told otherwise.
    assert tracing._export_timeout({}) == tracing.EXPORT_TIMEOUT == 2.0
    # The operator's variable wins: the SDK reads it when given no timeout.
    assert tracing._export_timeout({"OTEL_EXPORTER_OTLP_TIMEOUT": "30"}) is None
