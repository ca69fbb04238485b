"""Tracing: one OpenTelemetry trace for a task across the network's hops.

Spans (README "Traces" lists their attributes):

    session                 a `Session`, open to close
    └─ child                a child, from spawn (or a follow-up's input) until it settles
       └─ turn              each of its turns, on the parent's side (CLIENT when remote)
          └─ turn           the same turn on the role server that plays it (SERVER)
             ├─ chat MODEL          one model call, with its token counts
             └─ execute_tool TOOL   one tool call, with its success

A local child's model and tool calls sit under its parent-side turn; a
parent agent's under the session (or the orchestrator server's `turn`); a
child spawned by a tool call under that call's span.

Contract:
- W3C trace context (`traceparent`, `tracestate`, through the global
  propagator, so OTEL_PROPAGATORS holds) goes out with every A2A call this
  package makes (`transports/propagation.py`, HTTP headers or gRPC
  metadata) and is read back by the executors from the SDK's call context
  (`served_turn`), per request, so a role server's turn is a child of the
  caller's turn whatever task runs it.
- Off unless the standard variables ask for an exporter (`wanted`): then no
  SDK tracer provider exists and every span here is the OpenTelemetry API's
  no-op (bench/tracing_cost.py measures it). `opentelemetry` itself is
  imported at the first span, never by `--help`, `status` or
  `import a2a_orchestrator`.
- `exporting(service)` (the CLI, around a command) installs the SDK's
  provider with a batch processor and the OTLP/HTTP exporter, configured by
  the OTEL_* variables as the SDK reads them, and flushes it when the
  command returns: a server stopped by SIGTERM exports its last spans.
  An export gives up after `EXPORT_TIMEOUT` seconds unless
  OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT says otherwise (the SDK's 10 s, with
  its retries, made a dead collector cost a 1.4 s run 8 s more), and a
  collector that cannot be reached is said once, in one line (`-v`: each
  failure as the SDK logs it).
- a2a-sdk's own spans (queues, dispatchers: about a hundred a delegation)
  are left out unless OTEL_INSTRUMENTATION_A2A_SDK_ENABLED=true; they would
  bury ours, and leaving them out keeps their children's parents intact
  (the API's no-op tracer hands the current span through). Unless it is
  set, the CLI also keeps a2a-sdk from making them (`quiet_sdk_spans`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .._version import __version__
from ..errors import ConfigError
from ..models.base import ChatMessage, Model, ModelItem, ToolSpec, Usage
from ..runtime.events import ChildEvent, Failed, InputRequired

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "CONVERSATION_SPANS",
    "ChildSpans",
    "Traced",
    "carrier_of",
    "exporting",
    "model_call",
    "served_turn",
    "session_span",
    "tool_call",
    "use_provider",
    "wanted",
]

SCOPE = "a2a_orchestrator"
SDK_SCOPE = "a2a-python-sdk"
"""The instrumentation scope a2a-sdk's own spans come from."""
SDK_SPANS = "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"
EXPORT_TIMEOUT = 2.0
"""Seconds an OTLP export may take, retries included, unless the OTEL_*
variables say: spans are worth a little, never the run's time."""
_EXPORT_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk._shared_internal",
)
"""Where the SDK says an export failed (the exporters, the batch processor)."""

_tracer: Tracer | None = None
_provider: TracerProvider | None = None
"""The provider `exporting` installed (once a process: the API allows one)."""


def _get_tracer() -> Tracer:
    global _tracer
    if _tracer is None:
        from opentelemetry import trace

        # The API's proxy: a no-op until a provider is installed, then that one's.
        _tracer = trace.get_tracer(SCOPE, __version__)
    return _tracer


def use_provider(provider: Any | None) -> None:
    """Make this package's spans with `provider` (None: the global one again).

    For a host that keeps a provider of its own apart from the global one,
    and for the interleaved off/on rounds of bench/tracing_cost.py."""
    global _tracer
    _tracer = provider.get_tracer(SCOPE, __version__) if provider is not None else None


# -- exporting -------------------------------------------------------------------------


def wanted(environ: Mapping[str, str] | None = None) -> list[str]:
    """The span exporters the OTEL_* variables ask for; [] means tracing is off.

    OTEL_TRACES_EXPORTER names them (`otlp`, `console`, or `none`); unset, an
    OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or ..._TRACES_ENDPOINT) asks
    for `otlp`. OTEL_SDK_DISABLED=true turns it all off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    named = [n for n in named if n]
    if named:
        return [] if "none" in named else named
    endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    return ["otlp"] if any(env.get(name, "").strip() for name in endpoints) else []


def quiet_sdk_spans(environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn a2a-sdk's own spans off for this process unless
    OTEL_INSTRUMENTATION_A2A_SDK_ENABLED is set; True when it did.

    Exported or not, they are left out unless that variable says `true`
    (see the module docstring), but a2a-sdk still makes them: it wraps
    about a hundred of its calls per delegation, each a lookup in
    `os.environ` and a span, about a tenth of a role server's CPU in a
    fan-out (bench/fanout.py). a2a-sdk reads the switch when it is
    imported, so the CLI calls this first thing; once a2a-sdk is loaded it
    does nothing (a host process that imported it keeps its own choice)."""
    env = os.environ if environ is None else environ
    if SDK_SPANS in env or "a2a.utils.telemetry" in sys.modules:
        return False
    env[SDK_SPANS] = "false"
    return True


def _exporter(name: str, environ: Mapping[str, str]) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER={name!r}: use otlp, console or none")
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    timeout = _export_timeout(environ)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(timeout=timeout)
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcSpanExporter,
            )
        except ImportError:
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs opentelemetry-exporter-otlp-proto-grpc "
                "installed; or use http/protobuf (the collector's port 4318)"
            ) from None
        return GrpcSpanExporter(timeout=timeout)
    raise ConfigError(f"OTLP protocol {protocol!r}: use http/protobuf or grpc")


def _export_timeout(environ: Mapping[str, str]) -> float | None:
    """`EXPORT_TIMEOUT`, or None where the operator's variable sets one (the SDK reads it)."""
    names = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    return None if any(environ.get(name, "").strip() for name in names) else EXPORT_TIMEOUT


class _SaidOnce(logging.Filter):
    """Export failures as one warning line for the process, naming the
    endpoint, instead of the SDK's line per retry with urllib3's whole error."""

    def __init__(self, endpoint: str) -> None:
        super().__init__()
        self.endpoint = endpoint
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if self.said:
            return False
        self.said = True
        record.name = __name__  # this module, as if it had said it
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg, record.args, record.exc_info = (
            "spans cannot be exported to %s; they are dropped (said once; -v shows each failure)",
            (self.endpoint,),
            None,
        )
        return True


def _say_export_failures_once(environ: Mapping[str, str]) -> None:
    if logging.getLogger().isEnabledFor(logging.INFO):
        return  # -v: every failure, as the SDK says it
    endpoint = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "the OTLP endpoint"
    ).strip()
    once = _SaidOnce(endpoint)
    for name in _EXPORT_LOGGERS:
        logging.getLogger(name).addFilter(once)


def _provider_class() -> type[TracerProvider]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NoOpTracer

    class Provider(TracerProvider):
        """The SDK's provider, with a2a-sdk's own spans left out unless asked for."""

        def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> Any:
            asked = os.environ.get(SDK_SPANS, "").strip().lower() == "true"
            if instrumenting_module_name == SDK_SCOPE and not asked:
                return NoOpTracer()
            return super().get_tracer(instrumenting_module_name, *args, **kwargs)

    return Provider


def _install(service: str, environ: Mapping[str, str], exporters: Sequence[str]) -> TracerProvider:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes: dict[str, str] = {"service.version": __version__}
    # The operator's name wins: OTEL_SERVICE_NAME, or service.name in
    # OTEL_RESOURCE_ATTRIBUTES (attributes given here would override both).
    named = environ.get("OTEL_SERVICE_NAME") or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    if not named:
        attributes["service.name"] = service
    provider = _provider_class()(resource=Resource.create(attributes))
    if "otlp" in exporters:
        _say_export_failures_once(environ)
    for name in exporters:
        # Batched: a span's end costs the traced code a queue append, and
        # OTEL_BSP_SCHEDULE_DELAY (and the other OTEL_BSP_*) tune the batches.
        provider.add_span_processor(BatchSpanProcessor(_exporter(name, environ)))
    trace.set_tracer_provider(provider)
    return provider


@contextlib.contextmanager
def exporting(service: str, environ: Mapping[str, str] | None = None) -> Iterator[None]:
    """Export this process's spans while the block runs, when the OTEL_*
    variables ask for it (`wanted`); flush them when it ends. `service` is
    the service.name unless the variables name one. Without the variables
    this imports nothing and installs nothing."""
    global _provider
    env = os.environ if environ is None else environ
    exporters = wanted(env)
    if not exporters:
        yield
        return
    if _provider is None:
        _provider = _install(service, env, exporters)
    try:
        yield
    finally:
        # Flushed, not shut down: a later command in the same process (the
        # tests call `main` more than once) still exports; the SDK shuts the
        # provider down at exit.
        _provider.force_flush()


# -- spans -----------------------------------------------------------------------------


class Traced:
    """A span the code it covers reports its outcome to."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def ended(self, event: ChildEvent) -> ChildEvent:
        """Record how a turn ended (its terminal event); returns `event`."""
        _outcome(self.span, event)
        return event

    def succeeded(self, success: bool) -> None:
        """Record whether a tool call succeeded (a failure is an error status)."""
        self.span.set_attribute("a2a.tool.success", success)
        if not success:
            from opentelemetry.trace import StatusCode

            self.span.set_status(StatusCode.ERROR, "the tool call failed")


def _outcome(span: Span, event: ChildEvent | None) -> None:
    if event is None:
        return
    span.set_attribute("a2a.outcome", event.kind)
    if isinstance(event, Failed):
        from opentelemetry.trace import StatusCode

        span.set_attribute("a2a.failure.reason", event.reason)
        span.set_status(StatusCode.ERROR, f"{event.reason}: {event.message}"[:500])
    elif isinstance(event, InputRequired):
        span.set_attribute("a2a.question", event.question[:500])


@contextlib.contextmanager
def session_span(session_id: str, title: str) -> Iterator[Context]:
    """The session's span, current while the block runs (its owner's model
    and tool calls, and the children it spawns, are under it); yields the
    context it is current in."""
    from opentelemetry import context

    attributes = {"a2a.session.id": session_id, "a2a.session.title": title[:200]}
    with _get_tracer().start_as_current_span("session", attributes=attributes):
        yield context.get_current()


class Child(Protocol):
    """What a child's spans read of it: a delegation `ChildHandle`, named
    here by shape so tracing does not import the delegation layer."""

    @property
    def child_id(self) -> str: ...

    @property
    def agent(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def transport(self) -> str: ...

    @property
    def depth(self) -> int: ...

    @property
    def status(self) -> str: ...

    @property
    def last_terminal(self) -> ChildEvent | None: ...


class ChildSpans:
    """A child's spans on its parent's side: `child` from spawn (or a new
    input after it settled) until it settles, and a `turn` per turn.

    The `child` span's parent is the span current where the child is
    spawned (a parent's tool call, the orchestrator's served turn) or, when
    none is, `fallback` (its session's context)."""

    def __init__(self, handle: Child, fallback: Context | None = None) -> None:
        from opentelemetry import context, trace

        current = context.get_current()
        in_span = trace.get_current_span(current).get_span_context().is_valid
        self._parent = current if in_span or fallback is None else fallback
        self._handle = handle
        self._span: Span | None = None
        self._open()

    def _open(self) -> Span:
        handle = self._handle
        attributes: dict[str, str | int] = {
            "a2a.child.id": handle.child_id,
            "a2a.agent": handle.agent,
            "a2a.role": handle.role,
            "a2a.transport": handle.transport,
            "a2a.depth": handle.depth,
        }
        span = _get_tracer().start_span("child", context=self._parent, attributes=attributes)
        self._span = span
        return span

    @contextlib.contextmanager
    def turn(self, number: int) -> Iterator[None]:
        """The span of the child's turn `number`, current while it runs (a
        remote call sends it as the role server's parent)."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind

        child = self._span or self._open()
        kind = SpanKind.CLIENT if self._handle.transport == "remote" else SpanKind.INTERNAL
        with _get_tracer().start_as_current_span(
            "turn",
            context=trace.set_span_in_context(child),
            kind=kind,
            attributes={"a2a.child.id": self._handle.child_id, "a2a.turn": number},
        ) as span:
            yield
            _outcome(span, self._handle.last_terminal)

    def settled(self) -> None:
        """The child settled: its `child` span ends, with its status."""
        span, self._span = self._span, None
        if span is not None:
            span.set_attribute("a2a.child.status", self._handle.status)
            _outcome(span, self._handle.last_terminal)
            span.end()

    def close(self) -> None:
        """The parent lets the child go (its session closes): an open
        `child` span ends with the status the child had then."""
        span, self._span = self._span, None
        if span is not None:
            span.set_attribute("a2a.child.status", self._handle.status)
            span.end()


def carrier_of(call_context: Any) -> dict[str, str]:
    """The headers (HTTP) or metadata (gRPC) of an a2a-sdk server call, as
    a carrier the propagator reads trace context from."""
    if call_context is None:
        return {}
    state = call_context.state
    headers = state.get("headers")
    if headers:
        return dict(headers)
    grpc_context = state.get("grpc_context")
    if grpc_context is None:
        return {}
    carrier: dict[str, str] = {}
    for key, value in grpc_context.invocation_metadata() or ():
        if isinstance(value, str):
            carrier[key.lower()] = value
    return carrier


@contextlib.contextmanager
def served_turn(call_context: Any, *, role: str, task_id: str, context_id: str) -> Iterator[Traced]:
    """A turn this server plays for a caller: a SERVER span whose parent is
    the caller's span, read from the call's trace context; current while
    the block runs."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    parent = propagate.extract(carrier_of(call_context))
    attributes = {"a2a.role": role, "a2a.task.id": task_id, "a2a.context.id": context_id}
    with _get_tracer().start_as_current_span(
        "turn", context=parent, kind=SpanKind.SERVER, attributes=attributes
    ) as span:
        yield Traced(span)


async def model_call(
    model: Model, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
) -> AsyncIterator[ModelItem]:
    """`model.stream(messages, tools)` inside a `chat MODEL` span that counts
    the tokens it reports. The span is never current (nothing nests in a
    model call), so no context change leaks into the caller between items."""
    from opentelemetry.trace import SpanKind, StatusCode

    name = model.name
    span = _get_tracer().start_span(
        f"chat {name}",
        kind=SpanKind.CLIENT,
        attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": name},
    )
    used = Usage()
    try:
        async for item in model.stream(messages, tools):
            if isinstance(item, Usage):
                used = used + item
            yield item
    except GeneratorExit:
        raise  # the caller stopped reading: not the model's failure
    except BaseException as exc:
        span.record_exception(exc)
        span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500])
        raise
    finally:
        span.set_attribute("gen_ai.usage.input_tokens", used.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", used.output_tokens)
        span.end()


@contextlib.contextmanager
def tool_call(tool: str) -> Iterator[Traced]:
    """An `execute_tool TOOL` span, current while the tool runs (a child it
    spawns is under it)."""
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
    with _get_tracer().start_as_current_span(f"execute_tool {tool}", attributes=attributes) as span:
        yield Traced(span)


class _ConversationSpans:
    """The `runtime.spans.Spans` a conversation is given: `model_call` and
    `tool_call` above."""

    def model_call(
        self, model: Model, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]
    ) -> AsyncIterator[ModelItem]:
        return model_call(model, messages, tools)

    def tool_call(self, tool: str) -> contextlib.AbstractContextManager[Traced]:
        return tool_call(tool)


CONVERSATION_SPANS = _ConversationSpans()
"""The spans every conversation this package builds opens (given by its builder)."""
